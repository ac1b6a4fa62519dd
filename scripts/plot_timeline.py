#!/usr/bin/env python3
"""Draws one step of a merged trace (scripts/merge_traces.py) as a PNG: a row per rank (its
compute lane, then one lane per communicator), time across, ranges coloured by kind (compute,
each kind of communication, waits on it hatched darker, loader, host-to-device copies;
consecutive compute ranges in alternating shades, the optimizer step dark). Pure
Python (zlib only): no plotting library is needed.

  python3 scripts/plot_timeline.py DIR/trace_merged.json -o timeline.png [--step N]
"""
import argparse
import json
import struct
import sys
import zlib

COLORS = {
    "compute": (90, 140, 220), "dp": (230, 120, 40), "tp": (60, 170, 90), "pp": (170, 90, 200),
    "ep": (220, 60, 60), "cp": (40, 170, 190), "zero": (200, 170, 40), "loader": (130, 130, 130),
    "h2d": (150, 110, 70), "other": (100, 100, 100), "step": (225, 225, 225),
}
# A 3x5 pixel font: 5 rows of 3 columns per glyph.
FONT = {
    "a": "010101111101101", "b": "110101110101110", "c": "011100100100011", "d": "110101101101110",
    "e": "111100110100111", "f": "111100110100100", "g": "011100101101011", "h": "101101111101101",
    "i": "111010010010111", "j": "001001001101010", "k": "101101110101101", "l": "100100100100111",
    "m": "101111111101101", "n": "110101101101101", "o": "010101101101010", "p": "110101110100100",
    "q": "010101101110011", "r": "110101110101101", "s": "011100010001110", "t": "111010010010010",
    "u": "101101101101111", "v": "101101101101010", "w": "101101111111101", "x": "101101010101101",
    "y": "101101010010010", "z": "111001010100111", "0": "111101101101111", "1": "010110010010111",
    "2": "110001010100111", "3": "110001010001110", "4": "101101111001001", "5": "111100110001110",
    "6": "011100111101111", "7": "111001010010010", "8": "111101111101111", "9": "111101111001110",
    " ": "000000000000000", ".": "000000000000010", ":": "000010000010000", "-": "000000111000000",
    "/": "001001010100100", "(": "010100100100010", ")": "010001001001010", "%": "101001010100101",
    "+": "000010111010000", "=": "000111000111000",
}


class Canvas:
    def __init__(self, w, h):
        self.w, self.h = w, h
        self.px = bytearray(b"\xff" * (w * h * 3))

    def rect(self, x0, y0, x1, y1, color, hatch=False):
        x0, x1 = max(0, int(x0)), min(self.w, int(max(x1, x0 + 1)))
        y0, y1 = max(0, int(y0)), min(self.h, int(y1))
        for y in range(y0, y1):
            row = y * self.w * 3
            for x in range(x0, x1):
                c = color
                if hatch and (x + y) % 4 < 2:
                    c = tuple(v * 3 // 5 for v in color)
                self.px[row + 3 * x:row + 3 * x + 3] = bytes(c)

    def text(self, x, y, s, scale=2, color=(0, 0, 0)):
        for ch in s.lower():
            g = FONT.get(ch, FONT[" "])
            for r in range(5):
                for c in range(3):
                    if g[r * 3 + c] == "1":
                        self.rect(x + c * scale, y + r * scale, x + (c + 1) * scale,
                                  y + (r + 1) * scale, color)
            x += 4 * scale

    def png(self, path):
        raw = b"".join(b"\x00" + bytes(self.px[y * self.w * 3:(y + 1) * self.w * 3])
                       for y in range(self.h))

        def chunk(kind, data):
            c = struct.pack(">I", len(data)) + kind + data
            return c + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

        with open(path, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n")
            f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)))
            f.write(chunk(b"IDAT", zlib.compress(raw, 6)))
            f.write(chunk(b"IEND", b""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="merged trace (scripts/merge_traces.py)")
    ap.add_argument("-o", "--output", required=True, help="PNG to write")
    ap.add_argument("--step", type=int, help="the step to draw (default: the first traced)")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    with open(args.trace) as f:
        trace = json.load(f)
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    steps = sorted({e["args"]["step"] for e in events if e.get("cat") == "step"})
    if not steps:
        sys.exit("plot_timeline: the trace holds no step")
    step = args.step if args.step is not None else steps[0]
    spans = [e for e in events if e.get("cat") == "step" and e["args"]["step"] == step]
    if not spans:
        sys.exit(f"plot_timeline: step {step} is not in the trace (it has {steps})")
    t0 = min(e["ts"] for e in spans)
    t1 = max(e["ts"] + e["dur"] for e in spans)
    mine = [e for e in events if e["args"].get("step") == step and e.get("cat") != "step"]
    # Waits last, so that they are drawn over the compute range they stall.
    mine.sort(key=lambda e: (e["cat"].endswith(" wait"), e["ts"]))
    ranks = sorted({e["pid"] for e in spans})
    # Lanes per rank: compute (with the waits), loader, then each communicator.
    lanes = {}
    for r in ranks:
        comm = sorted({e["args"]["group"] for e in mine
                       if e["pid"] == r and e["tid"] >= 10})
        lanes[r] = ["compute", "loader"] + comm
    lane_h, gap, left, top = 14, 10, 110, 40
    height = top + sum(len(v) * lane_h + gap for v in lanes.values()) + 60
    c = Canvas(args.width, height)
    span = max(t1 - t0, 1e-9)
    scale = (args.width - left - 20) / span
    title = args.title or f"step {step}: {span / 1e3:.1f} ms"
    c.text(left, 10, title, scale=3)
    y = top
    shade = {}
    for r in ranks:
        c.rect(left, y - 2, args.width - 20, y + len(lanes[r]) * lane_h, COLORS["step"])
        for i, lane in enumerate(lanes[r]):
            c.text(8, y + i * lane_h + 2, f"r{r} {lane}" if i == 0 else lane, scale=2)
        for e in mine:
            if e["pid"] != r:
                continue
            cat = e["cat"]
            wait = cat.endswith(" wait")
            kind = cat[:-5] if wait else cat
            if e["tid"] >= 10:
                lane = lanes[r].index(e["args"]["group"])
            elif kind in ("loader", "h2d"):
                lane = 1
            else:
                lane = 0
            x0 = left + (e["ts"] - t0) * scale
            x1 = left + (e["ts"] + e["dur"] - t0) * scale
            yy = y + lane * lane_h
            inset = 4 if wait else 1  # waits drawn inside the compute range they stall
            color = COLORS.get(kind, COLORS["other"])
            if kind == "compute":  # adjacent ranges (block after block) in alternating shades
                shade[r] = not shade.get(r, False)
                if shade[r]:
                    color = tuple(min(255, v + 45) for v in color)
                if e["name"].startswith("optimizer"):
                    color = (40, 60, 140)
            c.rect(x0, yy + inset, x1, yy + lane_h - inset, color, hatch=wait)
        y += len(lanes[r]) * lane_h + gap
    # Legend and time axis.
    x = left
    for kind in ("compute", "dp", "tp", "pp", "ep", "cp", "zero", "loader", "h2d"):
        c.rect(x, y + 6, x + 14, y + 18, COLORS[kind])
        c.text(x + 18, y + 8, kind, scale=2)
        x += 18 + 8 * (len(kind) + 1) + 10
    c.rect(x, y + 6, x + 14, y + 18, COLORS["dp"], hatch=True)
    c.text(x + 18, y + 8, "wait (hatched)", scale=2)
    c.text(left, y + 30, f"0 ms", scale=2)
    end = f"{span / 1e3:.2f} ms"
    c.text(args.width - 20 - 8 * len(end), y + 30, end, scale=2)
    c.png(args.output)
    print(f"plot_timeline: step {step}, {len(ranks)} ranks, {len(mine)} ranges -> {args.output}")


if __name__ == "__main__":
    main()
