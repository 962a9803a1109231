#!/usr/bin/env bash
# Bit for bit against another tree of this project (a change that must not move a bit, such as a
# restructuring): builds both trees' CUDA trainers, runs the same short trainings in each (GPT-2
# in BF16, FP32 and -fp8 2, GPT-2 with -opt muon, the modern and speedrun recipes in BF16 and
# FP32, the speedrun with record #89's parts of its 12-layer plan in BF16; validation and samples every 10 steps), generates from each final model with the KV
# cache, and resumes
# this tree's trainer from the other's checkpoint of step 10. Every loss line, validation loss,
# sample, parameter checksum and generated text must be identical, and so must the model and
# training-state files of step 20 (also those of the resumed run; state files only where both trees
# write the same version). Needs a GPU.
#
# usage: scripts/compare_builds.sh OTHER_TREE OUTDIR TINYSHAKESPEARE_TXT [NAME...]
#   OTHER_TREE  the other checkout (for example: git worktree add ../base COMMIT)
#   OUTDIR      logs and runs, one folder per tree (checkpoints removed once compared); the
#               summary is OUTDIR/summary.txt
#   NAME        only these runs (default all): gpt2_bf16 gpt2_fp32 gpt2_fp8 gpt2_muon modern_bf16
#               modern_fp32 speedrun_bf16 speedrun_fp32 speedrun89_bf16
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/help.sh "$@"
[ $# -ge 3 ] || { echo "error: give OTHER_TREE OUTDIR TINYSHAKESPEARE_TXT (--help)" >&2; exit 1; }
other=$(realpath "$1") out=$(realpath -m "$2") text=$3
shift 3
[ -f "$other/train_gpt2.cu" ] || { echo "error: $other holds no train_gpt2.cu: give a checkout" >&2; exit 1; }
[ -f "$text" ] || { echo "error: $text: no such file (tiny shakespeare's input.txt)" >&2; exit 1; }
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(gpt2_bf16 gpt2_fp32 gpt2_fp8 gpt2_muon modern_bf16 modern_fp32 speedrun_bf16 speedrun_fp32
  speedrun89_bf16)
mkdir -p "$out"
summary=$out/summary.txt
: > "$summary"

# The flags of each run after the common ones, and its trainer.
declare -A flags=(
  [gpt2_bf16]="-e d12" [gpt2_fp32]="-e d12" [gpt2_fp8]="-e d12 -fp8 2" [gpt2_muon]="-e d12 -opt muon"
  [modern_bf16]="-recipe modern -e d12 -z -1" [modern_fp32]="-recipe modern -e d12 -z -1"
  [speedrun_bf16]="-recipe speedrun -e d12 -vt 512 -z 1024" [speedrun_fp32]="-recipe speedrun -e d12 -vt 512 -z 1024"
  [speedrun89_bf16]="-recipe speedrun -e d12 -vt 512 -z 1024 -sm 1 -bg 1 -rp 1 -ko 1 -vg 1 -rl 1 -xs 1")
trainer_of() { case "$1" in *_fp32) echo train_gpt2fp32cu ;; *) echo train_gpt2cu ;; esac; }

make -s -j"$(nproc)" train_gpt2cu train_gpt2fp32cu build/prepare_shards >/dev/null &
(cd "$other" && make -s -j"$(nproc)" train_gpt2cu train_gpt2fp32cu >/dev/null) &
wait || { echo "error: a build failed" >&2; exit 1; }
data=$out/data
bash dev/data/tinyshakespeare.sh --input "$text" --output_dir "$data" >/dev/null ||
  { echo "error: could not prepare the data" >&2; exit 1; }
common=(-i "$data/tiny_shakespeare_train_*.bin" -j "$data/tiny_shakespeare_val_*.bin"
  -tk "$data/gpt2_tokenizer.bin" -b 4 -t 256 -x 20 -v 10 -m 4 -s 10 -g 16 -n 10)

# What must match: the step and validation lines without their times, samples, the checksum.
results() { grep -aE "^step .*loss|^sample|checksum" "$1" | sed 's/ | [0-9.]* ms .*//'; }

# run TREE NAME: the training, then greedy and seeded generation from its final model.
run() {
  local tree=$1 name=$2 dir=$out/$(basename "$1")/$2
  rm -rf "$dir"
  (cd "$tree" && ./$(trainer_of "$name") "${common[@]}" ${flags[$name]} -o "$dir") > "$dir.log" 2>&1
  for temp in 0 0.9; do
    (cd "$tree" && ./$(trainer_of "$name") -e "$dir/model_00000020.bin" -bpe dev/data/gpt2 -p "The king" \
      -g 24 -temp $temp -topk 40 -S 7) > "$dir.generate_$temp.log" 2>&1
  done
}

compare() {  # compare LABEL A B
  if cmp -s "$2" "$3" && [ -s "$2" ]; then
    echo "identical  $1 ($(wc -l < "$2") lines)" | tee -a "$summary"
  else
    echo "DIFFERENT  $1" | tee -a "$summary"
    diff "$2" "$3" | head -5 | tee -a "$summary"
  fi
}

file_version() { od -An -t d4 -j 4 -N 4 "$1" | tr -d ' '; }  # a header's [1]

here=$(pwd)
for name in "${names[@]}"; do
  [ -n "${flags[$name]:-}" ] || { echo "error: no run named $name" >&2; exit 1; }
  mkdir -p "$out/$(basename "$other")" "$out/$(basename "$here")"
  run "$other" "$name"
  run "$here" "$name"
  a=$out/$(basename "$other")/$name b=$out/$(basename "$here")/$name
  results "$a.log" > "$a.results"
  results "$b.log" > "$b.results"
  compare "$name training" "$a.results" "$b.results"
  for temp in 0 0.9; do compare "$name generation -temp $temp" "$a.generate_$temp.log" "$b.generate_$temp.log"; done
  # This tree resumes the other's run from its checkpoint of step 10.
  resumed=$b.resumed
  rm -rf "$resumed"
  mkdir -p "$resumed"
  cp "$a"/*_00000010* "$a/main.log" "$resumed/"
  ./$(trainer_of "$name") "${common[@]}" ${flags[$name]} -o "$resumed" -y 1 > "$resumed.log" 2>&1
  grep -aE "^step +(1[1-9]|20)/|checksum" "$a.log" | grep -aE "^step .*loss|checksum" | sed 's/ | [0-9.]* ms .*//' \
    > "$a.after10"
  grep -aE "^step .*loss|checksum" "$resumed.log" | sed 's/ | [0-9.]* ms .*//' > "$resumed.after10"
  compare "$name resumed from the other's step 10" "$a.after10" "$resumed.after10"
  # The files of step 20 hold the same bytes, written straight through and after the resume
  # (training-state files where both trees write the same version of them).
  for file in model_00000020.bin state_00000020_00000.bin; do
    if [ "$file" != model_00000020.bin ] && [ "$(file_version "$a/$file")" != "$(file_version "$b/$file")" ]; then
      echo "skipped    $name $file: versions $(file_version "$a/$file") and $(file_version "$b/$file")" |
        tee -a "$summary"
      continue
    fi
    compare "$name $file" "$a/$file" "$b/$file"
    compare "$name $file, resumed" "$a/$file" "$resumed/$file"
  done
  rm -f "$a"/*.bin "$b"/*.bin "$resumed"/*.bin  # a d12 run's checkpoints take gigabytes
done
! grep -q DIFFERENT "$summary"
