#!/usr/bin/env bash
# Record #89's pair on one GPU in one sitting: ours' run (dev/bench_quality.py --runs ours_record89)
# at once, the script's (--runs ref_record89) S seconds later, then the pair's report, which reads
# both finished logs: OUTDIR/quality.md and OUTDIR/quality.png. The script's compilation and warm-up
# (mostly on the CPU) then overlap ours' run, so that each side's steps run alone on the GPU: on an
# H200 with a delay of 200 s, ours took 11 minutes, the script's compilation and warm-up 10.5 beside
# it (6.5 in earlier pairs) and its first step came 3.4 minutes after ours' end. The default delay,
# 60 s, is that pair's start brought forward: about 25 minutes for the pair, where one run after the
# other takes 29. The losses do not depend on the overlap (ours is deterministic, the script's
# losses do not read its clock); a step time is a stage's median, which a few steps beside the
# script's warm-up do not move.
# Each bench's output goes to OUTDIR/ours_bench.log and OUTDIR/ref_bench.log. Every flag after
# OUTDIR and --delay is dev/bench_quality.py's, given to the three benches alike (--runs is this
# script's); the first bench is a --dry_run of the pair, so that a wrong flag or file stops it
# before anything runs.
# usage: scripts/record89_pair.sh OUTDIR [--delay S] --reference89 DIR --tokenizer VOCAB.bin
#                                 --train 'GLOB' --val 'GLOB' [dev/bench_quality.py flags]
#   e.g. scripts/record89_pair.sh out/pair --reference89 ref89 --tokenizer gpt2_tokenizer.bin \
#          --train 'corpus/mix_train_*.bin' --val 'corpus/mix_val_*.bin'   (needs a GPU)
#   PYTHON: the python that runs the benches (default python3)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/help.sh "$@"
fail() {
  echo "error: $*" >&2
  exit 1
}
[ $# -ge 1 ] && [ "${1:0:1}" != - ] ||
  fail "usage: scripts/record89_pair.sh OUTDIR [--delay S] --reference89 DIR --tokenizer VOCAB.bin --train 'GLOB' --val 'GLOB' [dev/bench_quality.py flags]"
out=$1
shift
delay=60
if [ "${1:-}" = --delay ]; then
  [[ "${2:-}" =~ ^[0-9]+$ ]] || fail "--delay '${2:-}': give the seconds between the two runs' starts, a whole number"
  delay=$2
  shift 2
fi
for flag in "$@"; do
  [[ "$flag" != --runs && "$flag" != --runs=* ]] ||
    fail "--runs: this script runs ours_record89 and ref_record89; for other runs use dev/bench_quality.py"
done
bench=("${PYTHON:-python3}" dev/bench_quality.py "$out")
"${bench[@]}" --runs ours_record89,ref_record89 --dry_run "$@" > /dev/null || exit 1
mkdir -p "$out" || exit 1

# Job control gives each bench a process group of its own. Interrupted (Ctrl-C, SIGTERM), the
# script sends SIGTERM to each group, and a bench stops its run as at a Ctrl-C: SIGTERM, as SIGINT
# may be ignored in a script started in the background.
set -m
ours= ref= sleeper=
stop_benches() {
  local benches=($ours $ref)
  kill -TERM -- "${benches[@]/#/-}" 2>/dev/null
  kill $sleeper 2>/dev/null
  wait
  exit 130
}
trap stop_benches INT TERM
"${bench[@]}" --runs ours_record89 "$@" > "$out/ours_bench.log" 2>&1 &
ours=$!
sleep "$delay" &
sleeper=$!
wait "$sleeper"
if ! kill -0 "$ours" 2>/dev/null; then  # ours' bench already ended: the script's starts only after a success
  wait "$ours" || fail "ours' bench (--runs ours_record89) failed: see $out/ours_bench.log"
fi
"${bench[@]}" --runs ref_record89 "$@" > "$out/ref_bench.log" 2>&1 &
ref=$!
wait "$ours"
ours_status=$?
wait "$ref"
ref_status=$?
trap - INT TERM
[ $ours_status -eq 0 ] || fail "ours' bench (--runs ours_record89) failed: see $out/ours_bench.log"
[ $ref_status -eq 0 ] || fail "the script's bench (--runs ref_record89) failed: see $out/ref_bench.log"
"${bench[@]}" --runs ours_record89,ref_record89 "$@"
