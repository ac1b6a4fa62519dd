#!/usr/bin/env bash
# Hugging Face import and export, timed against the disk (after scripts/setup.sh; the program
# build/hf_io_bench is built with the examples). In one call:
#   1. a random Llama-style checkpoint in the Hub's layout (scripts/bench/hf_make_checkpoint.py:
#      by default 16 layers, hidden 2048, 32 heads, 8 key/value heads, SwiGLU 8192, vocab 50304,
#      untied: 1.18 B parameters, BF16, files of at most 5 GB with the index);
#   2. dd of the same bytes: reading the checkpoint's files, and writing the exports' bytes
#      (conv=fdatasync);
#   3. the import (train::load_hf_weights, what --init-from-hf runs) at 1 rank and at tp TP, and
#      the export (train::export_hf, what --export-hf runs) at f32 and bf16 from 1 rank, each
#      REPEATS times (medians reported), with each rank's memory (/proc/self/status);
# and prints a markdown table (also to $OUT/hf_io_bench.md when OUT is set). When the page cache
# can be dropped (root), every dd read and every import starts cold; otherwise both read from the
# page cache and the table says so. The multi-GB files are removed at the end (--keep keeps them).
#
#   scripts/bench/hf_io_bench.sh [--device cpu|cuda] [--layers N] [--tp N] [--repeats N]
#                                [--max-shard-bytes B] [--dir DIR] [--keep]
# (--max-shard-bytes: the checkpoint's largest file, 5 GB by default as on the Hub, where a 1 B
# model is one file; smaller makes several files and the index.)
set -euo pipefail
cd "$(dirname "$0")/../.."
device=cpu layers=16 tp=2 repeats=3 dir=${HF_BENCH_DIR:-build/hf_bench} keep=0
shard=5000000000
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --tp) tp=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --max-shard-bytes) shard=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "hf_io_bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  OMPI_MCA_rmaps_base_oversubscribe=1
bench=build/hf_io_bench
[ -x "$bench" ] || { echo "hf_io_bench.sh: $bench missing (cmake --build build --target hf_io_bench)" >&2; exit 2; }
py=python3
$py -c "import numpy" 2>/dev/null || py=/usr/bin/python3
mkdir -p "$dir"
ckpt=$dir/ckpt export=$dir/export log=$dir/log
rm -rf "$ckpt" "$export" "$log"
mkdir -p "$export" "$log"
cleanup() { [ "$keep" = 1 ] || rm -rf "$ckpt" "$export" "$dir/dd.bin"; }
trap cleanup EXIT
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

# Each phase says when it is done (seconds since the start), so a run cut short shows how far it got.
start=$(date +%s.%N)
phase() { echo "hf_io_bench: $1 done at $(awk -v a="$(date +%s.%N)" -v b="$start" 'BEGIN {printf "%.1f", a - b}') s"; }

$py scripts/bench/hf_make_checkpoint.py "$ckpt" --layers "$layers" --max-shard-bytes "$shard" >"$log/make.txt"
sync
phase "the checkpoint ($(cut -d' ' -f2 "$log/make.txt") parameters)"

# Dropping the page cache needs root; without it every read below comes from the page cache.
if sync && echo 1 2>/dev/null >/proc/sys/vm/drop_caches; then
  cold=1
else
  cold=0
fi
export QUINTET_HF_BENCH_DROP_CACHES=$cold
drop() { [ "$cold" = 0 ] || { sync; echo 1 >/proc/sys/vm/drop_caches; }; }
now() { date +%s.%N; }

# dd: reading the checkpoint's files, writing N bytes with fdatasync.
for r in $(seq "$repeats"); do
  drop
  t0=$(now)
  for f in "$ckpt"/*.safetensors; do dd if="$f" of=/dev/null bs=64M status=none; done
  awk -v a="$(now)" -v b="$t0" 'BEGIN {print a - b}' >>"$log/dd_read.txt"
done
dd_write() {  # bytes, file for the seconds
  for r in $(seq "$repeats"); do
    t0=$(now)
    head -c "$1" /dev/zero | dd of="$dir/dd.bin" bs=64M iflag=fullblock conv=fdatasync status=none
    awk -v a="$(now)" -v b="$t0" 'BEGIN {print a - b}' >>"$2"
    rm -f "$dir/dd.bin"
  done
}

phase "dd's reads"
flags="--init-from-hf $ckpt --device $device --seq-len 128 --micro-batch 1 --global-batch 1"
mpirun -np 1 "$bench" "$repeats" "$export" $flags >"$log/rank1.txt"
phase "the import and exports at 1 rank"
if [ "$tp" -gt 1 ]; then
  mpirun -np "$tp" "$bench" "$repeats" - $flags --tp "$tp" >"$log/tp.txt"
  phase "the import at tp $tp"
else  # tp 1 is the 1-rank run: not run twice
  cp "$log/rank1.txt" "$log/tp.txt"
fi
dd_write "$(awk '$1 == "export_f32_bytes" {print $2}' "$log/rank1.txt")" "$log/dd_write_f32.txt"
dd_write "$(awk '$1 == "export_bf16_bytes" {print $2}' "$log/rank1.txt")" "$log/dd_write_bf16.txt"
phase "dd's writes"
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

$py - "$log" "$cold" "$device" "$layers" "$tp" "$repeats" "$load_start" "$load_end" <<'EOF' |
import statistics, sys
log, cold, device, layers, tp, repeats, load_start, load_end = sys.argv[1:]

def parse(path):
    times, ranks = {}, {}
    for line in open(path):
        f = line.split()
        if f[0] == "rank":
            ranks.setdefault(int(f[1]), {})[f[2]] = int(f[3])
        else:
            times[f[0]] = [float(x) for x in f[1:]]
    return times, ranks

def seconds(path):
    return statistics.median(float(x) for x in open(path))

one, one_mem = parse(log + "/rank1.txt")
tpr, tp_mem = parse(log + "/tp.txt")
params = open(log + "/make.txt").read().split()[1]
ckpt = int(one["checkpoint_bytes"][0])
med = lambda v: statistics.median(v)
gb = lambda b, s: "%.2f" % (b / s / 1e9)
src = "disk (page cache dropped before each)" if cold == "1" else "page cache (not root: cannot drop it), dd too"
files = open(log + "/make.txt").read().split()[5]
print("### Hugging Face import/export: %s parameters (%s layers), device %s" % (
    format(int(params), ","), layers, device))
print()
print("Checkpoint %.2f GB BF16 in %s file(s); reads from %s; median of %s; load average %s at the start, "
      "%s at the end." % (ckpt / 1e9, files, src, repeats, load_start, load_end))
print()
print("| phase | bytes | seconds | GB/s | dd, same bytes: s | dd GB/s |")
print("|---|---:|---:|---:|---:|---:|")
rd = seconds(log + "/dd_read.txt")
for name, t in (("import BF16 -> f32, 1 rank", one), ("import BF16 -> f32, tp %s" % tp, tpr)):
    s = med(t["import_s"])
    print("| %s | %.2f GB | %.2f | %s | %.2f | %s |" % (name, ckpt / 1e9, s, gb(ckpt, s), rd,
                                                         gb(ckpt, rd)))
for dt in ("f32", "bf16"):
    b = int(one["export_%s_bytes" % dt][0])
    s = med([a + f for a, f in zip(one["export_%s_s" % dt], one["flush_%s_s" % dt])])
    w = seconds(log + "/dd_write_%s.txt" % dt)
    print("| export %s, 1 rank (incl. fdatasync %.2f s) | %.2f GB | %.2f | %s | %.2f | %s |" % (
        dt, med(one["flush_%s_s" % dt]), b / 1e9, s, gb(b, s), w, gb(b, w)))
print()
print("Memory per rank during import (GB; model: the rank's parameters in f32; share: their "
      "bytes in the BF16 checkpoint; anon +: the import's peak anonymous memory above what the "
      "built model held; mapped: the checkpoint's pages mapped at the peak, page cache, not a "
      "copy; HWM: the run's peak RSS):")
print()
print("| run | rank | model f32 | share BF16 | RSS before import | anon + during import | "
      "mapped (peak) | HWM |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
G = lambda b: "%.2f" % (b / 1e9)
for run, mem in (("1 rank", one_mem), ("tp %s" % tp, tp_mem)):
    for r, m in sorted(mem.items()):
        print("| %s | %d | %s | %s | %s | %s | %s | %s |" % (
            run, r, G(m["model_bytes"]), G(m["share_bytes"]), G(m["rss_before"]),
            G(m["anon_peak"] - m["anon_before"]), G(m["file_peak"] - m["file_before"]),
            G(m["hwm"])))
EOF
  tee "$log/table.md"
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT" && cp "$log/table.md" "$OUT/hf_io_bench.md"; fi
