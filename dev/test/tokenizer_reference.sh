#!/usr/bin/env bash
# Compares our GPT-2 encoder (build/encode_text) with implementations nobody here wrote, from the
# npm registry, installed into the git-ignored build/npm on first use: the token ids with
# js-tiktoken and with tiktoken's Rust core as WebAssembly, the pre-tokenization pieces with the
# GPT-2 pattern run by JavaScript's regex engine (see tokenizer_reference.js). Inputs:
# dev/test/tokenizer_corpus.txt and the tiny shakespeare text named by TINYSHAKESPEARE (skipped
# when unset), each encoded whole and line by line. Exits non-zero on any mismatch, printing the
# first one in context.
#
#   bash dev/test/tokenizer_reference.sh        (MAKE=... to use another make command)
set -euo pipefail
cd "$(dirname "$0")/../.."

NPM_DIR=build/npm
PACKAGES=(js-tiktoken@1.0.21 tiktoken@1.0.22)
WORK=build/tokenizer_reference

for tool in node npm; do
  if ! command -v "$tool" >/dev/null; then
    echo "error: $tool is not installed (apt-get install nodejs npm)"
    exit 1
  fi
done

installed_version() {
  node -p "require('./$NPM_DIR/node_modules/$1/package.json').version" 2>/dev/null || true
}
for package in "${PACKAGES[@]}"; do
  name=${package%@*}
  version=${package##*@}
  if [ "$(installed_version "$name")" != "$version" ]; then
    echo "installing ${PACKAGES[*]} into $NPM_DIR"
    if ! npm install --prefix "$NPM_DIR" --no-audit --no-fund --loglevel=error \
        "${PACKAGES[@]}"; then
      echo "error: npm install into $NPM_DIR failed: the npm registry must be reachable"
      exit 1
    fi
    break
  fi
done

# MAKEFLAGS cleared: under `make test` the caller's jobserver is not open to this make.
MAKEFLAGS= ${MAKE:-make} -s build/encode_text
mkdir -p "$WORK"

inputs=(dev/test/tokenizer_corpus.txt)
if [ -n "${TINYSHAKESPEARE:-}" ]; then
  inputs+=("$TINYSHAKESPEARE")
else
  echo "skipped tiny shakespeare: TINYSHAKESPEARE is not set (the path of its input.txt)"
fi

passed=0
failed=0
for input in "${inputs[@]}"; do
  for output_kind in ids pieces; do
    for unit in whole lines; do
      flags=()
      [ "$output_kind" = pieces ] && flags+=(--pieces)
      [ "$unit" = lines ] && flags+=(--lines)
      output="$WORK/$(basename "$input" .txt).$output_kind.$unit"
      build/encode_text "${flags[@]}" "$input" > "$output"
      if node dev/test/tokenizer_reference.js "$NPM_DIR" "$input" "$output" "${flags[@]}"; then
        passed=$((passed + 1))
      else
        failed=$((failed + 1))
      fi
    done
  done
done
echo "tokenizer_reference: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
