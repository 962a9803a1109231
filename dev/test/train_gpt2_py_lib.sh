# Shared by the tests of train_gpt2.py (dev/test/test_train_gpt2_py.sh, test_reference_modern.sh,
# test_reference_speedrun.sh, test_document_attention_py.sh): PYTHON is the python with torch, WORK
# a scratch folder. Its check() replaces lib.sh's: these tests stop at their first failure (set -e)
# instead of counting.
source dev/test/lib.sh

# PYTHON: as given, else the first of python3, /usr/bin/python3 that has torch and numpy.
PYTHON=${PYTHON:-$(python_with "torch numpy")}
PYTHON=${PYTHON:-python3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export WORK

check() {  # check NAME: runs the python on stdin with train_gpt2 importable
  echo "--- $1"
  PYTHONPATH=. "$PYTHON" -
}

expect_error() {  # expect_error TEXT ARGS...: the script must exit non-zero with an error naming TEXT
  local text=$1
  shift
  if "$PYTHON" train_gpt2.py "$@" >"$WORK/out" 2>&1; then
    echo "FAIL: expected an error for: $*"
    exit 1
  fi
  if ! grep -q "^error: .*$text" "$WORK/out"; then
    echo "FAIL: the error for '$*' does not mention '$text':"
    cat "$WORK/out"
    exit 1
  fi
  echo "ok: $(tail -n1 "$WORK/out")"
}
