#!/usr/bin/env bash
# Tests dev/plot_log.py: two synthetic runs, one in our log format (llmc/logger.h) and one in
# llm.c's (as train_gpt2.py writes it), plotted together; checks the PNG, the val-loss table
# (exact text), the panels drawn (train and val loss in one, one colour per run; none without
# data in any run), default labels, and the error for each kind of malformed log or argument.
# Scratch files go to build/test_tmp/plot_log.
#
#   bash dev/test/test_plot_log.sh     (PLOT_PYTHON=... to pick the python with matplotlib)
set -uo pipefail
cd "$(dirname "$0")/../.."
DIR=build/test_tmp/plot_log
rm -rf "$DIR"
mkdir -p "$DIR/ours" "$DIR/bad" "$DIR/empty_dir"

source "$(dirname "$0")/lib.sh"

# Its own variable: a python with torch often lacks matplotlib.
require_python matplotlib test_plot_log PLOT_PYTHON
echo "using $PY"

# Ours: val at 0, 2, 4; a blank line and a kind the plotter does not know, both skipped.
cat > "$DIR/ours/main.log" <<'EOF'
step=0 kind=val loss=10.900000
step=1 kind=train loss=10.950000 norm=5.1000 lr=6.0000e-05 ms=120.00 tok_per_s=8000
step=2 kind=train loss=10.500000 norm=4.2000 lr=1.2000e-04 ms=110.00 tok_per_s=8500

step=2 kind=val loss=10.400000
step=3 kind=train loss=9.800000 norm=3.3000 lr=1.8000e-04 ms=100.00 tok_per_s=9000
step=3 kind=note text=skipped
step=4 kind=train loss=9.100000 norm=nan lr=2.4000e-04 ms=100.00 tok_per_s=9000
step=4 kind=val loss=9.000000
step=4 kind=eval hellaswag=0.250000
EOF
# llm.c's: val at 0, 2, 3, 4 (3 is not common); the last line has no newline and is left out.
{
  printf '%s\n' 's:0 tel:10.901090' 's:1 trl:10.950000' 's:2 trl:10.500000' 's:2 tel:10.399480' \
    's:3 trl:9.800000' 's:3 tel:9.500000' 's:4 trl:9.100000 lr:0.000240 norm:2.90' \
    's:4 tel:9.009000'
  printf 's:5 tel:1.0'
} > "$DIR/torch.log"

out=$("$PY" dev/plot_log.py "$DIR/ours" "$DIR/torch.log" -o "$DIR/plot.png" --labels ours,torch \
  2>"$DIR/stderr")
status=$?
check "two runs: exit status" "$status" "0"
expected="val loss at the 3 steps common to all runs; relative difference = (run - ours) / ours
| step | ours | torch | torch vs ours |
|---:|---:|---:|---:|
| 0 | 10.900000 | 10.901090 | +1.000e-04 |
| 2 | 10.400000 | 10.399480 | -5.000e-05 |
| 4 | 9.000000 | 9.009000 | +1.000e-03 |
max |relative difference| torch vs ours: 1.000e-03
wrote $DIR/plot.png: loss, learning rate, grad norm, tokens/s, HellaSwag acc_norm"
check "two runs: the val loss table" "$out" "$expected"
check "two runs: nothing on stderr" "$(cat "$DIR/stderr")" ""
size=$(stat -c %s "$DIR/plot.png" 2>/dev/null || echo 0)
check "the PNG is non-empty (over 10 kB: $size bytes)" "$([ "$size" -gt 10000 ] && echo yes)" "yes"
check "the file is a PNG" "$(head -c 8 "$DIR/plot.png" | od -An -c | tr -s ' ')" \
  " 211 P N G \r \n 032 \n"

# The loss panel as plot_log.figure draws it: the legend names train and val, each run's val loss
# dashed in the colour of its train loss.
loss_panel=$("$PY" - "$DIR/ours" "$DIR/torch.log" <<'PY'
import sys
sys.path.insert(0, "dev")
import plot_log
runs = [plot_log.read_run(path, label) for path, label in zip(sys.argv[1:], ["ours", "torch"])]
loss = plot_log.figure(runs).axes[0]
print(loss.get_title() + ":", ", ".join(text.get_text() for text in loss.get_legend().get_texts()))
print(", ".join(f"{line.get_color()} {line.get_linestyle()}" for line in loss.get_lines()))
PY
)
check "two runs: train and val loss in one panel, one colour per run" "$loss_panel" \
  "loss: ours train, ours val, torch train, torch val
C0 -, C0 --, C1 -, C1 --"

# Default labels: the run directory's name, the file name otherwise.
out=$("$PY" dev/plot_log.py "$DIR/ours/main.log" "$DIR/torch.log" -o "$DIR/plot2.png")
check "default labels" "$(echo "$out" | sed -n 2p)" \
  "| step | ours | torch.log | torch.log vs ours |"

# One run: its val losses alone; llm.c's log has no tokens/s and this one no HellaSwag line, so
# their panels are left out.
out=$("$PY" dev/plot_log.py "$DIR/torch.log" -o "$DIR/one.png")
check "one run without tokens/s and HellaSwag: their panels left out" "$(echo "$out" | tail -n1)" \
  "wrote $DIR/one.png: loss, learning rate, grad norm"
check "one run: the table" "$(echo "$out" | sed -n '1,6p')" "val loss at the 4 steps common to all runs
| step | torch.log |
|---:|---:|
| 0 | 10.901090 |
| 2 | 10.399480 |
| 3 | 9.500000 |"

# No step in common.
printf 'step=1 kind=val loss=3.0\n' > "$DIR/late.log"
out=$("$PY" dev/plot_log.py "$DIR/ours" "$DIR/late.log" -o "$DIR/none.png" | sed -n 1p)
check "no common step" "$out" "no step has a val loss in every run: nothing to compare"
check "a val loss alone: the loss panel only" \
  "$("$PY" dev/plot_log.py "$DIR/late.log" -o "$DIR/late.png" | tail -n1)" "wrote $DIR/late.png: loss"

# expect_error DESCRIPTION EXPECTED_MESSAGE ARGS...: exit 1 and exactly that message on stderr.
expect_error() {
  local what=$1 message=$2
  shift 2
  "$PY" dev/plot_log.py "$@" >/dev/null 2>"$DIR/stderr"
  local status=$?
  check "$what: exit status" "$status" "1"
  check "$what: message" "$(cat "$DIR/stderr")" "$message"
}
FORMATS="lines read 'step=N kind=K key=value ...' (llmc/logger.h) or 's:N trl:X' (llm.c)"
bad() {  # bad LINE: a log whose third line is LINE
  printf '%s\n' 'step=0 kind=val loss=11.0' \
    'step=1 kind=train loss=10.9 norm=1 lr=1e-4 ms=1 tok_per_s=1' "$1" > "$DIR/bad/main.log"
}
bad "step=2 kind=train loss"
expect_error "a token without =" "error: $DIR/bad/main.log:3: 'loss' is not key=value; $FORMATS" \
  "$DIR/bad" -o "$DIR/x.png"
bad "step=2 kind=train norm=1.0"
expect_error "a train line without loss" \
  "error: $DIR/bad/main.log:3: a kind=train line needs loss=...; $FORMATS" \
  "$DIR/bad" -o "$DIR/x.png"
bad "step=2 kind=val loss=abc"
expect_error "a value that is not a number" \
  "error: $DIR/bad/main.log:3: loss='abc' is not a number; $FORMATS" "$DIR/bad" -o "$DIR/x.png"
bad "step=two kind=val loss=1.0"
expect_error "a step that is not an integer" \
  "error: $DIR/bad/main.log:3: step 'two' is not an integer; $FORMATS" "$DIR/bad" -o "$DIR/x.png"
bad "step=2 loss=1.0"
expect_error "no kind" \
  "error: $DIR/bad/main.log:3: a line must start with step=N kind=K; $FORMATS" \
  "$DIR/bad" -o "$DIR/x.png"
bad "s:2 tel:1.0 trl"
expect_error "llm.c format: a token without :" \
  "error: $DIR/bad/main.log:3: 'trl' is not key:value; $FORMATS" "$DIR/bad" -o "$DIR/x.png"
bad "s:2 tel:1.0x"
expect_error "llm.c format: a bad number" \
  "error: $DIR/bad/main.log:3: tel='1.0x' is not a number; $FORMATS" "$DIR/bad" -o "$DIR/x.png"
bad "loss 3.4"
expect_error "a line in neither format" \
  "error: $DIR/bad/main.log:3: 'loss 3.4' is not a log line; $FORMATS" "$DIR/bad" -o "$DIR/x.png"
GIVE="give a run directory (-o of a trainer) or its main.log"
expect_error "a missing log" "error: $DIR/missing.log: no such file: $GIVE" \
  "$DIR/missing.log" -o "$DIR/x.png"
expect_error "a directory without main.log" \
  "error: $DIR/empty_dir/main.log: the directory has no main.log: $GIVE" \
  "$DIR/empty_dir" -o "$DIR/x.png"
printf '\n\n' > "$DIR/blank.log"
expect_error "a log without lines" \
  "error: $DIR/blank.log: no log lines: is this a run's main.log?" "$DIR/blank.log" -o "$DIR/x.png"
expect_error "--labels of the wrong count" \
  "error: --labels 'a' gives 1 labels for 2 logs: give one non-empty label per log, \
comma-separated" \
  "$DIR/ours" "$DIR/torch.log" -o "$DIR/x.png" --labels a
missing="$DIR/no/such/dir/x.png"
expect_error "-o into a missing directory" \
  "error: -o $missing: cannot write the figure: [Errno 2] No such file or directory: '$missing'" \
  "$DIR/ours" -o "$missing"

finish test_plot_log
