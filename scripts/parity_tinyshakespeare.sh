#!/usr/bin/env bash
# End-to-end parity on a GPU: GPT-2 124M from one initial checkpoint, trained on tiny shakespeare in
# the same data order by train_gpt2cu (BF16) and by train_gpt2.py (PyTorch, bf16 autocast) with the
# same hyperparameters. Prints both validation-loss curves side by side (with their relative
# difference) and plots the two runs.
# TINYSHAKESPEARE=FILE: a local copy of the text, when the shards are not prepared yet.
#
# usage: scripts/parity_tinyshakespeare.sh OUTDIR [STEPS]    (OUTDIR must not hold earlier runs)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/help.sh "$@"
[ $# -ge 1 ] && [[ "$1" != -* ]] ||
  { echo "error: usage: scripts/parity_tinyshakespeare.sh OUTDIR [STEPS] (--help says more)" >&2; exit 1; }
out=$1
steps=${2:-300}
PYTHON=${PYTHON:-python3}
data=dev/data/tinyshakespeare
if [ ! -f $data/tiny_shakespeare_val_000000.bin ]; then
  bash dev/data/tinyshakespeare.sh ${TINYSHAKESPEARE:+--input "$TINYSHAKESPEARE"}
fi
[ -x ./train_gpt2cu ] || make train_gpt2cu
mkdir -p "$out"

# The initial model: d12 from seed 42, written by PyTorch; both runs start from this file.
"$PYTHON" train_gpt2.py --model d12 --seed 42 --write_debug_state "$out/init" --batch_size 1 \
  --seq_len 8 --debug_steps 1 >/dev/null
init=$out/init/gpt2_d12.bin

B=16 T=256 lr=6e-4 warmup=20 val_every=25 val_batches=8
./train_gpt2cu -e "$init" -i "$data/tiny_shakespeare_train_*.bin" -j "$data/tiny_shakespeare_val_*.bin" \
  -b $B -t $T -l $lr -u $warmup -q 0 -k cosine -c 0.1 -gc 1.0 -x "$steps" -v $val_every \
  -m $val_batches -s "$steps" -g 96 -S 42 -sh 1 -o "$out/ours" | tee "$out/ours.txt"
"$PYTHON" train_gpt2.py --init_from "$init" --input_bin "$data/tiny_shakespeare_train_*.bin" \
  --input_val_bin "$data/tiny_shakespeare_val_*.bin" -b $B -t $T --learning_rate $lr \
  --warmup_iters $warmup --final_lr_frac 0 --lr_schedule cosine --weight_decay 0.1 --grad_clip 1.0 \
  --num_iterations "$steps" --val_every $val_every --val_steps $val_batches --seed 42 --shuffle 1 \
  --dtype bfloat16 --compile 0 --device cuda --output_dir "$out/pytorch" | tee "$out/pytorch.txt"
"$PYTHON" dev/plot_log.py "$out/pytorch" "$out/ours" --labels pytorch,train_gpt2cu \
  -o "$out/parity.png" | tee "$out/parity_table.txt"
