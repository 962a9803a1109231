# Shared by the shell tests (source it): `check DESCRIPTION GOT EXPECTED` counts and prints one
# comparison; `finish NAME` prints "NAME: N passed, M failed" and exits with the status;
# `python_with MODULE [PYTHON]` prints the first of PYTHON, python3 and /usr/bin/python3 that
# imports MODULE (nothing when none does).
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

finish() {
  echo "$1: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
}

python_with() {
  local candidate
  for candidate in ${2:-} python3 /usr/bin/python3; do
    if "$candidate" -c "import $1" 2>/dev/null; then
      echo "$candidate"
      return
    fi
  done
}
