#!/usr/bin/env bash
# Tests the trainers' --help: each names a quick first run, and every flag line of the CPU
# trainer's (the flags both share, llmc/flags.h: name, help and default) is in the CUDA trainer's
# word for word; with -recipe, the CUDA trainer's shows the recipe's values and meaning of -l; and the first screen of a CPU run of a large model names the quick first run.
# The CUDA trainers are checked where they are built (`make test` builds them, and --help needs
# no GPU); a missing one is named as skipped.
#
#   bash dev/test/test_trainer_help.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source "$(dirname "$0")/lib.sh"

# The help of one flag in --help's output on stdin, its wrapped lines joined by spaces.
flag_help() {
  awk -v flag="$1" '/^  -/ {on = $1 == flag} on {sub(/^ +/, ""); printf "%s%s", sep, $0; sep = " "}
    END {print ""}'
}

# MAKEFLAGS cleared: under `make test` the caller's jobserver is not open to this make.
MAKEFLAGS= ${MAKE:-make} -s train_gpt2 || exit 1
cpu_help=$(./train_gpt2 --help)
check "./train_gpt2 --help: exit status" "$?" 0
check "./train_gpt2 -h prints the same" "$(./train_gpt2 -h)" "$cpu_help"
check "./train_gpt2 --help names the quick first run" \
  "$(grep -c '^a quick first run: ./train_gpt2 -e tiny ' <<< "$cpu_help")" 1
shared_lines=$(grep -E '^  -[a-zA-Z]+ ' <<< "$cpu_help")
check "./train_gpt2 --help: one line per shared flag" "$(wc -l <<< "$shared_lines")" 21

# The first screen of a CPU run of a large model names the quick first run (one step of d12 at T=8
# on random tokens); the tiny model's does not.
DIR=build/test_tmp/trainer_help
rm -rf "$DIR"
mkdir -p "$DIR"
python3 - "$DIR/train.bin" <<'PY'
import random, struct, sys
tokens = [random.Random(2).randrange(50257) for _ in range(1024)]
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 1, len(tokens), *[0] * 253) +
                              struct.pack(f"<{len(tokens)}H", *tokens))
PY
one_step=(-i "$DIR/train.bin" -b 1 -t 8 -x 1 -v 0 -s 0)
./train_gpt2 -e d12 "${one_step[@]}" > "$DIR/d12.out" 2>&1
check "one step of d12: exit status" "$?" 0
check "d12 on the CPU: the note with the quick first run comes before the first step" \
  "$(grep -aE '^(note: |step )' "$DIR/d12.out" | head -n 1 | grep -o 'a quick first run: ./train_gpt2 -e tiny ')" \
  "a quick first run: ./train_gpt2 -e tiny "
./train_gpt2 -e tiny "${one_step[@]}" > "$DIR/tiny.out" 2>&1
check "the tiny model: no note" "$(grep -c '^note: ' "$DIR/tiny.out")" 0

for trainer in ./train_gpt2cu ./train_gpt2fp32cu; do
  if [ ! -x "$trainer" ]; then
    echo "skip $trainer: not built (make $(basename "$trainer"))"
    continue
  fi
  cuda_help=$("$trainer" --help)
  check "$trainer --help: exit status" "$?" 0
  check "$trainer -h alone is HellaSwag's flag without its value" \
    "$("$trainer" -h 2>&1 >/dev/null | grep -c '^error: flag -h needs a value')" 1
  check "$trainer --help names the quick first run" \
    "$(grep -c '^a quick first run: ./train_gpt2cu ' <<< "$cuda_help")" 1
  missing=$(grep -vxF -f <(grep -E '^  -' <<< "$cuda_help") <<< "$shared_lines")
  check "$trainer --help has every shared flag line of ./train_gpt2 --help" "$missing" ""
  # With -recipe, --help shows what the recipe resolves each flag to, and what -l means under it.
  modern_help=$("$trainer" -recipe modern --help)
  check "$trainer -recipe modern --help: -opt's default is the recipe's optimizer" \
    "$(flag_help -opt <<< "$modern_help" | grep -o '(default [a-z]*)$')" "(default muon)"
  check "$trainer -recipe gpt2 --help: -opt's default is the recipe's optimizer" \
    "$("$trainer" -recipe gpt2 --help | flag_help -opt | grep -o '(default [a-z]*)$')" "(default adamw)"
  check "$trainer -recipe modern --help: -l scales the roles' rates" \
    "$(flag_help -l <<< "$modern_help" | grep -c 'scale of the per-role AdamW rates.*(default 1)$')" 1
  check "$trainer -recipe modern --help: -t is the recipe's" \
    "$(flag_help -t <<< "$modern_help" | grep -o '(default [0-9]*)$')" "(default 1024)"
  check "$trainer --help: no flag names two defaults" "$(grep -c 'default.*(default' <<< "$modern_help")" 0
  # The speedrun recipe's data and schedule are its record's: packed documents in the window's
  # schedule, 1,695 steps of 8 sequences of 49,152 tokens, the rates decaying to 0.1.
  speedrun_help=$("$trainer" -recipe speedrun --help)
  for expected in "-pd 1" "-aw -1" "-x 1695" "-t 49152" "-b 1" "-z 393216" "-q 0.1" "-kd 0.45" "-ml 0.05" \
                  "-v 125" "-m 40" "-vt 262144" "-sh 0"; do
    check "$trainer -recipe speedrun --help: ${expected% *}'s default" \
      "$(flag_help "${expected% *}" <<< "$speedrun_help" | grep -o '(default [-0-9.]*)$')" "(default ${expected#* })"
  done
  # Record #89's recipe: its switches and schedule (dev/test/test_record_flags.cpp compares it with
  # the command of its flags field by field).
  record89_help=$("$trainer" -recipe record89 --help)
  for expected in "-lp 1" "-ca 1" "-ri 89" "-x 1270" "-awf 20" "-q 0.15" "-ml 0.023" "-ut 847" "-ao 2" "-v 250"; do
    check "$trainer -recipe record89 --help: ${expected% *}'s default" \
      "$(flag_help "${expected% *}" <<< "$record89_help" | grep -o '(default [-0-9.]*)$')" "(default ${expected#* })"
  done
  # Its head trains in FP8 in the BF16 build; the FP32 build has no FP8 products. Other recipes: off.
  fp8_head=$([ "$trainer" = ./train_gpt2cu ] && echo 1 || echo 0)
  check "$trainer -recipe speedrun --help: -fh's default" \
    "$(flag_help -fh <<< "$speedrun_help" | grep -o '(default [0-9])$')" "(default $fp8_head)"
  check "$trainer -recipe modern --help: -fh's default" \
    "$(flag_help -fh <<< "$modern_help" | grep -o '(default [0-9])$')" "(default 0)"
  # Record #89's MLP trains its forward in FP8 in the BF16 build likewise.
  check "$trainer -recipe record89 --help: -fm's default" \
    "$(flag_help -fm <<< "$record89_help" | grep -o '(default [0-9])$')" "(default $fp8_head)"
  check "$trainer -recipe speedrun --help: -fm's default" \
    "$(flag_help -fm <<< "$speedrun_help" | grep -o '(default [0-9])$')" "(default 0)"
done

finish test_trainer_help
