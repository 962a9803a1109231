#!/usr/bin/env bash
# Tests train_gpt2.py's arguments whose defaults depend on the recipe as the CUDA trainer's do
# (llmc/recipe.h): --val_steps on N processes (process_val_steps; the CUDA trainer's -m in
# dev/test/test_schedulers.cpp): the speedrun recipe's 40 batches are shared by the processes,
# given --val_steps and the other recipes' are each process's, and a share that is not whole is
# refused with one line naming the flag; --shuffle: the speedrun reads its shards in name order.
#
#   bash dev/test/test_recipe_args_py.sh     (PYTHON=... to pick the python with torch)
set -uo pipefail
cd "$(dirname "$0")/../.."
source dev/test/lib.sh
require_python torch test_recipe_args_py PYTHON

steps() {
  PYTHONPATH=. "$PY" - "$@" <<'EOF' 2>&1
import sys
import train_gpt2 as tg
world, argv = int(sys.argv[1]), sys.argv[2:]
print(tg.process_val_steps(tg.parse_args(argv + ["--input_bin", "x"]), world))
EOF
}

check "speedrun on 1, 2 and 8 processes: 40, 20 and 5 batches each" \
  "$(steps 1 --recipe speedrun) $(steps 2 --recipe speedrun) $(steps 8 --recipe speedrun)" "40 20 5"
check "speedrun with --val_steps 7 on 8 processes: 7 each, as given" "$(steps 8 --recipe speedrun --val_steps 7)" 7
check "modern and GPT-2 on 8 processes: 20 each" "$(steps 8 --recipe modern) $(steps 8)" "20 20"
out=$(steps 3 --recipe speedrun)
check "speedrun on 3 processes: exit 1, one line naming --val_steps" "$?:$out" \
  "1:error: --val_steps: --recipe speedrun validates on 40 batches in all, which 3 processes cannot share evenly: give --val_steps, the batches of each process"

shuffle() {
  PYTHONPATH=. "$PY" -c 'import sys, train_gpt2 as tg; print(tg.parse_args(sys.argv[1:] + ["--input_bin", "x"]).shuffle)' "$@" 2>&1
}
check "--shuffle: 0 for the speedrun (given: as given), 1 for the others" \
  "$(shuffle --recipe speedrun) $(shuffle --recipe speedrun --shuffle 1) $(shuffle --recipe modern) $(shuffle)" "0 1 1 1"

finish test_recipe_args_py
