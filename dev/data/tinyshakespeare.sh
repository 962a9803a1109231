#!/usr/bin/env bash
# Prepares tiny shakespeare as llm.c's dev/data/tinyshakespeare.py does: the text is cut into
# documents at each blank line ("\n\n", kept with the document before it), every document is
# preceded by the EOT token, the first 32768 tokens are the val split and the rest train. Writes
#   DIR/tiny_shakespeare_val_000000.bin    (32768 tokens)
#   DIR/tiny_shakespeare_train_000000.bin  (305260 tokens)
#   DIR/gpt2_tokenizer.bin                 (the vocabulary, for decoding)
# with DIR dev/data/tinyshakespeare by default (git-ignored: the text is never committed).
#
#   dev/data/tinyshakespeare.sh [--input FILE] [--output_dir DIR]
#
# What DIR already holds complete (of the sizes above) is kept: with all three there the script
# is done without the text or the network. Without --input the text is DIR/input.txt, downloaded
# (curl or wget) when it is missing. The tools are built with make (MAKE=... to use another make
# command).
set -euo pipefail
cd "$(dirname "$0")/../.."

URL=https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt
EXPECTED_BYTES=1115394
VAL_TOKENS=32768
TRAIN_TOKENS=305260
SHARD_HEADER_BYTES=1024  # dev/SPEC.md: 256 int32s, then 2 bytes a token
TOKENIZER_BYTES=372108   # the vocabulary file of GPT-2's 50257 tokens

# Errors go to stderr, as one line: "error: what, and the fix".
fail() {
  echo "error: $*" >&2
  exit 1
}

usage() {
  echo "usage: dev/data/tinyshakespeare.sh [--input FILE] [--output_dir DIR]"
  echo "  --input FILE      a local copy of tiny shakespeare's input.txt (default: DIR/input.txt,"
  echo "                    downloaded when missing)"
  echo "  --output_dir DIR  where the shards go (default dev/data/tinyshakespeare); complete ones"
  echo "                    there are kept"
}

input=""
output_dir=dev/data/tinyshakespeare
while [ $# -gt 0 ]; do
  case "$1" in
    --input) [ $# -ge 2 ] || fail "--input needs a FILE; --help lists the flags"; input=$2; shift 2 ;;
    --output_dir) [ $# -ge 2 ] || fail "--output_dir needs a DIR; --help lists the flags"
      output_dir=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) fail "unknown argument '$1'; --help lists the flags" ;;
  esac
done

# check_input FILE: FILE must be tiny shakespeare's input.txt; the fix named depends on whose it is.
check_input() {
  [ -r "$1" ] || fail "cannot read --input $1"
  local bytes
  bytes=$(wc -c < "$1")
  [ "$bytes" -eq "$EXPECTED_BYTES" ] && return
  if [ -n "$given_input" ]; then
    fail "--input $1 has $bytes bytes, tiny shakespeare's input.txt has $EXPECTED_BYTES:" \
         "pass that file, or leave out --input to download it"
  fi
  fail "$1 (downloaded earlier) has $bytes bytes, tiny shakespeare has $EXPECTED_BYTES:" \
       "delete it and run this script again to download it again"
}

# download FILE: tiny shakespeare's text from $URL into FILE, or one error line naming FILE.
download() {
  local command
  if command -v curl >/dev/null; then
    command=(curl -fsSL -o "$1.part" "$URL")
  elif command -v wget >/dev/null; then
    command=(wget -q -O "$1.part" "$URL")
  else
    fail "$1 is missing and neither curl nor wget is installed to download it: install one," \
         "or pass --input path/to/input.txt"
  fi
  echo "downloading $URL"
  if ! "${command[@]}"; then
    rm -f "$1.part"
    fail "$1 is missing and downloading it from $URL failed: check the network," \
         "or pass --input path/to/input.txt"
  fi
  mv "$1.part" "$1"
}

has_bytes() {  # has_bytes FILE N: FILE exists and holds exactly N bytes
  [ -f "$1" ] && [ "$(wc -c < "$1")" -eq "$2" ]
}

build_tools() {
  # MAKEFLAGS cleared: under `make test` the caller's jobserver is not open to this make.
  MAKEFLAGS= ${MAKE:-make} -s "$@"
}

val="$output_dir/tiny_shakespeare_val_000000.bin"
train="$output_dir/tiny_shakespeare_train_000000.bin"
tokenizer="$output_dir/gpt2_tokenizer.bin"
given_input=$input
[ -z "$given_input" ] || check_input "$given_input"
shards_done=0
if has_bytes "$val" $((SHARD_HEADER_BYTES + 2 * VAL_TOKENS)) &&
   has_bytes "$train" $((SHARD_HEADER_BYTES + 2 * TRAIN_TOKENS)); then
  shards_done=1
fi
if [ "$shards_done" = 1 ] && has_bytes "$tokenizer" "$TOKENIZER_BYTES"; then
  echo "$output_dir already holds tiny shakespeare's shards and tokenizer: kept" \
       "(delete them to prepare them again)"
  exit 0
fi

mkdir -p "$output_dir" || fail "cannot create --output_dir $output_dir"
if [ "$shards_done" = 0 ]; then
  if [ -z "$input" ]; then
    input="$output_dir/input.txt"
    [ -f "$input" ] || download "$input"
    check_input "$input"
  fi
  build_tools build/prepare_shards
  build/prepare_shards --input "$input" --output_dir "$output_dir" --name tiny_shakespeare \
    --documents blank_lines --val_tokens "$VAL_TOKENS"
fi
build_tools build/write_tokenizer
build/write_tokenizer --output "$tokenizer"
