# Shared by the shell tests (source it): `check DESCRIPTION GOT EXPECTED` counts and prints one
# comparison; `finish NAME` prints "NAME: N passed, M failed" and exits with the status;
# `python_with MODULES [PYTHON]` prints the first of PYTHON, python3 and /usr/bin/python3 that
# imports all of MODULES (names separated by spaces; nothing when none does);
# `require_python MODULES NAME VARIABLE` sets PY to the python_with of MODULES and of the python
# named by $VARIABLE, or ends test NAME with a failed check that says how to get one;
# `require_vocab FILE NAME` writes GPT-2's vocabulary file to FILE (build/write_tokenizer), or ends
# test NAME with a failed check that says how to build it;
# `expect_fail NAME TEXT COMMAND...` checks that COMMAND exits non-zero with one line of output, an
# "error: " line matching TEXT (a grep pattern);
# `check_verdicts WHAT STATUS OUTPUT [EXPECTED]` checks that the program WHAT ended with STATUS 0
# (else shows its OUTPUT) and that each line "what<TAB>verdict" of OUTPUT has the verdict EXPECTED
# ("same" unless given).
passed=0
failed=0

check() {
  if [ "$2" = "$3" ]; then
    passed=$((passed + 1))
    echo "ok   $1"
  else
    failed=$((failed + 1))
    echo "FAIL $1"
    echo "     got:      $2"
    echo "     expected: $3"
  fi
}

check_verdicts() {
  check "$1 runs to its end" "$2" 0
  [ "$2" -eq 0 ] || echo "$3"
  local what verdict
  while IFS=$'\t' read -r what verdict; do
    check "$what" "$verdict" "${4:-same}"
  done <<< "$(grep $'\t' <<< "$3")"
}

expect_fail() {
  local name=$1 text=$2 err rc
  shift 2
  err=$("$@" 2>&1)
  rc=$?
  check "$name: fails" "$([ "$rc" -ne 0 ] && echo yes)" yes
  check "$name: one line naming it" "$(wc -l <<< "$err") $(grep -c "^error: .*$text" <<< "$err")" "1 1"
}

finish() {
  echo "$1: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
}

require_vocab() {
  build/write_tokenizer --output "$1" > /dev/null 2>&1 && return
  check "build/write_tokenizer writes GPT-2's vocabulary file (make cpu builds it)" no yes
  finish "$2"
}

python_with() {
  local candidate
  for candidate in ${2:-} python3 /usr/bin/python3; do
    if "$candidate" -c "import ${1// /, }" 2>/dev/null; then
      echo "$candidate"
      return
    fi
  done
}

# The package named is the first module's: python3-torch brings numpy along.
require_python() {
  PY=$(python_with "$1" "${!3:-}")
  if [ -z "$PY" ]; then
    check "a python with ${1// / and } (apt-get install python3-${1%% *}, or set $3)" "none found" \
      "found"
    finish "$2"
  fi
}
