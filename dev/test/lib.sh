# Shared by the shell tests (source it): `check DESCRIPTION GOT EXPECTED` counts and prints one
# comparison; `finish NAME` prints "NAME: N passed, M failed" and exits with the status.
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
