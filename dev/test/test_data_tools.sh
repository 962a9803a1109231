#!/usr/bin/env bash
# Tests the data tools end to end: build/prepare_shards (shard format and names, val/train split,
# document modes, existing shards refused, failed writes leaving no file, error messages),
# dev/data/shard_dump.py with build/shard_documents (a jsonl dump into FineWeb-style shards),
# build/write_tokenizer (the vocabulary file) and dev/data/tinyshakespeare.sh: offline (curl and
# wget failing) it uses what its folder holds or names the missing input.txt and --input, and with
# TINYSHAKESPEARE set (the path of its input.txt) it matches llm.c's token counts. Files are
# read back with a small Python reader written from dev/SPEC.md, independent of the C++ code.
# Scratch files go to build/scratch/test_data_tools.
#
#   bash dev/test/test_data_tools.sh        (MAKE=... to use another make command)
set -uo pipefail
cd "$(dirname "$0")/../.."

# MAKEFLAGS cleared: under `make test` the caller's jobserver is not open to this make.
MAKEFLAGS= ${MAKE:-make} -s build/prepare_shards build/write_tokenizer build/encode_text \
  build/shard_documents || exit 1
SCRATCH=build/scratch/test_data_tools
# The small tmpfs of the full-disk test, if a killed run left it mounted.
mountpoint -q "$SCRATCH/full_disk" 2>/dev/null && umount "$SCRATCH/full_disk"
rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"
EOT=50256

source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/data_tools_lib.sh"

# Ids of a text as the encoder gives them (itself tested against tiktoken elsewhere).
ids_of() {
  printf '%s' "$1" > "$SCRATCH/text.txt"
  build/encode_text "$SCRATCH/text.txt" 2>/dev/null
}

# --- file mode, two inputs, small shards: names, headers and the token stream
printf 'Hello world\n\nSecond paragraph.' > "$SCRATCH/a.txt"
printf 'Another file, caf\xc3\xa9 \xf0\x9f\x98\x80!' > "$SCRATCH/b.txt"
stream="$EOT $(ids_of "$(cat "$SCRATCH/a.txt")") $EOT $(ids_of "$(cat "$SCRATCH/b.txt")")"
read -r -a all <<< "$stream"
out="$SCRATCH/files"
build/prepare_shards --input "$SCRATCH/a.txt" --input "$SCRATCH/b.txt" --output_dir "$out" \
  --name mini --shard_size 8 --val_tokens 5 > /dev/null
train_count=$(( ${#all[@]} - 5 ))
expected_train=""
for ((i = 0; i * 8 < train_count; i++)); do
  n=$(( train_count - i * 8 < 8 ? train_count - i * 8 : 8 ))
  expected_train+="$(printf 'mini_train_%06d.bin %d' "$i" "$n")"$'\n'
done
check "val split: one shard of the first 5 tokens" \
  "$(read_shards "$out" mini_val)" "mini_val_000000.bin 5"$'\n'"tokens: ${all[*]:0:5}"
check "train split: shards of 8 tokens, the last one shorter" \
  "$(read_shards "$out" mini_train)" "${expected_train}tokens: ${all[*]:5}"
check "no other files are written" \
  "$(ls "$out" | grep -vc '^mini_\(val\|train\)_[0-9]\{6\}\.bin$')" 0

# --- a rerun into the same directory is refused and leaves its shards byte for byte
sums_before=$(cd "$out" && sha256sum * | sort)
check_error "a rerun into a directory that holds shards" \
  "error: $out already holds shards ($out/mini_train_000000.bin): delete them, or use another --output_dir or --name" \
  build/prepare_shards --input "$SCRATCH/a.txt" --output_dir "$out" --name mini --shard_size 100
check "the refused rerun leaves the shards byte for byte" "$(cd "$out" && sha256sum * | sort)" \
  "$sums_before"

# --- blank_lines mode: documents as llm.c's tinyshakespeare.py cuts them
printf 'First.\n\nSecond\n\n\nthird\n\n' > "$SCRATCH/c.txt"
expected="$EOT $(ids_of $'First.\n\n') $EOT $(ids_of $'Second\n\n')"
expected+=" $EOT $(ids_of $'\nthird\n\n') $EOT"
build/prepare_shards --input "$SCRATCH/c.txt" --output_dir "$SCRATCH/blank" --name doc \
  --documents blank_lines --val_tokens 2 > /dev/null
check "blank_lines: EOT before each document, the separator kept, a final empty document" \
  "$(shard_tokens "$SCRATCH/blank" doc_val) $(shard_tokens "$SCRATCH/blank" doc_train)" \
  "$expected"

# --- default val split: exactly the first shard
build/prepare_shards --input "$SCRATCH/a.txt" --output_dir "$SCRATCH/default" --name d \
  --shard_size 3 > /dev/null
check "default --val_tokens is one shard" "$(shard_names "$SCRATCH/default" d_val)" \
  "d_val_000000.bin 3"

# --- errors
printf 'ok\xff' > "$SCRATCH/bad_utf8.txt"
touch "$SCRATCH/a_file"
base=(build/prepare_shards --output_dir "$SCRATCH/errors" --name e)
check_error "a missing input" "cannot open $SCRATCH/missing.txt" \
  "${base[@]}" --input "$SCRATCH/missing.txt"
check_error "invalid UTF-8" "bad_utf8.txt: invalid UTF-8 at byte 2" \
  "${base[@]}" --input "$SCRATCH/bad_utf8.txt"
check_error "an output dir that is a file" "cannot create directory $SCRATCH/a_file" \
  build/prepare_shards --input "$SCRATCH/a.txt" --output_dir "$SCRATCH/a_file/x" --name e
check_error "a non-numeric --shard_size" "--shard_size 'big' must be an integer" \
  "${base[@]}" --input "$SCRATCH/a.txt" --shard_size big
check_error "--shard_size 0" "--shard_size '0' must be an integer from 1" \
  "${base[@]}" --input "$SCRATCH/a.txt" --shard_size 0
check_error "an unknown --documents mode" "use file or blank_lines" \
  "${base[@]}" --input "$SCRATCH/a.txt" --documents lines
check_error "an unknown flag" "unknown flag '--shards'" \
  "${base[@]}" --input "$SCRATCH/a.txt" --shards 3
check_error "no --input" "no --input FILE given" "${base[@]}"
check_error "no --name" "--name must be" \
  build/prepare_shards --input "$SCRATCH/a.txt" --output_dir "$SCRATCH/errors"
check_error "a flag without its value" "--val_tokens needs a value" \
  "${base[@]}" --input "$SCRATCH/a.txt" --val_tokens
check_error "every token in val" "all 8 tokens went to the val split" \
  "${base[@]}" --input "$SCRATCH/a.txt" --val_tokens 1000
: > "$SCRATCH/empty.txt"
check_error "an empty input" \
  "error: --input $SCRATCH/empty.txt is empty: give a file with text" \
  "${base[@]}" --input "$SCRATCH/a.txt" --input "$SCRATCH/empty.txt"
check "failed runs leave nothing in --output_dir" "$(ls -A "$SCRATCH/errors" 2>/dev/null | wc -l)" 0
check_error "a missing --encoder_dir" "nowhere/encoder.json" \
  "${base[@]}" --input "$SCRATCH/a.txt" --encoder_dir nowhere

# --- a write that fails part way leaves no new file: neither the shard being written nor those
# staged before it, nor an empty vocabulary file. The failure is a full disk (a 64 KiB tmpfs) where
# the test may mount one (root), and always a file size limit (ulimit -f, with SIGXFSZ ignored so
# that the write returns EFBIG instead of killing the tool).
python3 -c 'print(" ".join(f"w{i}" for i in range(30000)))' > "$SCRATCH/big.txt"
listing() { (cd "$1" && find . -type f -exec sha256sum {} + | sort); }
# check_write_failure DESCRIPTION DIR NEEDLE COMMAND...: fails mentioning NEEDLE, DIR unchanged.
check_write_failure() {
  local description=$1 dir=$2 needle=$3 before
  shift 3
  before=$(listing "$dir")
  check_error "$description" "$needle" "$@"
  check "$description leaves $dir as it was" "$(listing "$dir")" "$before"
}
full="$SCRATCH/full_disk"
mkdir -p "$full"
if [ "$(id -u)" = 0 ] && mount -t tmpfs -o size=64k tmpfs "$full" 2>/dev/null; then
  trap 'umount "$full"' EXIT
  echo "kept" > "$full/keep.txt"
  check_write_failure "prepare_shards on a full disk, after 3 shards fit" "$full" \
    "No space left on device" build/prepare_shards --input "$SCRATCH/big.txt" \
    --output_dir "$full" --name big --shard_size 8000 --val_tokens 1000
  check_write_failure "write_tokenizer on a full disk" "$full" "No space left on device" \
    build/write_tokenizer --output "$full/gpt2_tokenizer.bin"
  umount "$full" && trap - EXIT
else
  echo "skipped the full tmpfs: mounting one needs root; the file size limit below still runs"
fi
limited=(bash -c 'trap "" XFSZ; ulimit -f 16; exec "$@"' limited)
check_write_failure "prepare_shards over a file size limit" "$full" "File too large" \
  "${limited[@]}" build/prepare_shards --input "$SCRATCH/big.txt" --output_dir "$full" --name big \
  --shard_size 10000 --val_tokens 1000
check_write_failure "write_tokenizer over a file size limit" "$full" "File too large" \
  "${limited[@]}" build/write_tokenizer --output "$full/gpt2_tokenizer.bin"

# --- shard_dump.py: a jsonl dump into FineWeb-style shards. 60 documents (unicode, newlines, an
# empty one, one longer than a shard) in field "body", tokenized on 2 threads, shards of 40 tokens:
# the shards hold EOT + tokens of each document in order, cut every 40 tokens, shard 0 being val.
dump="$SCRATCH/dump"
mkdir -p "$dump/documents"
python3 - "$dump" <<'PY'
import json, sys
directory = sys.argv[1]
texts = [f"Document {i}: caf\u00e9 \U0001F600\nsecond line {'word ' * (i % 7)}" for i in range(57)]
texts[5] = ""
texts[9] = "A long one. " * 30
texts += ["last\n\n", " spaces  ", "\u4e2d\u6587"]
with open(f"{directory}/dump.jsonl", "w", encoding="utf-8") as f:
    for i, text in enumerate(texts):
        f.write(json.dumps({"id": i, "body": text}) + "\n")
        open(f"{directory}/documents/{i:03d}.txt", "w", encoding="utf-8").write(text)
PY
expected=""
for document in "$dump"/documents/*.txt; do
  expected+=" $EOT $(build/encode_text "$document" 2>/dev/null)"
done
read -r -a all <<< "$expected"
python3 dev/data/shard_dump.py --input "$dump/dump.jsonl" --field body --output_dir "$dump/shards" \
  --shard_size 40 --threads 2 > /dev/null
expected_names="fineweb_val_000000.bin 40"
for ((i = 1; i * 40 < ${#all[@]}; i++)); do
  n=$(( ${#all[@]} - i * 40 < 40 ? ${#all[@]} - i * 40 : 40 ))
  expected_names+=$'\n'"$(printf 'fineweb_train_%06d.bin %d' "$i" "$n")"
done
check "shard_dump: shard 0 is val, train shards numbered from 1, 40 tokens each but the last" \
  "$(shard_names "$dump/shards" fineweb_val; shard_names "$dump/shards" fineweb_train)" \
  "$expected_names"
check "shard_dump: the shards hold EOT + the tokens of each document, in order (${#all[@]} tokens)" \
  "$(shard_tokens "$dump/shards" fineweb_val) $(shard_tokens "$dump/shards" fineweb_train)" \
  "${all[*]}"
check "shard_dump: the vocabulary file is written beside the shards" \
  "$(build/write_tokenizer --output "$SCRATCH/vocab.bin" >/dev/null &&
     cmp -s "$dump/shards/gpt2_tokenizer.bin" "$SCRATCH/vocab.bin" && echo same)" same
check_error "shard_dump into a directory that has shards" "already holds shards" \
  python3 dev/data/shard_dump.py --input "$dump/dump.jsonl" --field body --output_dir "$dump/shards"
printf '{"text": "fine"}\n{"text": "also fine"}\n{"text": broken}\n' > "$dump/bad.jsonl"
check_error "shard_dump of a line that is not JSON" "bad.jsonl:3: not a JSON object" \
  python3 dev/data/shard_dump.py --input "$dump/bad.jsonl" --output_dir "$dump/bad" --shard_size 2
check "shard_dump of bad input keeps no shards" "$(ls "$dump/bad" | wc -l)" 0
check_error "shard_dump without the text field" "dump.jsonl:1: no string field 'text'" \
  python3 dev/data/shard_dump.py --input "$dump/dump.jsonl" --output_dir "$dump/bad"
check_error "shard_dump of a missing file" "--input $dump/none.jsonl: no such readable file" \
  python3 dev/data/shard_dump.py --input "$dump/none.jsonl" --output_dir "$dump/bad"
check_error "shard_dump with --shard_size 0" "--shard_size 0 must be at least 1" \
  python3 dev/data/shard_dump.py --input "$dump/dump.jsonl" --output_dir "$dump/bad" --shard_size 0
if ! python3 -c 'import pyarrow' 2>/dev/null; then
  touch "$dump/dump.parquet"
  check_error "shard_dump of parquet without pyarrow" "reading parquet needs pyarrow: pip install pyarrow" \
    python3 dev/data/shard_dump.py --input "$dump/dump.parquet" --output_dir "$dump/bad"
fi
check_error "shard_documents when the input stops without the end mark" "without the end mark" \
  bash -c "printf '\x02\x00\x00\x00hi' | build/shard_documents --output_dir $dump/bad --shard_size 1"
check "shard_documents keeps no shard of a failed run" "$(ls "$dump/bad" | wc -l)" 0

# --- the vocabulary file, read with the format of dev/SPEC.md
build/write_tokenizer --output "$SCRATCH/gpt2_tokenizer.bin" > /dev/null
vocabulary=$(python3 - "$SCRATCH/gpt2_tokenizer.bin" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
magic, version, vocab_size, eot = struct.unpack_from("<4i", data)
tokens, pos = [], 1024
while pos < len(data):
    tokens.append(data[pos + 1:pos + 1 + data[pos]])
    pos += 1 + data[pos]
print(magic, version, vocab_size, eot, len(tokens), pos == len(data))
print(tokens[0], tokens[15496], tokens[50256])
PY
)
check "write_tokenizer: header, size, and tokens 0, 15496, 50256" "$vocabulary" \
  "20240328 2 50257 50256 50257 True"$'\n'"b'!' b'Hello' b'<|endoftext|>'"
check_error "write_tokenizer without --output" "--output FILE is required" build/write_tokenizer

# --- tiny shakespeare: a file of the wrong size, the user's own (--input) or one downloaded
# earlier into the output directory; only the downloaded one is the script's to delete.
printf 'not tiny shakespeare' > "$SCRATCH/wrong_input.txt"
check_error "tinyshakespeare.sh --input of the wrong size" \
  "error: --input $SCRATCH/wrong_input.txt has 20 bytes, tiny shakespeare's input.txt has 1115394: pass that file, or leave out --input to download it" \
  dev/data/tinyshakespeare.sh --input "$SCRATCH/wrong_input.txt" --output_dir "$SCRATCH/ts_given"
check "tinyshakespeare.sh prints its error on stderr, nothing on stdout" \
  "$(dev/data/tinyshakespeare.sh --input "$SCRATCH/wrong_input.txt" --output_dir "$SCRATCH/ts_given" \
     2>/dev/null)" ""
mkdir -p "$SCRATCH/ts_downloaded"
cp "$SCRATCH/wrong_input.txt" "$SCRATCH/ts_downloaded/input.txt"
check_error "tinyshakespeare.sh with a bad download from an earlier run" \
  "error: $SCRATCH/ts_downloaded/input.txt (downloaded earlier) has 20 bytes, tiny shakespeare has 1115394: delete it and run this script again" \
  dev/data/tinyshakespeare.sh --output_dir "$SCRATCH/ts_downloaded"

# --- tiny shakespeare offline: curl and wget log their calls and fail as without a network.
OFFLINE_BIN=$PWD/$SCRATCH/offline_bin  # absolute: the script changes directory
mkdir -p "$OFFLINE_BIN"
for tool in curl wget; do
  printf '#!/bin/sh\necho "%s $*" >> "%s/calls"\nexit 7\n' "$tool" "$OFFLINE_BIN" > "$OFFLINE_BIN/$tool"
  chmod +x "$OFFLINE_BIN/$tool"
done
offline() {  # offline DIR: tinyshakespeare.sh as the README runs it, into DIR; stderr in DIR.err
  : > "$OFFLINE_BIN/calls"
  PATH="$OFFLINE_BIN:$PATH" dev/data/tinyshakespeare.sh --output_dir "$1" 2> "$1.err"
}
mkdir -p "$SCRATCH/ts_nothing"
offline "$SCRATCH/ts_nothing" > /dev/null
check "offline, an empty folder: exit 1" "$?" 1
check "offline, an empty folder: one error line naming the missing input.txt and --input" \
  "$(cat "$SCRATCH/ts_nothing.err")" \
  "error: $SCRATCH/ts_nothing/input.txt is missing and downloading it from https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt failed: check the network, or pass --input path/to/input.txt"
check "offline, an empty folder: one download tried, no file left" \
  "$(cut -d' ' -f1 "$OFFLINE_BIN/calls") $(ls "$SCRATCH/ts_nothing" | wc -l)" "curl 0"

# --- tiny shakespeare as llm.c prepares it
if [ -n "${TINYSHAKESPEARE:-}" ]; then
  dev/data/tinyshakespeare.sh --input "$TINYSHAKESPEARE" --output_dir "$SCRATCH/tinyshakespeare" \
    > /dev/null
  shards="$SCRATCH/tinyshakespeare"
  check "tiny shakespeare val: llm.c's 32768 tokens" \
    "$(shard_names "$shards" tiny_shakespeare_val)" "tiny_shakespeare_val_000000.bin 32768"
  check "tiny shakespeare val starts with EOT and the text's first words" \
    "$(shard_tokens "$shards" tiny_shakespeare_val | cut -d' ' -f1-5)" "$EOT 5962 22307 25 198"
  check "tiny shakespeare train: llm.c's 305260 tokens" \
    "$(shard_names "$shards" tiny_shakespeare_train)" "tiny_shakespeare_train_000000.bin 305260"
  check "tiny shakespeare: the vocabulary file is written beside the shards" \
    "$(cmp -s "$shards/gpt2_tokenizer.bin" "$SCRATCH/gpt2_tokenizer.bin" && echo same)" same
  sums_before=$(cd "$shards" && sha256sum *.bin)
  check "tinyshakespeare.sh run again keeps the shards it wrote" \
    "$(dev/data/tinyshakespeare.sh --input "$TINYSHAKESPEARE" --output_dir "$shards" | head -n1)" \
    "$shards already holds tiny shakespeare's shards and tokenizer: kept (delete them to prepare them again)"
  check "tinyshakespeare.sh run again leaves its files byte for byte" \
    "$(cd "$shards" && sha256sum *.bin)" "$sums_before"

  # Offline with the outputs and without input.txt: kept, nothing downloaded or built.
  mkdir -p "$SCRATCH/ts_outputs"
  cp "$shards"/*.bin "$SCRATCH/ts_outputs"
  out=$(offline "$SCRATCH/ts_outputs")
  check "offline, the outputs there: exit 0, kept" "$? $out" \
    "0 $SCRATCH/ts_outputs already holds tiny shakespeare's shards and tokenizer: kept (delete them to prepare them again)"
  check "offline, the outputs there: no download tried, nothing on stderr" \
    "$(cat "$OFFLINE_BIN/calls" "$SCRATCH/ts_outputs.err")" ""
  # Offline with the shards alone (the tokenizer needs no text), then with input.txt alone: each
  # ends with the files --input gives, downloading nothing.
  mkdir -p "$SCRATCH/ts_shards" "$SCRATCH/ts_input"
  cp "$shards"/tiny_shakespeare_*.bin "$SCRATCH/ts_shards"
  cp "$TINYSHAKESPEARE" "$SCRATCH/ts_input/input.txt"
  for situation in shards input; do
    folder=$SCRATCH/ts_$situation
    offline "$folder" > /dev/null
    check "offline, the $situation alone: exit 0" "$?" 0
    check "offline, the $situation alone: no download tried, nothing on stderr" \
      "$(cat "$OFFLINE_BIN/calls" "$folder.err")" ""
    check "offline, the $situation alone: the files of --input" "$(cd "$folder" && sha256sum *.bin)" \
      "$sums_before"
  done
else
  echo "skipped tiny shakespeare: TINYSHAKESPEARE is not set (the path of its input.txt)"
fi

finish test_data_tools
