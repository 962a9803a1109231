#!/usr/bin/env bash
# Tests how a trainer fails on bad input: missing or damaged token shards, checkpoints and state
# files (a wrong checksum), bad flags, an output directory it cannot or must not write, a disk that
# fills up while a checkpoint is written, a model too large for the GPU. Every case must exit non-zero with exactly one line on stderr, "error: ..." naming
# the file or flag at fault, and must leave the files already in the output directory (a
# checkpoint, main.log, a DONE marker) byte for byte as they were.
# The flags used are common to both trainers. A case that needs a flag the trainer lacks (its
# --help decides) is adapted (-n) or skipped with a printed note (-y), as are the cases that need
# a tmpfs where mounting is not permitted (only root may mount).
# A CUDA trainer on a machine without a GPU checks every flag and file it can before it looks for
# one: each case that fails there must fail with its own message, not the GPU's; the fixture then
# comes from the CPU trainer, the cases that need a GPU are skipped, and a good command line must
# get as far as the GPU.
# Scratch files go to build/test_tmp/bad_input_<trainer>.
#
#   bash dev/test/test_bad_input.sh                          (./train_gpt2; without a GPU also the
#                                                             CUDA builds that are built)
#   TRAINER=./train_gpt2cu bash dev/test/test_bad_input.sh   (one trainer)
set -uo pipefail
cd "$(dirname "$0")/../.."

gpu_visible() { nvidia-smi -L > /dev/null 2>&1; }

# MAKEFLAGS cleared: under `make test` the caller's jobserver is not open to this make.
MAKEFLAGS= ${MAKE:-make} -s train_gpt2 build/reshard_checkpoint || exit 1
if [ -z "${TRAINER:-}" ]; then
  status=0
  TRAINER=./train_gpt2 bash "$0" || status=1
  if ! gpu_visible; then
    for trainer in ./train_gpt2cu ./train_gpt2fp32cu; do
      if [ -x "$trainer" ]; then
        TRAINER=$trainer bash "$0" || status=1
      else
        echo "skip $trainer without a GPU: not built (make $(basename "$trainer"))"
      fi
    done
  fi
  exit $status
fi
if [ ! -x "$TRAINER" ]; then
  echo "test_bad_input: $TRAINER is not an executable: build it first"
  exit 1
fi
DIR=build/test_tmp/bad_input_$(basename "$TRAINER")
LOGS=$DIR/logs
MOUNTS=()
cleanup() {
  local m
  for m in "${MOUNTS[@]}"; do umount "$m"; done
}
trap cleanup EXIT
for m in "$DIR/full" "$DIR/readonly"; do
  mountpoint -q "$m" 2>/dev/null && umount "$m"  # left mounted by an interrupted run
done
chmod -R u+w "$DIR" 2>/dev/null
rm -rf "$DIR"
mkdir -p "$LOGS"

source "$(dirname "$0")/lib.sh"
skipped=0
skip() {  # skip CASE WHY
  skipped=$((skipped + 1))
  echo "skip $1: $2"
}

help=$("$TRAINER" --help 2>&1)
help_status=$?
has_flag() { grep -qE -- "^  $1 " <<< "$help"; }  # a flag's first line, not a wrapped help line
# A CUDA trainer (it has -r) where no GPU is visible: only the checks before the GPU can be run.
no_gpu=0
if has_flag -r && ! gpu_visible; then
  no_gpu=1
  echo "no GPU visible: the cases that need one are skipped, the others must fail before the GPU"
fi
# needs_gpu CASE: true (after a printed skip) where the case cannot run here.
needs_gpu() {
  [ $no_gpu = 1 ] || return 1
  skip "$1" "$TRAINER needs a GPU for it, and none is visible"
}

# mount_tmpfs DIR OPTIONS: a tmpfs at DIR, unmounted at exit; fails (quietly) where mounting is
# not permitted.
mount_tmpfs() {
  mkdir -p "$1"
  mount -t tmpfs -o "$2" bad_input "$1" 2>/dev/null || return 1
  MOUNTS+=("$1")
}

# --- tiny shards: 256 int32 header (magic, version, count), then uint16 tokens (dev/SPEC.md)
python3 - "$DIR" <<'PY' || { echo "FAIL writing the test shards"; failed=$((failed + 1)); finish test_bad_input; }
import random, struct, sys
directory = sys.argv[1]
rng = random.Random(0)
VOCAB = 50257

def shard(name, tokens, magic=20240520, version=1, count=None, trailing=b""):
    header = struct.pack("<256i", magic, version, len(tokens) if count is None else count, *[0] * 253)
    with open(f"{directory}/{name}", "wb") as f:
        f.write(header + struct.pack(f"<{len(tokens)}H", *tokens) + trailing)

tokens = [rng.randrange(VOCAB) for _ in range(2048)]
shard("train.bin", tokens)
shard("val.bin", tokens[:1024])
shard("short_val.bin", tokens[:200])
open(f"{directory}/empty.bin", "wb").close()
shard("truncated.bin", tokens[:1000], count=2048)
shard("trailing.bin", tokens, trailing=b"\x01\x02\x03")
shard("magic.bin", tokens, magic=20240326)
shard("version.bin", tokens, version=2)
shard("token.bin", tokens[:100] + [VOCAB] + tokens[101:])
shard("big.bin", tokens * 257)  # one batch of 512 x 1024 and its target
# documents of 700 tokens (EOT first), enough for record #89's last stage: 2 x 393,216 + 2 tokens
shard("documents.bin", [VOCAB - 1 if i % 700 == 0 else t for i, t in enumerate(tokens * 400)])
shard("documents_val.bin", tokens * 130)  # one validation sequence of 262,144 and its target
PY

COMMON=(-i "$DIR/train.bin" -j "$DIR/val.bin" -e tiny -b 4 -t 64 -v 0 -s 0 -k constant -l 1e-3)

# --- a finished run to protect: its checkpoint, main.log and DONE marker (the CPU trainer
# writes no DONE marker: one is put there, as the file a resume would look for). Without a GPU
# the CPU trainer writes it.
FIXTURE=$DIR/fixture
fixture_trainer=$TRAINER
[ $no_gpu = 1 ] && fixture_trainer=./train_gpt2
if ! "$fixture_trainer" "${COMMON[@]}" -x 2 -o "$FIXTURE" > "$LOGS/fixture.out" 2>&1 ||
   [ ! -f "$FIXTURE/model_00000002.bin" ] || [ ! -f "$FIXTURE/main.log" ]; then
  echo "FAIL a good 2-step run into $FIXTURE (log in $LOGS/fixture.out):"
  tail -n 5 "$LOGS/fixture.out" | sed 's/^/     /'
  failed=$((failed + 1))
  finish test_bad_input
fi
[ -f "$FIXTURE/DONE_00000002" ] || : > "$FIXTURE/DONE_00000002"
KEEP=$DIR/keep
cp -a "$FIXTURE" "$KEEP"

# Names and checksums of every file under the given paths.
snapshot() {
  local p
  for p in "$@"; do
    if [ -e "$p" ]; then
      find "$p" -type f -print0 | sort -z | xargs -0 -r sha256sum
    else
      echo "absent: $p"
    fi
  done
}

# attempt PATTERN ARGS...: runs the trainer with ARGS and puts into `problems` each way it did
# not fail as it should: exit status 0 (or a signal), stderr other than one "error:" line matching
# the extended regex PATTERN, or a change to the files under the paths in WATCH.
WATCH=()
case_number=0
attempt() {
  local pattern=$1
  shift
  cmdline="$TRAINER$(printf " %q" "$@")"
  case_number=$((case_number + 1))
  out=$LOGS/case_$case_number.out
  err=$LOGS/case_$case_number.err
  local before after status
  before=$(snapshot "${WATCH[@]}")
  timeout 300 "$TRAINER" "$@" > "$out" 2> "$err"
  status=$?
  after=$(snapshot "${WATCH[@]}")
  problems=()
  if [ $status -eq 0 ]; then
    problems+=("exit status 0")
  elif [ $status -eq 124 ]; then
    problems+=("no exit within 300 s")
  elif [ $status -gt 128 ]; then
    problems+=("killed by signal $((status - 128))")
  fi
  local lines
  lines=$(wc -l < "$err")
  if [ "$lines" -ne 1 ] || ! grep -q '^error: ' "$err"; then
    problems+=("stderr should be one line starting with 'error:', it has $lines line(s)")
  elif ! grep -qE -- "$pattern" "$err"; then
    problems+=("the error does not match: $pattern")
  fi
  if [ "$before" != "$after" ]; then
    problems+=("files changed under ${WATCH[*]}:")
    while IFS= read -r line; do problems+=("  $line"); done < <(diff <(echo "$before") <(echo "$after"))
  fi
}

# report CASE: one line for the case; on failure the problems, stderr and the end of stdout.
report() {
  if [ ${#problems[@]} -eq 0 ]; then
    passed=$((passed + 1))
    echo "ok   $1"
    return
  fi
  failed=$((failed + 1))
  echo "FAIL $1"
  echo "     $cmdline"
  printf '     %s\n' "${problems[@]}"
  sed 's/^/     stderr: /' "$err"
  tail -n 3 "$out" | sed 's/^/     stdout: /'
  if ! diff -r -q "$KEEP" "$FIXTURE" > /dev/null; then  # the next cases start clean
    rm -rf "$KEEP"
    cp -a "$FIXTURE" "$KEEP"
  fi
}

# expect CASE PATTERN ARGS...: a training run into $KEEP with ARGS added (later flags win).
expect() {
  local name=$1 pattern=$2
  shift 2
  WATCH=("$KEEP")
  attempt "$pattern" "${COMMON[@]}" -x 2 -o "$KEEP" "$@"
  report "$name"
}

# --- token shards (every shard is checked at start-up, before the output directory is touched)
expect "missing shard pattern (no match)" "no files match -i '$DIR/nothing_\*\.bin'" \
  -i "$DIR/nothing_*.bin"
expect "empty shard" "empty\.bin: the file is empty" -i "$DIR/empty.bin"
expect "truncated shard (fewer tokens than the header says)" \
  "truncated\.bin: header says 2048 tokens.*\(truncated\)" -i "$DIR/truncated.bin"
expect "trailing bytes after the tokens" "trailing\.bin: header says 2048 tokens.*\(trailing bytes\)" \
  -i "$DIR/trailing.bin"
expect "wrong shard magic" "magic\.bin: not a token shard \(magic 20240326, expected 20240520\)" \
  -i "$DIR/magic.bin"
expect "wrong shard version" "version\.bin: unsupported token shard version 2" -i "$DIR/version.bin"
# Token ids are read with a shard's tokens, when the data loader loads it: after the GPU's setup,
# so into a new output directory (a finished run's in -o is refused before the GPU).
if ! needs_gpu "token id >= vocab size"; then
  expect "token id >= vocab size" "token\.bin: token 50257 at position 100 is >= vocab size 50257" \
    -i "$DIR/token.bin" -o "$DIR/token_run"
fi
expect "bad validation shard (-j, wrong magic)" "magic\.bin: not a token shard" \
  -v 1 -m 1 -j "$DIR/magic.bin"

# --- flags checked against each other and the model
expect "-t above the model's max sequence length" "-t 128 is above the model's max" -t 128
expect "-z not a multiple of B*T*processes" "-z 100 is not a (positive )?multiple of B\*T" -z 100
expect "-z of more than INT_MAX micro steps (2^32 x B*T)" "-z 1099511627776" -z 1099511627776
expect "-g above the model's max sequence length - 1" \
  "-g 64 is above the model's maximum sequence length - 1 = 63 .*use -g 63 or less" -g 64 -s 1
expect "-tk naming no file" "-tk $DIR/no_tokenizer\.bin: no such vocabulary file" \
  -tk "$DIR/no_tokenizer.bin" -s 1
# -tk's header is read before the GPU: a file of another kind, a shard or a folder is named as -tk's
expect "-tk naming a text file (README.md)" \
  "-tk README\.md: not a tokenizer vocabulary file \(magic -?[0-9]+, expected 20240328\): write one with build/write_tokenizer" \
  -tk README.md -s 1
expect "-tk naming a token shard" \
  "-tk $DIR/train\.bin: not a tokenizer vocabulary file \(magic 20240520, expected 20240328\)" \
  -tk "$DIR/train.bin" -s 1
expect "-tk naming a folder" \
  "-tk dev/data/gpt2 is a folder, not a vocabulary file; make one with dev/data/tinyshakespeare\.sh \(DIR/gpt2_tokenizer\.bin\), or leave -tk out" \
  -tk dev/data/gpt2 -s 1

# --- a file matched by both -i and -j: the validation loss would be of data trained on
mkdir -p "$DIR/split"
cp "$DIR/train.bin" "$DIR/split/train.bin"
cp "$DIR/val.bin" "$DIR/split/val.bin"
expect "a shard matched by both -i and -j" \
  "$DIR/split/val\.bin is matched by both -i '$DIR/split/\*\.bin' and -j '$DIR/split/val\.bin'" \
  -i "$DIR/split/*.bin" -j "$DIR/split/val.bin" -v 1 -m 1

# --- a -j shard that is a byte-for-byte copy of an -i shard, under another name
mkdir -p "$DIR/copy"
cp "$DIR/train.bin" "$DIR/copy/val.bin"
expect "a -j shard that is a copy of an -i shard" \
  "$DIR/copy/val\.bin \(-j '$DIR/copy/val\.bin'\) holds the same bytes as $DIR/train\.bin \(-i '$DIR/train\.bin'\)" \
  -j "$DIR/copy/val.bin" -v 1 -m 1

# --- checkpoints given with -e
cp "$FIXTURE/model_00000002.bin" "$DIR/bad_magic.bin"
printf '\x00\x00\x00\x00' | dd of="$DIR/bad_magic.bin" bs=4 count=1 conv=notrunc status=none
head -c 1000000 "$FIXTURE/model_00000002.bin" > "$DIR/cut.bin"
expect "missing checkpoint (-e path that does not exist)" \
  "-e $DIR/missing\.bin: no such checkpoint file" -e "$DIR/missing.bin"
# A folder for -e: what -e takes, and (where the trainer resumes) the flags for the run in it
if has_flag -y; then
  folder_fix="; to resume the run in that folder: -o $KEEP -y 1"
else
  folder_fix=""
fi
expect "-e naming a folder (a finished run's)" \
  "^error: -e $KEEP is a folder: -e takes a model file or a preset \(d12 d24 d36 d48 tiny\)$folder_fix\$" \
  -e "$KEEP"
expect "corrupt checkpoint (bad magic)" "bad_magic\.bin: not a GPT-2 checkpoint \(magic 0" \
  -e "$DIR/bad_magic.bin"
expect "truncated checkpoint" "cut\.bin: checksum mismatch \(CRC-32 [0-9a-f]{8} in the header, [0-9a-f]{8} computed\): the file is damaged" \
  -e "$DIR/cut.bin"
if has_flag -y; then
  expect "resume with a checkpoint of another configuration (-y 1 -e d12, a tiny model in -o)" \
    "-y 1: $KEEP/model_00000002\.bin holds a model L=2 .*-e d12" -y 1 -e d12
  expect "resume from an -o that does not exist" "-y 1: -o $DIR/no_run: no such directory" \
    -y 1 -o "$DIR/no_run"
  # A DONE marker whose model or state file was removed since (the CPU trainer's fixture has no
  # state file): one line, the marker to delete.
  for kind in model state; do
    cp -a "$FIXTURE" "$DIR/resume_no_$kind"
    rm -f "$DIR/resume_no_$kind/${kind}_00000002"*.bin
    suffix=$([ $kind = state ] && echo _00000)
    WATCH=("$DIR/resume_no_$kind")
    attempt "-y 1: $DIR/resume_no_$kind/DONE_00000002 marks a complete checkpoint, but $DIR/resume_no_$kind/${kind}_00000002${suffix}\.bin is missing: delete the marker to resume from the checkpoint before it" \
      "${COMMON[@]}" -x 4 -o "$DIR/resume_no_$kind" -y 1
    report "resume from a checkpoint whose $kind file is missing"
  done
else
  skip "resume with a checkpoint of another configuration" "$TRAINER has no -y (no resume)"
fi

# --- checksums (llmc/file_header.h): the CRC-32 in header slots 254-255 catches one flipped bit
# of the parameters or the header, and a file cut short; a checkpoint without one (llm.c's: both
# slots zero) loads as before.
# flip_byte FILE OFFSET XOR / zero_bytes FILE OFFSET COUNT change a copy in place.
flip_byte() { python3 -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(int(sys.argv[2])); b = f.read(1)[0]; f.seek(int(sys.argv[2])); f.write(bytes([b ^ int(sys.argv[3])]))' "$@"; }
zero_bytes() { dd if=/dev/zero of="$1" bs=1 seek="$2" count="$3" conv=notrunc status=none; }
cp "$FIXTURE/model_00000002.bin" "$DIR/payload_bit.bin"
flip_byte "$DIR/payload_bit.bin" 5000 16
WATCH=("$KEEP" "$DIR/payload_bit.bin")
attempt "payload_bit\.bin: checksum mismatch \(CRC-32 [0-9a-f]{8} in the header, [0-9a-f]{8} computed\): the file is damaged; re-create it" \
  "${COMMON[@]}" -x 2 -o "$KEEP" -e "$DIR/payload_bit.bin"
report "damaged checkpoint (one parameter bit flipped)"
# One byte of the header changed (the head count, 4 -> 127): the checksum, checked before the
# config, names the damaged file; without a checksum the config check names it too.
cp "$FIXTURE/model_00000002.bin" "$DIR/header_byte.bin"
flip_byte "$DIR/header_byte.bin" 20 123
expect "damaged checkpoint (one header byte changed)" \
  "header_byte\.bin: checksum mismatch \(CRC-32 [0-9a-f]{8} in the header, [0-9a-f]{8} computed\): the file is damaged" \
  -e "$DIR/header_byte.bin"
cp "$DIR/header_byte.bin" "$DIR/header_byte_unchecked.bin"
zero_bytes "$DIR/header_byte_unchecked.bin" 1016 8
expect "damaged checkpoint without a checksum (one header byte changed)" \
  "header_byte_unchecked\.bin: invalid model config: channels 128 is not divisible by heads 127: the header is damaged" \
  -e "$DIR/header_byte_unchecked.bin"
cp "$FIXTURE/model_00000002.bin" "$DIR/no_checksum.bin"
zero_bytes "$DIR/no_checksum.bin" 1016 8
head -c 1000000 "$DIR/no_checksum.bin" > "$DIR/cut_unchecked.bin"
expect "truncated checkpoint without a checksum" \
  "cut_unchecked\.bin: checkpoint for .* should be [0-9]+ bytes but is 1000000 \(truncated\)" \
  -e "$DIR/cut_unchecked.bin"
if ! needs_gpu "a checkpoint without a checksum (llm.c's) trains"; then
  "$TRAINER" "${COMMON[@]}" -x 1 -e "$DIR/no_checksum.bin" > "$LOGS/no_checksum.out" 2>&1
  check "a checkpoint without a checksum (llm.c's) trains: exit status" "$?" 0
fi
if ! has_flag -y; then
  skip "resume from a damaged state file" "$TRAINER has no -y (no state files)"
elif ! needs_gpu "resume from a damaged state file"; then
  # A state file whose header says more AdamW updates than steps: caught before the checksum,
  # with the way back to the checkpoint before it.
  cp -a "$FIXTURE" "$DIR/state_header"
  printf '\x63\x00\x00\x00' | dd of="$DIR/state_header/state_00000002_00000.bin" bs=4 seek=5 count=1 \
    conv=notrunc status=none
  WATCH=("$DIR/state_header")
  attempt "state_00000002_00000\.bin: 99 AdamW updates recorded at step 2 \(must be 0\.\.2\): the header is damaged; delete $DIR/state_header/DONE_00000002" \
    "${COMMON[@]}" -x 4 -o "$DIR/state_header" -y 1
  report "resume from a state file with a damaged header (AdamW updates > step)"
  cp -a "$FIXTURE" "$DIR/state_payload"
  flip_byte "$DIR/state_payload/state_00000002_00000.bin" 30000 1
  WATCH=("$DIR/state_payload")
  attempt "state_00000002_00000\.bin: checksum mismatch .*delete $DIR/state_payload/DONE_00000002" \
    "${COMMON[@]}" -x 4 -o "$DIR/state_payload" -y 1
  report "resume from a state file with one damaged byte"
fi
if ! has_flag -y; then
  skip "resume past the run's last step" "$TRAINER has no -y (no resume)"
elif ! needs_gpu "resume past the run's last step"; then
  cp -a "$FIXTURE" "$DIR/resume_past"
  WATCH=("$DIR/resume_past")
  attempt "-y 1: the checkpoint in $DIR/resume_past is of step 2, past this run's last step 1 \(-x 1\): give -x 3 or more to go on from it" \
    "${COMMON[@]}" -x 1 -o "$DIR/resume_past" -y 1
  report "resume with -x before the checkpoint's step"
  # A loader state that does not fit the run's batch (-b 2, the checkpoint's 4) fails before the
  # log is rewritten: a line after the checkpoint's step (an interrupted run's) is still there.
  cp -a "$FIXTURE" "$DIR/resume_batch"
  echo "step=3 kind=train loss=5.000000 norm=1.0000 lr=1.0000e-03 ms=1.00 tok_per_s=1" >> "$DIR/resume_batch/main.log"
  WATCH=("$DIR/resume_batch")
  attempt "cannot resume the data loader: the checkpoint was taken with .*; resume with the same data and settings" \
    "${COMMON[@]}" -b 2 -x 4 -o "$DIR/resume_batch" -y 1
  report "resume with another batch: the log after the checkpoint kept"
  cp -a "$FIXTURE" "$DIR/resume_data"
  WATCH=("$DIR/resume_data")
  attempt "state_00000002_00000\.bin: written over training data of 2048 tokens, but this run's -i holds 526336: resume with the run's training data" \
    "${COMMON[@]}" -i "$DIR/big.bin" -x 4 -o "$DIR/resume_data" -y 1
  report "resume over training data of another size (one shard both)"
fi

# --- a model and batch too large for the GPU: the error says how much was needed and what to
# change, before anything in -o is touched (-r is the CUDA trainer's: the CPU trainer has no GPU)
if ! has_flag -r; then
  skip "not enough GPU memory" "$TRAINER has no -r (not a GPU trainer)"
elif ! needs_gpu "not enough GPU memory"; then
  expect "not enough GPU memory (-e d48 -b 512 -t 1024)" \
    "not enough GPU memory for [a-zA-Z0-9* -]+: needs [0-9.]+ MiB, [0-9.]+ MiB free of [0-9.]+ MiB; reduce the micro batch \(-b\) or sequence length \(-t\), or recompute more \(-r 1\)" \
    -e d48 -b 512 -t 1024 -i "$DIR/big.bin" -j "$DIR/big.bin" -o "$DIR/memory_run"
fi

# --- -fp8 takes 0, 1 or 2 (the CUDA trainer's flag)
if has_flag -fp8; then
  expect "-fp8 3" "-fp8 3: must be within \[0, 2\]" -fp8 3
else
  skip "-fp8 3" "$TRAINER has no -fp8"
fi

# --- -fp8g sets the format of -fp8's gradients: refused without -fp8
if has_flag -fp8g; then
  expect "-fp8g without -fp8" "-fp8g 1 sets the FP8 gradients' format: give -fp8 1 or 2 with it" -fp8g 1
else
  skip "-fp8g without -fp8" "$TRAINER has no -fp8g"
fi

# --- packed documents (-pd) and the attention window (-aw), the CUDA trainer's flags: a window
# needs documents, documents need -t a multiple of 128, -x (no epoch to count by) and shards that
# hold a step of them; the schedule needs steps to grow over. d12 (a preset: initialised only once
# a GPU is found) for its sequence length.
if has_flag -pd; then
  expect "-aw without -pd" "-aw 2 windows document-causal attention; add -pd 1" -aw 2
  expect "-aw -2" "-aw -2: give a window of 1 or more blocks, -1 for the schedule or 0 for none" -pd 1 -aw -2
  expect "-pd 1 at -t 64" "-pd 1 attends within whole blocks of 128 tokens: -t 64 is not a multiple of 128; use -t 128" \
    -pd 1
  WATCH=("$KEEP")
  attempt "-pd 1 reads document-aligned sequences, which have no epoch to count the steps by: give the steps with -x" \
    "${COMMON[@]}" -o "$KEEP" -e d12 -t 128 -pd 1
  report "-pd 1 without -x"
  expect "-aw -1 with -x 0" "-aw -1 grows the window over the run's steps, and -x 0 has none" -e d12 -t 128 -pd 1 \
    -aw -1 -x 0
  expect "-pd 1 with a shard shorter than a step of documents" \
    "train\.bin: 2048 tokens are too few for one step of document-aligned sequences, .* needs at least 2050" \
    -e d12 -t 128 -b 8 -pd 1
  # A window counts blocks of 128 tokens: one of 100000 (tokens meant) is wider than -t can use
  expect "-aw 100000 at -t 128 (tokens given for blocks)" \
    "^error: -aw 100000 counts blocks of 128 tokens, and -t 128 is 1 block: -aw 2 already attends to all of it \(the short layers take half the window\); use -aw 2 or less \(0: no window\)\$" \
    -e d12 -t 128 -pd 1 -aw 100000
  # A short window given (-aw S/L): no wider than its long one, which is fixed and 1 or more blocks
  expect "-aw S/L, the short above the long" \
    "^error: -aw 5/3: the short window 5 is not within 1 and the long window 3: give S/L with 1 <= S <= L\$" \
    -e d12 -t 128 -pd 1 -aw 5/3
  expect "-aw S/L beside the schedule" "^error: -aw 2/-1: a short window takes a fixed long one of 1 or more blocks" \
    -e d12 -t 128 -pd 1 -aw 2/-1
  expect "-aw S/L without a window" "^error: -aw 1/0: a short window takes a fixed long one" -e d12 -t 128 -pd 1 \
    -aw 1/0
  # The final validation's long window (-awf): beside a last stage's window, no narrower than its
  # short one, in blocks
  expect "-awf without a window" \
    "^error: -awf 4 sets the long window of the validation after the last step, and the last stage has no window" \
    -e d12 -t 256 -pd 1 -awf 4
  expect "-awf below the last stage's short window" \
    "^error: -awf 1 is below the last stage's short window of 2 blocks, which the final validation keeps: give -awf 2 or more\$" \
    -e d12 -t 256 -pd 1 -aw 2/2 -awf 1
  expect "-awf wider than the sequences" \
    "^error: -awf 5 counts blocks of 128 tokens, and t 256 is 2 blocks: -awf 2 already attends to all of it; use -awf 2 or less\$" \
    -e d12 -t 256 -pd 1 -aw 2 -awf 5
  # Windows counted in tokens (-awt 1) need a window to count
  expect "-awt 1 without documents" "^error: -awt 1 counts the attention windows in tokens, and this run has none" \
    -e d12 -t 256 -awt 1
  expect "-awt 1 without a window" "^error: -awt 1 counts the attention windows in tokens, and this run has none" \
    -e d12 -t 256 -pd 1 -awt 1
  expect "-awt out of range" "^error: -awt 2: must be" -e d12 -t 256 -pd 1 -aw 2 -awt 2
  # The key offset shifts the rotary's stationary dims: the modern architectures only
  expect "-ko 1 without rotary" "^error: -ko 1 shifts the keys' stationary rotary dims, and the gpt2 architecture has no rotary" \
    -e d12 -t 256 -ko 1
  expect "-ko out of range" "^error: -ko 2: must be" -e d12 -t 256 -ko 2
else
  skip "-pd and -aw" "$TRAINER has no -pd"
fi

# --- the stage plan (-sp, llmc/stages.h): its text, each stage against the model and the batch,
# and what needs -pd 1; all before the GPU (d12 for its sequence length)
if has_flag -sp; then
  expect "-sp shares not summing to 1" "^error: -sp: the stages' shares of the steps sum to 0\.75, not 1" \
    -sp "0.5; 0.25"
  expect "-sp unknown setting" "^error: -sp: stage 2: unknown setting 'depth': a stage sets t, z, cap, aw, lr, mtp and pw" \
    -sp "1/2; 1/2 depth=3"
  expect "-sp extension before a stage" "stage 2: comes after the extension steps" -sp "+5; 1"
  expect "-sp stage without a step" "-sp: stage 2 of 2 gets no step of -x 2" -sp "0.9; 0.1"
  expect "-sp stage t above the model's" "^error: -sp stage 2 \(t=256 z=-1 aw=0\): t=256 is above the model's maximum sequence length 64" \
    -e tiny -sp "1/2; 1/2 t=256"
  expect "-sp stage z not a multiple" "^error: -sp stage 2 \(t=64 z=300 aw=0\): z 300 is not a multiple of B\*T\*processes = 4\*64\*1 = 256: use z=256 or another multiple\$" \
    -e tiny -t 64 -sp "1/2; 1/2 z=300"
  expect "-sp t changing without -pd 1" "-sp: stage 2 sets t=128 \(the first stage's is 64\): a sequence length that changes between stages needs document-aligned sequences \(-pd 1\)" \
    -e d12 -t 64 -sp "1/2; 1/2 t=128"
  expect "-sp cap without -pd 1" "-sp: a document cap \(cap=N\) cuts document-aligned sequences: add -pd 1" \
    -e d12 -t 64 -sp "1 cap=64"
  expect "-sp negative cap" "^error: -sp: stage 2: cap=-1: give an integer from 0 to 2147483647\$" \
    -e d12 -t 128 -b 1 -pd 1 -sp "1/2 cap=64; 1/2 cap=-1"
  expect "-sp stage's window wider than its t" "^error: -sp stage 2 \(t=256 z=-1 aw=9\): -aw 9 counts blocks of 128 tokens, and t 256 is 2 blocks" \
    -e d12 -t 128 -b 1 -pd 1 -sp "1/2; 1/2 t=256 aw=9"
  expect "-sp stage's short window above its long one" \
    "^error: -sp: stage 2: aw=4/3: the short window 4 is not within 1 and the long window 3: give S/L with 1 <= S <= L\$" \
    -e d12 -t 128 -b 1 -pd 1 -sp "1/2 aw=1/3; 1/2 aw=4/3"
  expect "-sp mtp= of 4 weights" "^error: -sp: stage 2: mtp=1,0.5,0.25,0.1: give 1 to 3 next-token weights within \[0, 1\] apart by commas \(1,0.5,0.25\), or START>END\$" \
    -sp "1/2; 1/2 mtp=1,0.5,0.25,0.1"
  expect "-sp mtp= ends of different counts" "^error: -sp: stage 1: mtp=1,0.5>1: 2 weights at the start and 1 at the end: give as many at each end\$" \
    -sp "1 mtp=1,0.5>1"
  expect "-sp pw= above 1" "^error: -sp: stage 1: pw=0.25>2: give the prefix term's weight within \[0, 1\], or START>END\$" \
    -sp "1 pw=0.25>2"
  expect "-sp loss weights starting at 0" "^error: -sp: stage 2: mtp 0>1, pw 0: every term of the loss starts at weight 0: give the next token a weight \(mtp=1\)\$" \
    -sp "1/2; 1/2 mtp=0>1"
  expect "-sp with -x -1" "-sp shares out -x's steps among its 2 stages: give -x" -sp "1/2; 1/2" -x -1
  expect "-sp loss weights ramping with -x -1" "^error: -sp: mtp=A>B and pw=A>B change the loss's weights over a stage's steps, which -x gives: give -x\$" \
    -sp "1 pw=0.5>0" -x -1
  expect "-sp t changing with -a 1" "-a 1 trains on its first batch, of the first stage's t=128, and -sp stage 2 sets t=256" \
    -e d12 -t 128 -b 1 -pd 1 -a 1 -sp "1/2; 1/2 t=256"
else
  skip "-sp" "$TRAINER has no -sp"
fi

# --- the rate's cooldown (-k cooldown -kc) and Muon's momentum cooldown (-mc, counted back from
# the run's last step, -sp's extension included): all before the GPU
if has_flag -mc; then
  expect "-mc negative" "^error: -mc -5: must be at least 0\$" -opt muon -mc -5
  expect "-mc longer than the run" "^error: -mc 3: the momentum's cooldown is longer than the run's 2 steps \(-x 2\): give -mc 2 or less\$" \
    -opt muon -mc 3
  expect "-mc longer than the run and its extension" "^error: -mc 5: the momentum's cooldown is longer than the run's 4 steps \(-x 2 and -sp's 2 extension steps\): give -mc 4 or less\$" \
    -opt muon -mc 5 -sp "1; +2"
  expect "-mc without Muon" "^error: -mc 1 cools Muon's momentum, and -opt adamw has no Muon: give -opt muon with it, or leave -mc out; -opt adamw comes from -recipe gpt2: give -opt to override it\$" \
    -mc 1
  expect "-mc without -x" "^error: -mc 1 counts back from the run's last step: give -x\$" -opt muon -mc 1 -x -1
  expect "-kc with another schedule" "^error: -kc 0\.6 is the cooldown of -k cooldown: give -k cooldown with it\$" -kc 0.6
  expect "-kc above 1" "^error: -kc 1\.5: must be within \[0, 1\]\$" -k cooldown -kc 1.5
else
  skip "-mc and -kc" "$TRAINER has no -mc"
fi

# --- -fp8 in the FP32 build, whose products are FP32: a flag error, before the GPU (the compute
# capability it needs in the BF16 build is checked with the GPU)
if has_flag -fp8 && grep -q "precision FP32" <<< "$help"; then
  expect "-fp8 1 in the FP32 build" "-fp8 1 needs the BF16 build \(make train_gpt2cu\); this is the FP32 build" -fp8 1
fi

# --- -fh 1, the speedrun head's FP8 products: the BF16 build's (the FP32 build's -recipe speedrun
# leaves it off), on the speedrun's head; flag errors, before the GPU (the compute capability is
# checked with the GPU)
if has_flag -fh; then
  if grep -q "precision FP32" <<< "$help"; then
    expect "-fh 1 in the FP32 build" "-fh 1 needs the BF16 build \(make train_gpt2cu\); this is the FP32 build: use -fh 0" \
      -recipe speedrun -fh 1
  else
    expect "-fh 1 on GPT-2's head" "-fh 1: the FP8 head's fixed scales are the speedrun's .*-recipe gpt2's head runs in BF16: use -fh 0" \
      -fh 1
  fi
fi
# --- -fm 1, record #89's FP8 MLP: the BF16 build's (the FP32 build's -recipe record89 leaves it off), on
# a ReLU^2 MLP without biases, with its backward from ReLU^2's output (-mr 1); flag errors, before the GPU
if has_flag -fm; then
  if grep -q "precision FP32" <<< "$help"; then
    expect "-fm 1 in the FP32 build" "-fm 1 needs the BF16 build \(make train_gpt2cu\); this is the FP32 build: use -fm 0" \
      -recipe record89 -fm 1
  else
    expect "-fm 1 on GPT-2's MLP" "-fm 1: record #89's FP8 MLP is a ReLU\^2 MLP without biases, and -recipe gpt2's is not: use -fm 0" \
      -fm 1
    expect "-fm 1 with -mr 0" "-fm 1: the FP8 forward keeps ReLU\^2's output alone, which the backward reads: give -mr 1 with it, or -fm 0" \
      -recipe record89 -fm 1 -mr 0
  fi
fi

# --- -fhs, the FP8 head's scales: three numbers, on the speedrun's head (flag errors, before the GPU)
if has_flag -fhs; then
  expect "-fhs of two numbers" "^error: -fhs 100,1.6: give three numbers apart by commas, X,W,G .*e.g. 100,1.6,0.75\$" \
    -recipe speedrun -fhs 100,1.6
  expect "-fhs with W = 0" "^error: -fhs 0: must be within " -recipe speedrun -fhs 100,0,0.75
  expect "-fhs on GPT-2's head" "^error: -fhs sets the FP8 head's scales, and -recipe gpt2's head has no FP8 form: drop -fhs or use -recipe speedrun\$" \
    -fhs 100,1.6,0.75
fi

# --- -ns, Muon's orthogonalisation: a name of its table, and only with Muon (flag errors, before the
# GPU)
if has_flag -ns; then
  expect "-ns of an unknown name" "^error: -ns newton: unknown orthogonalisation: use baseline .*, speedrun .* or polar " \
    -opt muon -ns newton
  expect "-ns without Muon" "^error: -ns polar sets Muon's orthogonalisation, which -opt adamw does not use: add -opt muon or drop -ns; -opt adamw comes from -recipe gpt2" \
    -ns polar
fi

# --- -mtp and -pw, the training loss's terms (record #89's): 1 to 3 weights and a prefix weight,
# each within [0, 1], not all 0; the prefix term's vocabulary file (flag and file errors, before the
# GPU)
if has_flag -mtp; then
  expect "-mtp of 4 weights" "^error: -mtp 1,0.5,0.25,0.1: more than 3 weights \(the next token's and the 2 after it\)\$" \
    -mtp 1,0.5,0.25,0.1
  expect "-mtp weight above 1" "^error: -mtp 2: must be within \[0, 1\]\$" -mtp 1,2
  expect "-mtp weight not a number" "^error: -mtp 'x': not a number\$" -mtp 1,x
  expect "-mtp with an empty weight" "^error: -mtp '': not a number\$" -mtp 1,
  expect "-pw above 1" "^error: -pw 2: must be within \[0, 1\]\$" -pw 2
  expect "-mtp 0 with -pw 0" "^error: -mtp 0 and -pw 0: every term of the training loss has weight 0; give the next token a weight \(-mtp 1\); -pw 0 comes from -recipe gpt2: give -pw to override it\$" \
    -mtp 0
  expect "-pw with -tk naming no file" "^error: -tk $DIR/no_tokenizer\.bin: no such vocabulary file" \
    -pw 0.25 -tk "$DIR/no_tokenizer.bin"
  if [ ! -e dev/data/tinyshakespeare/gpt2_tokenizer.bin ]; then
    expect "-pw without a vocabulary file" "^error: -pw 0.25: the prefix term reads each token's bytes from the vocabulary file, and there is none: give -tk FILE" \
      -pw 0.25
    expect "-sp pw= without a vocabulary file" "^error: -sp's pw=: the prefix term reads each token's bytes from the vocabulary file, and there is none: give -tk FILE .*, or pw=0\$" \
      -sp "1 pw=0.25>0"
  else
    skip "-pw without a vocabulary file" "the default vocabulary file dev/data/tinyshakespeare/gpt2_tokenizer.bin exists"
  fi
else
  skip "-mtp and -pw" "$TRAINER has no -mtp"
fi

# --- -ut, the embedding tied to an untied head through a step (record #89's): not on a tied head,
# not below -1 (before the GPU)
if has_flag -ut; then
  expect "-ut on GPT-2's tied head" "^error: -ut 3 ties the embedding to the head through step 3, and the gpt2 architecture's head is the embedding throughout: leave -ut out\$" \
    -ut 3
  expect "-ut below -1" "^error: -ut -2: must be " -ut -2
else
  skip "-ut" "$TRAINER has no -ut"
fi

# --- -lc, the head's cap in place of the architecture's: within its range, on a capped head, a
# shift on the sigmoid cap only (before the GPU)
if has_flag -lc; then
  expect "-lc above 40" "^error: -lc 50: must be within \[1, 40\]\$" -lc 50
  expect "-lc with a shift out of range" "^error: -lc 200: must be within \[-100, 100\]\$" -lc 23,200
  expect "-lc on GPT-2's uncapped head" "^error: -lc 23,5: the gpt2 architecture's logits are uncapped: leave -lc out\$" \
    -lc 23,5
  expect "-lc with a shift on the modern cap" "^error: -lc 15,5: a shift and a BF16 sigmoid are the sigmoid cap's, and the modern architecture's cap is soft-capped at 15: give -lc 15\$" \
    -recipe modern -lc 15,5
  expect "-lc with a BF16 sigmoid on the modern cap" "^error: -lc 15,0,bf16: a shift and a BF16 sigmoid are the sigmoid cap's, and the modern architecture's cap is soft-capped at 15: give -lc 15\$" \
    -recipe modern -lc 15,0,bf16
  expect "-lc with a third item other than bf16" "^error: -lc 23,5,fp8: the third item rounds the sigmoid to BF16 and can only be bf16 \(e.g. 23,5,bf16\)\$" \
    -lc 23,5,fp8
else
  skip "-lc" "$TRAINER has no -lc"
fi

# --- -pk, the step a profiler's NVTX range marks: one of the run's, which -x gives (before the GPU)
if has_flag -pk; then
  expect "-pk out of range" "^error: -pk -2: must be" -pk -2
  expect "-pk past the run's last step" "^error: -pk 2: the run trains steps 0 to 1: give one of them" -pk 2
  expect "-pk without -x" "^error: -pk 0 names a step of the run, whose steps -x gives: give -x" -x -1 -pk 0
fi

# --- -cd, the cautious weight decay: 0 or 1, and only where some weight decays (flag errors, before
# the GPU)
if has_flag -cd; then
  expect "-cd out of range" "^error: -cd 2: must be 0 or 1" -cd 2
  expect "-cd 1 without AdamW's decay" "^error: -cd 1 makes the weight decay cautious, and this run decays nothing \(-c 0\): give -c a decay, or drop -cd" \
    -c 0 -cd 1
  expect "-cd 1 without AdamW's or Muon's decay" "^error: -cd 1 makes the weight decay cautious, and this run decays nothing \(-c 0, -mw 0\): give -c or -mw a decay, or drop -cd" \
    -opt muon -c 0 -mw 0 -cd 1
fi

# --- -mn, NorMuon's second moment: 0 or 1, with Muon, its state whole on every process (-zs 0)
# (before the GPU)
if has_flag -mn; then
  expect "-mn out of range" "^error: -mn 2: must be 0 or 1" -mn 2
  expect "-mn 1 without Muon" "^error: -mn 1 normalises Muon's update, and -opt adamw has no Muon: give -opt muon with it, or drop -mn; -opt adamw comes from -recipe gpt2: give -opt to override it\$" \
    -mn 1
  WATCH=("$KEEP")
  OMPI_COMM_WORLD_SIZE=2 attempt "^error: -mn 1 keeps NorMuon's second moments whole on every process, and -zs 1 shards Muon's state over the 2 processes: give -zs 0\$" \
    "${COMMON[@]}" -x 2 -o "$KEEP" -opt muon -mn 1 -zs 1
  report "-mn 1 with ZeRO-1 on 2 processes"
fi

# --- -mk, Muon's BF16 weights as their FP32 masters' high 16 bits: 0 or 1, with Muon, and in the BF16
# build with master weights (-w 1; the FP32 build's parameters are the masters) (before the GPU)
if has_flag -mk; then
  expect "-mk out of range" "^error: -mk 2: must be 0 or 1" -mk 2
  expect "-mk 1 without Muon" "^error: -mk 1 sets how Muon stores its BF16 weights, and -opt adamw has no Muon: give -opt muon with it, or -mk 0; -opt adamw comes from -recipe gpt2: give -opt to override it\$" \
    -mk 1
  if ! grep -q "precision FP32" <<< "$help"; then
    expect "-mk 1 with -w 0" "^error: -mk 1 keeps Muon's BF16 weights as the high 16 bits of their FP32 master weights, and -w 0 keeps none: give -w 1 with it, or -mk 0; -mk 1 comes from -recipe record89: give -mk to override it\$" \
      -recipe record89 -w 0
  fi
fi

# --- -od, the optimizers divided over the processes: 0 or 1, not with ZeRO-1 (before the GPU); the
# modern and speedrun recipes' 1 yields to a -zs 1 given without it (the run goes on to the next check)
if has_flag -od; then
  expect "-od out of range" "^error: -od 2: must be 0 or 1" -od 2
  expect "-od 1 with -zs 1" "^error: -od 1 divides the optimizers' work of a run without ZeRO, and -zs 1 shards it already: give -zs 0 with -od 1, or -od 0\$" \
    -od 1 -zs 1
  expect "-recipe speedrun -zs 1: the recipe's -od 1 yields" "^error: -pd 1 attends within whole blocks of 128 tokens" \
    -recipe speedrun -zs 1
fi
# -oc, -od 1's parameters copied by the copy engines: 0 to 2, with -od 1
if has_flag -oc; then
  expect "-oc out of range" "^error: -oc 3: must be within \[0, 2\]" -oc 3
  expect "-oc 1 without -od 1" "^error: -oc 1 copies the parameters that -od 1's processes step: give -od 1 with it \(and -zs 0\), or -oc 0\$" \
    -zs 0 -od 0 -oc 1
fi
# -os, the embedding tables' rows sent to their owners: 0 or 1, with -od 1, -ov 0, AdamW every step and a
# table that only token lookups fill (GPT-2's embedding is its head too)
if has_flag -os; then
  expect "-os out of range" "^error: -os 2: must be 0 or 1" -os 2
  expect "-os 1 without -od 1" "^error: -os 1 sends the embedding tables' rows to the processes that step them \(-od 1\): give -od 1 with it \(and -zs 0\), or -os 0\$" \
    -zs 0 -od 0 -os 1
  expect "-os 1 with -ov 1" "^error: -os 1 sends the embedding tables' rows after the backward pass, and -ov 1 reduces during it: give -ov 0 with -os 1\$" \
    -recipe speedrun -ov 1 -os 1
  expect "-os 1 with -ao 2" "^error: -os 1 reduces each step's rows, and -ao 2 keeps AdamW's gradients between its updates: give -os 0" \
    -recipe record89 -os 1
  expect "-os 1 with GPT-2's tied head" "^error: -os 1: -recipe gpt2's embedding is the head too, whose gradient fills every row, and it has no other table: give -os 0\$" \
    -zs 0 -od 1 -os 1
fi

# --- -ao, AdamW on every K-th step with the K steps' gradients: within [1, 1000], without clipping
# (which would scale each step's apart), an untie step where AdamW steps, its kept gradients whole on
# every process, not sharded by ZeRO-1 (before the GPU)
if has_flag -ao; then
  expect "-ao out of range" "^error: -ao 0: must be " -ao 0
  expect "-ao 2 with clipping" "^error: -ao 2 sums 2 steps' gradients for AdamW, and -gc 1 would clip each step's apart: give -gc 0 with it \(record #89 clips nothing\)" \
    -ao 2
  expect "-ao 2 with an even untie step" "^error: -ut 2 unties at a step without AdamW's update under -ao 2: give an untie step U with \(U \+ 1\) % 2 == 0 \(record #89's is odd\)\$" \
    -recipe modern -ao 2 -ut 2
  WATCH=("$KEEP")
  OMPI_COMM_WORLD_SIZE=2 attempt "^error: -ao 2 keeps AdamW's gradients between its updates whole on every process, and -zs 1 shards them over the 2 processes: give -zs 0\$" \
    "${COMMON[@]}" -x 2 -o "$KEEP" -recipe modern -ao 2 -zs 1
  report "-ao 2 with ZeRO-1 on 2 processes"
else
  skip "-ao" "$TRAINER has no -ao"
fi
# --- -mq, Muon's Q and K in blocks of heads: with Muon, blocks that split the model's heads
# (before the GPU)
if has_flag -mq; then
  expect "-mq without Muon" "^error: -mq 2 splits Muon's Q and K matrices, and -opt adamw has no Muon: give -opt muon with it, or drop -mq; -opt adamw comes from -recipe gpt2: give -opt to override it\$" \
    -mq 2
  expect "-mq not dividing the heads" "^error: -mq 3: the model's 4 heads do not split into blocks of 3: give a divisor of 4 \(record #89's 2\), or -mq 0 for Q and K whole\$" \
    -opt muon -mq 3
fi
# --- -sm, -bg, -vg, -rl, -xs, -lp and -al, record #89's smear, bigram embedding, value-embedding gates,
# residual lambdas, XSA, plan and attention lambdas: the speedrun's (before the GPU)
speedrun_only() {  # FLAG WHAT: FLAG 1 under -recipe gpt2 is refused, saying FLAG 1 WHAT
  has_flag "$1" || return 0
  expect "$1 1 without the speedrun" "^error: $1 1 $2, and -recipe gpt2 is not the speedrun: give -recipe speedrun with it, or drop $1\$" \
    "$1" 1
}
speedrun_only -sm "smears the speedrun's embedding"
speedrun_only -bg "gives the speedrun a bigram embedding"
speedrun_only -vg "gates the speedrun's value embeddings"
speedrun_only -rl "scales the speedrun's residual adds"
speedrun_only -xs "gives the speedrun's attention XSA"
speedrun_only -lp "lays out the speedrun's layers as record #89's"
speedrun_only -al "scales the speedrun's attention weights"
if has_flag -al; then
  if ! grep -q "precision FP32" <<< "$help"; then  # the FP32 build refuses -fp8 itself first
    expect "-al 1 with -fp8 1" "^error: -al 1 scales the attention's weights, which -fp8 1 casts to FP8 unscaled \(record #89's FP8 is the MLP's alone\): give -fp8 0 with it, or drop -al\$" \
      -recipe speedrun -al 1 -fp8 1
  fi
  expect "-al 1 with AdamW's kept gradients" "^error: -al 1 turns the attention weights' gradients into the lambdas' at each step's end, and -ao 2 with -opt adamw keeps those gradients over steps: give -opt muon with it, or drop -al\$" \
    -recipe speedrun -al 1 -opt adamw -ao 2 -gc 0
  expect "-al out of range" "^error: -al 2: must be" -recipe speedrun -al 2
fi
if has_flag -xs; then
  expect "-xs 1 with -recipe modern" "^error: -xs 1 gives the speedrun's attention XSA, and -recipe modern is not the speedrun: give -recipe speedrun with it, or drop -xs\$" \
    -recipe modern -xs 1
fi
if has_flag -lp; then
  expect "-lp 1 with -recipe modern" "^error: -lp 1 lays out the speedrun's layers as record #89's, and -recipe modern is not the speedrun: give -recipe speedrun with it, or drop -lp\$" \
    -recipe modern -lp 1
  expect "-lp out of range" "^error: -lp 2: must be" -recipe speedrun -lp 2
fi
# --- -ph, record #89's paired heads: with its plan and rotary pairs (before the GPU)
if has_flag -ph; then
  expect "-ph 1 without -lp 1 and -rp 1" "^error: -ph 1 pairs the heads of record #89's plan's layers, rotated in its rotary pairs: give -lp 1 and -rp 1 with it \(and -recipe speedrun\), or drop -ph; -rp 0 comes from -recipe speedrun: give -rp to override it; -lp 0 comes from -recipe speedrun: give -lp to override it\$" \
    -recipe speedrun -ph 1
  expect "-ph 1 without -rp 1" "^error: -ph 1 pairs the heads of record #89's plan's layers" -recipe speedrun -lp 1 -ph 1
  expect "-ph out of range" "^error: -ph 2: must be" -recipe speedrun -ph 2
  expect "-ph 1 with windows in blocks" "^error: the model's paired heads \(-ph 1\) attend over each sequence doubled, whose windows record #89 counts in positions: give -awt 1" \
    -recipe speedrun -lp 1 -rp 1 -ph 1 -t 128 -vt 128
fi
# --- -mg, record #89's MUDD gate generators: with its plan (before the GPU)
if has_flag -mg; then
  expect "-mg 1 without -lp 1" "^error: -mg 1 generates the gates of record #89's plan: give -lp 1 with it \(and -recipe speedrun\), or drop -mg; -lp 0 comes from -recipe speedrun: give -lp to override it\$" \
    -recipe speedrun -mg 1
  expect "-mg out of range" "^error: -mg 2: must be" -recipe speedrun -lp 1 -mg 2
fi
# --- -ca, record #89's composed attention: with the MUDD gate generators (before the GPU)
if has_flag -ca; then
  expect "-ca 1 without -mg 1" "^error: -ca 1 reads its weights from the MUDD gate generators: give -mg 1 with it \(and -lp 1, -recipe speedrun\), or drop -ca; -mg 0 comes from -recipe speedrun: give -mg to override it\$" \
    -recipe speedrun -lp 1 -ca 1
fi
# --- -rp, record #89's rotary pairs: the modern and speedrun models' (before the GPU)
if has_flag -rp; then
  expect "-rp 1 without rotary" "^error: -rp 1 lays out the rotary's pairs, and -recipe gpt2 has no rotary: give -recipe modern or speedrun with it, or drop -rp\$" \
    -rp 1
  expect "-rp out of range" "^error: -rp 2: must be" -recipe modern -rp 2
fi
# --- -asc, the attention's softmax scale: positive and finite (before the GPU)
if has_flag -asc; then
  expect "-asc 0" "^error: -asc 0: the attention's softmax scale must be positive \(record #89's 0.1; leave -asc out for the architecture's\)\$" \
    -recipe speedrun -asc 0
  expect "-asc negative" "^error: -asc -0.1: the attention's softmax scale must be positive" -asc -0.1
  expect "-asc not finite" "^error: -asc 'nan': not a number" -asc nan
fi
# --- -ri, record #89's init: the speedrun's, of a preset's model, 0 or 89 (before the GPU)
if has_flag -ri; then
  expect "-ri 89 without the speedrun" "^error: -ri 89 is the speedrun's init, and -recipe gpt2 is not the speedrun: give -recipe speedrun with it, or drop -ri\$" \
    -ri 89
  expect "-ri of no record" "^error: -ri 28: no such init; give 89 \(record #89's\) or 0 \(record #28's, the speedrun's own\)\$" \
    -recipe speedrun -ri 28
  expect "-ri with a model file" "^error: -ri 89 initialises a preset's model from the seed, and -e $DIR/model.bin is a model file, which holds the parameters: drop -ri\$" \
    -recipe speedrun -ri 89 -e "$DIR/model.bin"
fi
# --- -mr, record #89's MLP backward from ReLU^2's output: a ReLU^2 MLP, -r 0, -fp8 0 (before the GPU)
if has_flag -mr; then
  expect "-mr 1 with GELU" "^error: -mr 1 takes ReLU\^2's derivative from its kept output: give a ReLU\^2 MLP \(-recipe modern or speedrun\) with -r 0 and -fp8 0, or -mr 0\$" \
    -e d12 -mr 1
  expect "-mr 1 with -r 1" "^error: -mr 1 takes ReLU\^2's derivative from its kept output: give a ReLU\^2 MLP" \
    -recipe modern -mr 1 -r 1
fi
# --- -yn, record #89's YaRN: the rotary's, over a stage plan whose every stage has a window (before the GPU)
if has_flag -yn; then
  expect "-yn 1 without rotary" "^error: -yn 1 rescales the rotary's frequencies, and the gpt2 architecture has no rotary: give -recipe modern or speedrun, or leave -yn out\$" \
    -e d12 -t 256 -pd 1 -aw 2 -yn 1
  expect "-yn 1 without a window" "^error: -yn 1 rescales the rotary at the stage plan's changes of the long window, and stage 1 of 1 has no window: give every stage one \(aw=, or -aw, with -pd 1\), or drop -yn" \
    -recipe modern -yn 1
  expect "-yn 1 with a stage without a window" "^error: -yn 1 rescales the rotary at the stage plan's changes of the long window, and stage 2 of 2 has no window" \
    -recipe modern -e d12 -t 256 -pd 1 -sp "1/2 aw=1; 1/2 aw=0" -yn 1
  expect "-yn out of range" "^error: -yn 2: must be" -yn 2
fi

# --- -ar, AdamW's tensors' own rows: tensors of the table and of the model, numbers and betas, not
# the matrices Muon takes (before the GPU)
if has_flag -ar; then
  expect "-ar of an unknown tensor" "^error: -ar emb:lr=2: no parameter tensor 'emb': name one of wte, wpe, lnew, [a-z0-9_, ]*\$" \
    -ar emb:lr=2
  expect "-ar with a rate that is not a number" "^error: -ar wte:lr 'x': not a number\$" -ar wte:lr=x
  expect "-ar with a beta of 1" "^error: -ar wte:b2 1: must be within \(0, 1\)\$" -ar wte:b2=1
  expect "-ar of an unknown key" "^error: -ar wte:beta1=0.5: 'beta1=0.5' is not key=value of lr, rate, b1, b2, wd, decay or bf16\$" \
    -ar wte:beta1=0.5
  expect "-ar of an unknown BF16 kind" "^error: -ar wte:bf16 'moments': give none \(FP32\), weight \(the weight rounded to BF16\) or all \(the moments too\)\$" \
    -ar wte:bf16=moments
  expect "-ar of a matrix Muon takes" "^error: -ar qkvw:lr=2: qkvw is Muon's \(-opt muon takes the blocks' matrices\), its rate and decay Muon's \(-ml, -mw\): drop its row, or give -opt adamw\$" \
    -opt muon -ar qkvw:lr=2
  expect "-ar of a tensor the model lacks" "^error: -ar headw:b1=0.5: the gpt2 model has no headw: drop its row\$" \
    -ar headw:b1=0.5
fi

# --- flags that do nothing without another are refused: the checkpoints' flags without -o, -nm
# without -nk
for flag in -y -halt -n -nk -nm; do
  if has_flag $flag; then
    WATCH=("$KEEP")
    attempt "$flag( 1)? needs -o DIR" "${COMMON[@]}" -x 2 $flag 1
    report "$flag without -o"
  else
    skip "$flag without -o" "$TRAINER has no $flag"
  fi
done
if has_flag -halt; then
  expect "-halt 0" "-halt 0: step 0 writes no checkpoint to continue from; give -halt 1 or later \(-1: never\)" \
    -halt 0
fi
if has_flag -nm; then
  expect "-nm without -nk" "-nm 2 keeps checkpoints that -nk would delete: give -nk with it" -nm 2
fi

# --- HellaSwag (-h 1) evaluates 4 rows at once, from -hs's file
if has_flag -hs; then
  expect "-h 1 with -b 2" "HellaSwag evaluates 4 rows at once: use -b 4 or more" -h 1 -b 2 -t 32
  expect "-h 1 without its eval file" \
    "^error: -hs $DIR/no_hellaswag\.bin: no such HellaSwag eval file; -h 1 evaluates it: bash dev/data/hellaswag\.sh makes dev/data/hellaswag/hellaswag_val\.bin \(-hs's default\), or leave -h 1 out\$" \
    -h 1 -b 4 -hs "$DIR/no_hellaswag.bin"
fi

# --- --help is the usage everywhere; where -h is a flag of its own (HellaSwag) it takes a value
check "--help: exit status" "$help_status" 0
check "--help: the usage" "$(grep -c '^usage: ' <<< "$help")" 1
if has_flag -hs; then
  expect "-h alone where -h is HellaSwag" \
    "flag -h needs a value: .*HellaSwag.* \(--help for the usage\)\$" -h
fi

# --- the checkpoint tool's -i (once, with the CPU trainer)
if ! has_flag -r; then
  WATCH=()
  cmdline="build/reshard_checkpoint -i $DIR/no_run -o $DIR/resharded -p 2"
  build/reshard_checkpoint -i "$DIR/no_run" -o "$DIR/resharded" -p 2 > /dev/null 2> "$LOGS/reshard.err"
  check "reshard_checkpoint -i of a missing directory: exit status" "$?" 1
  check "reshard_checkpoint -i of a missing directory: the error" "$(cat "$LOGS/reshard.err")" \
    "error: -i $DIR/no_run: no such directory"
fi

# --- -ac takes 0, 1 or 2 (the CUDA trainer's flag)
if has_flag -ac; then
  expect "-ac 3" "-ac 3: must be within \[0, 2\]" -ac 3
else
  skip "-ac 3" "$TRAINER has no -ac"
fi

# --- the output directory
expect "existing main.log in -o for a new run" \
  "$KEEP/main\.log already holds a run log: .*give -o another directory"
# A log with no complete checkpoint beside it (a run stopped before its first): nothing to resume,
# so both messages give the same two ways out, a new -o or deleting the log.
mkdir -p "$DIR/log_only"
cp "$FIXTURE/main.log" "$DIR/log_only/"
WATCH=("$DIR/log_only")
attempt "^error: $DIR/log_only/main\.log already holds a run log: give -o another directory, or delete the log\$" \
  "${COMMON[@]}" -x 2 -o "$DIR/log_only"
report "main.log without a checkpoint in -o for a new run: no resume offered"
if has_flag -y; then
  attempt "^error: -y 1: $DIR/log_only/main\.log holds a run log, but $DIR/log_only has no complete checkpoint \(a DONE_<step> marker\) to resume from: give -o another directory for a new run, or delete the log and run without -y\$" \
    "${COMMON[@]}" -x 2 -o "$DIR/log_only" -y 1
  report "-y 1 into -o with main.log and no checkpoint: the same two ways out"
fi

echo "a file, not a directory" > "$DIR/not_a_dir"
WATCH=("$DIR/not_a_dir")
attempt "not_a_dir.*Not a directory" "${COMMON[@]}" -x 2 -o "$DIR/not_a_dir"
report "unwritable -o: a file where a directory is expected"

mkdir -p "$DIR/readonly"
chmod 555 "$DIR/readonly"
if [ -w "$DIR/readonly" ] && ! mount_tmpfs "$DIR/readonly" ro,size=64k; then
  skip "unwritable -o: a directory under a read-only one" \
    "root writes through the permissions and a read-only tmpfs cannot be mounted here"
else
  WATCH=("$DIR/readonly")
  attempt "readonly/run.*(Read-only file system|Permission denied)" \
    "${COMMON[@]}" -x 2 -o "$DIR/readonly/run"
  report "unwritable -o: a directory under a read-only one"
fi

# --- an -o that cannot be created (root passes /proc's permission check): refused before the GPU
expect "-o /proc/x (a directory that cannot be created)" \
  "-o /proc/x: the directory cannot be created: /proc is .*; give -o a directory you can write to" \
  -o /proc/x

# --- bad command lines
expect "-b x (not a number)" "-b.*'x'.*integer" -b x
expect "-l abc (not a number)" "-l.*'abc'.*number" -l abc
expect "unknown flag" "unknown flag '-bogus'" -bogus 1
expect "flag without a value" "flag -l needs a value: .* \(--help for the usage\)\$" -l

# --- the CUDA trainer's flags on the CPU trainer: named as the CUDA trainer's, not as unknown;
# with a CUDA build here, every flag of its --help that the CPU trainer lacks (but -h, which asks
# the CPU trainer for its usage)
if ! has_flag -recipe; then
  cuda_flag_error="is a flag of the CUDA trainer \(\./train_gpt2cu\), which this CPU trainer does not take: it trains GPT-2 in FP32 with AdamW only"
  expect "-recipe modern on the CPU trainer" "-recipe $cuda_flag_error" -recipe modern
  expect "-opt muon on the CPU trainer" "-opt $cuda_flag_error" -opt muon
  expect "-pd 1 on the CPU trainer" "-pd $cuda_flag_error" -pd 1
  expect "-vg 1 on the CPU trainer" "-vg $cuda_flag_error" -vg 1
  expect "-rl 1 on the CPU trainer" "-rl $cuda_flag_error" -rl 1
  expect "-xs 1 on the CPU trainer" "-xs $cuda_flag_error" -xs 1
  expect "-lp 1 on the CPU trainer" "-lp $cuda_flag_error" -lp 1
  expect "-ph 1 on the CPU trainer" "-ph $cuda_flag_error" -ph 1
  expect "-al 1 on the CPU trainer" "-al $cuda_flag_error" -al 1
  expect "-mg 1 on the CPU trainer" "-mg $cuda_flag_error" -mg 1
  expect "-md 1 on the CPU trainer" "-md $cuda_flag_error" -md 1
  if [ -x ./train_gpt2cu ]; then
    misnamed=()
    for flag in $(./train_gpt2cu --help | grep -oE '^  -[a-zA-Z0-9]+ '); do
      [ "$flag" = -h ] || has_flag "$flag" && continue
      error=$("$TRAINER" "$flag" 1 2>&1 >/dev/null)
      grep -qE -- "^error: $flag $cuda_flag_error" <<< "$error" || misnamed+=("$flag")
    done
    check "every flag of ./train_gpt2cu --help that $TRAINER lacks is named as the CUDA trainer's" \
      "${misnamed[*]}" ""
  else
    skip "the CUDA trainer's flags on the CPU trainer, from its --help" "./train_gpt2cu is not built"
  fi
fi
# --- a value that -recipe set, not the command line: the message says where it came from
if has_flag -recipe; then
  WATCH=("$KEEP")
  attempt "^error: -t 1024 is above the model's maximum sequence length 64: use -t 64 or less; -t 1024 comes from -recipe modern: give -t to override it\$" \
    -recipe modern -e tiny -i "$DIR/train.bin" -j "$DIR/val.bin" -x 2 -o "$KEEP"
  report "-recipe modern's -t above the tiny model's length"
  # -k cosine leaves the recipe's wsd decay fraction unused, not an error
  attempt "no CUDA GPU is visible" "${COMMON[@]}" -recipe modern -k cosine -z -1 -x 2
  [ $no_gpu = 1 ] || problems=()
  grep -q -- "-kd" "$err" && problems+=("-kd named, which the command line did not give")
  report "-recipe modern -k cosine: the recipe's -kd is not named"
  # The speedrun's 40 validation batches are shared by the processes (mpirun's count here): 3
  # cannot share them, and the run stops before it looks for a GPU or its peers.
  WATCH=("$KEEP")
  OMPI_COMM_WORLD_SIZE=3 attempt "^error: -m: -recipe speedrun validates on 40 batches in all, which 3 processes cannot share evenly: give -m, the batches of each process\$" \
    -recipe speedrun -e tiny -i "$DIR/train.bin" -j "$DIR/val.bin" -t 256 -vt 256 -x 2 -o "$KEEP"
  report "-recipe speedrun on 3 processes: its 40 validation batches not shared evenly"
  # The speedrun's -z on a shard shorter than a step's search for documents: the micro batches
  # come from the recipe's -z, searched in twice a step's tokens
  attempt "^error: $DIR/train\.bin: 2048 tokens are too few for one step of document-aligned sequences, which are sought in twice a step's tokens: 2 x -z 393216 \(384 micro batches x B=1 x T=1024 x 1 process\) \+ 2 needs at least 786434; use a smaller -z \(or -b, -t\) or a longer shard; -z 393216 comes from -recipe speedrun: give -z to override it\$" \
    -recipe speedrun -e d12 -t 1024 -vt 1024 -i "$DIR/train.bin" -j "$DIR/val.bin" -x 2 -o "$KEEP"
  report "-recipe speedrun's -z on a short shard: the micro batches named as the recipe's -z"
  # Without validation (-v 0) the batches are not asked for: the next check (-z) is what stops it.
  OMPI_COMM_WORLD_SIZE=3 attempt "^error: -z 1000 is not a multiple of B\*T\*processes" \
    -recipe speedrun -e tiny -i "$DIR/train.bin" -j "$DIR/val.bin" -t 256 -vt 256 -x 2 -v 0 -z 1000 -o "$KEEP"
  report "-recipe speedrun on 3 processes without validation: no validation batches asked for"
fi
# --- validation's own sequence length (-vt): the model's, the mask's blocks, the shards
if has_flag -vt; then
  expect "-vt above the model's maximum" "^error: -vt 128 is above the model's maximum sequence length 64: use -vt 64 or less\$" \
    -vt 128
  expect "-vt longer than the validation shard" "val\.bin: [0-9]+ tokens are too few for one batch: .* \(validation batches of -b 4 sequences of -vt 64 tokens\)\$" \
    -t 32 -v 1 -vt 64 -j "$DIR/short_val.bin"
  WATCH=("$KEEP")
  attempt "^error: -vt 262144 is above the model's maximum sequence length 1024: use -vt 1024 or less; -vt 262144 comes from -recipe speedrun: give -vt to override it\$" \
    -recipe speedrun -e tiny -i "$DIR/train.bin" -j "$DIR/val.bin" -t 256 -x 2 -o "$KEEP"
  report "-recipe speedrun's -vt above the tiny model's length"
fi
expect "a stray word (an unquoted glob that the shell expanded)" "'$DIR/val\.bin'" \
  -i "$DIR/train.bin" "$DIR/val.bin"

# --- the disk fills up while a checkpoint is written: the checkpoint before it stays complete
# and no incomplete one takes a final name. With -n the trainer writes the step-2 checkpoint
# (it fits) and fails on the step-4 one; without -n (the CPU trainer saves only at the end) the
# directory starts with a copy of a step-2 checkpoint and the final step-4 one does not fit.
checkpoint_bytes=$(cat "$FIXTURE"/model_*.bin "$FIXTURE"/state_*.bin 2>/dev/null | wc -c)
run=$DIR/full/run
WATCH=()  # what must stay is compared with the fixture below
if needs_gpu "disk full while a checkpoint is written"; then
  :
elif ! mount_tmpfs "$DIR/full" "size=$((checkpoint_bytes * 3 / 2))"; then
  skip "disk full while a checkpoint is written" "cannot mount a tmpfs here (needs root)"
else
  mkdir -p "$run"
  if has_flag -n; then
    # A checkpoint is complete when its DONE marker is there: model_00000004.bin may be.
    attempt "$run/.*disk full" "${COMMON[@]}" -x 4 -n 2 -o "$run"
    incomplete=DONE_00000004
  else
    cp "$FIXTURE/model_00000002.bin" "$FIXTURE/DONE_00000002" "$run/"
    attempt "$run/.*disk full" "${COMMON[@]}" -x 4 -o "$run"
    incomplete=model_00000004.bin
  fi
  for f in model_00000002.bin state_00000002_00000.bin DONE_00000002; do
    if [ -e "$FIXTURE/$f" ] && ! cmp -s "$FIXTURE/$f" "$run/$f"; then
      problems+=("$run/$f is not the step-2 checkpoint's file (compared with $FIXTURE/$f)")
    fi
  done
  [ -e "$run/$incomplete" ] && problems+=("$run/$incomplete exists: an incomplete checkpoint looks complete")
  report "disk full while a checkpoint is written"
fi

# --- without a GPU a good command line passes every check and fails only for the GPU, with nothing
# created in -o
if [ $no_gpu = 1 ]; then
  WATCH=("$KEEP")
  attempt "no CUDA GPU is visible" "${COMMON[@]}" -x 2 -v 1 -m 1 -s 1 -n 1 -nk 1 -o "$DIR/good_run" \
    -e "$DIR/no_checksum.bin"
  [ -e "$DIR/good_run" ] && problems+=("$DIR/good_run was created before the GPU")
  report "good flags and files get as far as the GPU"
  # The CPU trainer is suggested where it would take the command: GPT-2, and no flag of this one.
  cpu_trainer="; the CPU trainer \./train_gpt2 runs this without one\$"
  attempt "no CUDA GPU is visible.*$cpu_trainer" "${COMMON[@]}" -x 2
  report "no GPU: a GPT-2 run with the shared flags names the CPU trainer"
  for extra in "-recipe modern -t 64 -z -1" "-opt muon" "-recipe gpt2" "-r 1" "-pd 1 -aw -1 -e d12 -t 128"; do
    has_flag "${extra%% *}" || continue
    # shellcheck disable=SC2086  # the flags' words
    attempt "no CUDA GPU is visible \(check nvidia-smi and CUDA_VISIBLE_DEVICES\)\$" "${COMMON[@]}" -x 2 $extra
    report "no GPU: $extra is this trainer's alone, so no CPU trainer is named"
  done
  # Every switch of record #89 this trainer has, together at the record's sizes (the command of
  # dev/notes/record89-reference.md, "Our flags for record #89"): no two refuse each other.
  if has_flag -lp && [ -x build/write_tokenizer ] && build/write_tokenizer --output "$DIR/vocab.bin" >/dev/null; then
    stages="1/3 t=16384 z=131072 cap=896 aw=1/3 lr=1 mtp=1,0.5,0.25>1,0.5,0 pw=0.25;"
    stages+=" 1/3 t=32768 z=262144 cap=2048 aw=3/7 lr=1.52 mtp=1,0.5>1,0 pw=0.25>0;"
    stages+=" 1/3 t=49152 z=393216 aw=5/11 lr=1.73 mtp=1 pw=0; +15 aw=6/13"
    WATCH=("$KEEP")
    attempt "no CUDA GPU is visible" -recipe speedrun -e d12 -lp 1 -ph 1 -rp 1 -awt 1 -ko 1 -yn 1 -asc 0.1 \
      -sm 1 -bg 1 -vg 1 -rl 1 -xs 1 -al 1 -mg 1 -ca 1 -md 1 -ri 89 -i "$DIR/documents.bin" -j "$DIR/documents_val.bin" \
      -x 1270 -sp "$stages" -awf 20 -k cooldown -kc 0.6 -q 0.15 -mc 50 -ns polar -mn 1 -mk 1 -mq 2 -cd 1 \
      -ml 0.023 -mw 1.2 -c 0.005 -ao 2 -ut 847 -lc 23,5,bf16 -fhs 100,1.6,0.75 -pw 0.25 -tk "$DIR/vocab.bin" -v 250 \
      -vt 262144 -m 40 -o "$DIR/record89_run"
    [ -e "$DIR/record89_run" ] && problems+=("$DIR/record89_run was created before the GPU")
    report "record #89's switches together get as far as the GPU"
    # -recipe record89 is that command (and its AdamW rows by tensor): the data's flags alone.
    WATCH=("$KEEP")
    attempt "no CUDA GPU is visible" -recipe record89 -i "$DIR/documents.bin" -j "$DIR/documents_val.bin" \
      -tk "$DIR/vocab.bin" -o "$DIR/record89_recipe_run"
    [ -e "$DIR/record89_recipe_run" ] && problems+=("$DIR/record89_recipe_run was created before the GPU")
    report "-recipe record89 gets as far as the GPU"
    # Without the dense connections its rows of their tensors stand for nothing, and are no error.
    WATCH=("$KEEP")
    attempt "no CUDA GPU is visible" -recipe record89 -md 0 -i "$DIR/documents.bin" -j "$DIR/documents_val.bin" \
      -tk "$DIR/vocab.bin"
    report "-recipe record89 -md 0 gets as far as the GPU (the recipe's rows of the connections left out)"
  elif has_flag -lp; then
    skip "record #89's switches together" "build/write_tokenizer is not built (its vocabulary file for -tk)"
  fi
  # Model files with record #89's MUDD dense connections (train_gpt2.py writes them): without its MUDD gate
  # generators refused at their load, before the GPU (this trainer runs them on the generators' rows); with
  # them taken up to the GPU.
  torch_python=$(python_with "torch numpy")
  # connections_model NAME KWARGS: a model of make_config(..., KWARGS) with the connections in NAME.bin.
  connections_model() {
    PYTHONPATH=. "$torch_python" -c "import train_gpt2 as tg
c = tg.make_config(11, 2, 128, 256, 512, 'x', arch='speedrun', record89_plan=True, mudd_connections=True, $2)
tg.write_checkpoint(tg.GPT(c), '$DIR/$1.bin', tg.CHECKPOINT_FP32)"
  }
  if has_flag -md && [ -n "$torch_python" ]; then
    connections_model mudd_connections "mudd_gates=False"
    connections_model mudd_connections_gates "mudd_gates=True"
    run_model=(-recipe speedrun -i "$DIR/train.bin" -j "$DIR/val.bin" -t 256 -vt 256 -x 2 -o "$KEEP")
    WATCH=("$KEEP")
    attempt "^error: $DIR/mudd_connections\.bin holds a model with record #89's MUDD dense connections \(header slot 9's bit 1024\) but not its MUDD gate generators, which this trainer runs them with: train_gpt2\.py --mudd_connections 1 runs it\$" \
      -e "$DIR/mudd_connections.bin" "${run_model[@]}"
    report "a model with the MUDD dense connections but not the gate generators: refused before the GPU"
    attempt "no CUDA GPU is visible" -e "$DIR/mudd_connections_gates.bin" "${run_model[@]}" -b 1 -z 256 \
      -o "$DIR/mudd_run"
    [ -e "$DIR/mudd_run" ] && problems+=("$DIR/mudd_run was created before the GPU")
    report "a model with the MUDD dense connections and their gate generators: as far as the GPU"
  elif has_flag -md; then
    skip "models with MUDD's dense connections" "no python with torch and numpy to write one"
  fi
  if has_flag -md; then
    expect "-md 1 without -mg 1" "^error: -md 1 runs on the MUDD gate generators' rows here: give -mg 1 with it" \
      -recipe speedrun -lp 1 -md 1
  fi
fi

[ $skipped -gt 0 ] && echo "($skipped case(s) skipped, see above)"
finish test_bad_input
