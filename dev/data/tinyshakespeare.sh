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
# Without --input the text is downloaded (curl or wget) into DIR/input.txt, once. The tools are
# built with make (MAKE=... to use another make command).
set -euo pipefail
cd "$(dirname "$0")/../.."

URL=https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt
EXPECTED_BYTES=1115394
VAL_TOKENS=32768

# Errors go to stderr, as one line: "error: what, and the fix".
fail() {
  echo "error: $*" >&2
  exit 1
}

usage() {
  echo "usage: dev/data/tinyshakespeare.sh [--input FILE] [--output_dir DIR]"
  echo "  --input FILE      a local copy of tiny shakespeare's input.txt (default: download it)"
  echo "  --output_dir DIR  where the shards go (default dev/data/tinyshakespeare)"
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

mkdir -p "$output_dir" || fail "cannot create --output_dir $output_dir"
given_input=$input
if [ -z "$input" ]; then
  input="$output_dir/input.txt"
  if [ ! -f "$input" ]; then
    echo "downloading $URL"
    if command -v curl >/dev/null; then
      download=(curl -fsSL -o "$input.part" "$URL")
    elif command -v wget >/dev/null; then
      download=(wget -q -O "$input.part" "$URL")
    else
      fail "neither curl nor wget is installed: install one, or pass --input FILE"
    fi
    if ! "${download[@]}"; then
      rm -f "$input.part"
      fail "downloading $URL failed: check the network, or pass --input FILE"
    fi
    mv "$input.part" "$input"
  fi
fi
[ -r "$input" ] || fail "cannot read --input $input"
bytes=$(wc -c < "$input")
if [ "$bytes" -ne "$EXPECTED_BYTES" ]; then
  if [ -n "$given_input" ]; then
    fail "--input $input has $bytes bytes, tiny shakespeare's input.txt has $EXPECTED_BYTES:" \
         "pass that file, or leave out --input to download it"
  fi
  fail "$input (downloaded earlier) has $bytes bytes, tiny shakespeare has $EXPECTED_BYTES:" \
       "delete it and run this script again to download it again"
fi

# MAKEFLAGS cleared: under `make test` the caller's jobserver is not open to this make.
MAKEFLAGS= ${MAKE:-make} -s build/prepare_shards build/write_tokenizer
# The shards of this one text are always the same: a second run keeps those of the first
# (prepare_shards never overwrites shards).
if [ -f "$output_dir/tiny_shakespeare_val_000000.bin" ] &&
   [ -f "$output_dir/tiny_shakespeare_train_000000.bin" ]; then
  echo "$output_dir already holds tiny shakespeare's shards: kept (delete them to prepare them again)"
else
  build/prepare_shards --input "$input" --output_dir "$output_dir" --name tiny_shakespeare \
    --documents blank_lines --val_tokens "$VAL_TOKENS"
fi
build/write_tokenizer --output "$output_dir/gpt2_tokenizer.bin"
