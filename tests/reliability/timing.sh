# Sourced by the reliability scripts: a job's end is timed from the fault it reacts to (the first
# stderr line that reports it), not from its launch, which a loaded machine slows down.

# stamp: copies stdin to stdout, each line prefixed with the time it arrived (seconds since the
# epoch).
stamp() {
  python3 -u -c 'import sys, time
for line in iter(sys.stdin.readline, ""):
    sys.stdout.write(f"{time.time():.3f} {line}")'
}

# seconds_after FILE PATTERN END: END (seconds since the epoch) less the stamp of FILE's first
# line that matches PATTERN (grep -E), to 0.1 s; fails when no line matches.
seconds_after() {
  local file=$1 pattern=$2 end=$3 line
  line=$(grep -m1 -E -- "$pattern" "$file") || { echo "no line matches '$pattern' in $file"; return 1; }
  python3 -c "print(f'{$end - ${line%% *}:.1f}')"
}
