#!/usr/bin/env bash
# Tests how the Makefile builds: a plain make runs one job per core and a -j from the user wins;
# each target prints "building NAME" and "built NAME (N s)" and nothing of its command unless V=1;
# a failing compile shows its messages and fails make. The compiler is a stand-in script (CXX=...)
# that logs when it starts and ends, so the test takes seconds; its targets go to a scratch BUILD,
# build/test_tmp/makefile.
#
#   bash dev/test/test_makefile.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source "$(dirname "$0")/lib.sh"

DIR=build/test_tmp/makefile
rm -rf "$DIR"
mkdir -p "$DIR"
DIR=$(realpath "$DIR")
LOG=$DIR/compiler.log
# The stand-in compiler: "start NAME" and "end NAME" in LOG, half a second between them; with FAIL=1 it
# fails with two lines on stderr.
cat > "$DIR/cxx" <<'EOF'
#!/usr/bin/env bash
out=${*: -1}
name=$(basename "$out")
echo "start $name" >> "$LOG"
sleep 0.5
echo "end $name" >> "$LOG"
if [ "${FAIL:-0}" = 1 ]; then
  printf 'bad.cpp:1:1: error: no good\n1 error generated.\n' >&2
  exit 1
fi
touch "$out"
EOF
chmod +x "$DIR/cxx"
export LOG

# build [MAKE ARGS...]: builds DIR/test_flags and DIR/test_json afresh with the stand-in compiler
# and the caller's MAKEFLAGS cleared (as from a shell); make's output in $out, its status in
# $status, the compiler's starts and ends in order in $order.
build() {
  rm -f "$DIR/test_flags" "$DIR/test_json" "$LOG"
  out=$(MAKEFLAGS= make "$@" BUILD="$DIR" CXX="$DIR/cxx" "$DIR/test_flags" "$DIR/test_json" 2>&1)
  status=$?
  order=$(cut -d' ' -f1 "$LOG" 2>/dev/null | xargs)
}

cores=$(nproc)
check "plain make: -j$cores (one job per core) in MAKEFLAGS" \
  "$(MAKEFLAGS= make -n -p BUILD="$DIR" 2>/dev/null | grep -o '^MAKEFLAGS = .*' | grep -oE -- ' -j[0-9]*')" " -j$cores"
check "make -j1: -j1 kept" \
  "$(MAKEFLAGS= make -j1 -n -p BUILD="$DIR" 2>/dev/null | grep -o '^MAKEFLAGS = .*' | grep -oE -- ' -j[0-9]*')" " -j1"

build
echo "$out" | sed 's/^/     | /'
check "plain make: exit status" "$status" 0
if [ "$cores" -ge 2 ]; then
  check "plain make on $cores cores: the two compiles overlap" "$order" "start start end end"
else
  echo "skip the overlap check: one core"
fi
check "one line as each target starts and one as it ends, with its time" \
  "$(grep -cE "^building $DIR/test_(flags|json)$" <<< "$out"):$(grep -cE "^built $DIR/test_(flags|json) \([0-9]+ s\)$" <<< "$out")" "2:2"
check "... and no compiler command" "$(grep -c "$DIR/cxx" <<< "$out")" 0

build -j1
check "make -j1: exit status" "$status" 0
check "make -j1: one compile after the other" "$order" "start end start end"
rm -f "$DIR/test_flags" "$DIR/test_json" "$LOG"
MAKEFLAGS=-j1 make BUILD="$DIR" CXX="$DIR/cxx" "$DIR/test_flags" "$DIR/test_json" > /dev/null 2>&1
check "MAKEFLAGS=-j1 in the environment: one compile after the other" "$(cut -d' ' -f1 "$LOG" | xargs)" \
  "start end start end"

# Under a parent make's jobserver (make -j2 calling $(MAKE)): its jobs are shared, not reset.
rm -f "$DIR/test_flags" "$DIR/test_json" "$LOG"
out=$(MAKEFLAGS= make -j2 -f <(printf 'all:\n\t+$(MAKE) BUILD=%s CXX=%s %s %s\n' "$DIR" "$DIR/cxx" \
  "$DIR/test_flags" "$DIR/test_json") 2>&1)
check "under a parent make -j2: exit status, no jobserver warning" "$?:$(grep -c warning <<< "$out")" "0:0"
check "... the two compiles overlap" "$(cut -d' ' -f1 "$LOG" | xargs)" "start start end end"

build V=1
check "V=1: the compiler commands shown" "$(grep -c "^$DIR/cxx .* -o $DIR/test_" <<< "$out")" 2
build -s
check "make -s: no building/built lines" "$status:$out" "0:"

# A failing compile: a line naming it, then its messages in full; make's status 2, no target file.
rm -f "$DIR/test_flags" "$LOG"
out=$(FAIL=1 MAKEFLAGS= make BUILD="$DIR" CXX="$DIR/cxx" "$DIR/test_flags" 2>&1)
status=$?
echo "$out" | sed 's/^/     | /'
check "a failing compile fails make (exit status 2)" "$status" 2
check "... a line naming the target, then its messages in full" \
  "$(grep -A2 -E "^failed $DIR/test_flags \([0-9]+ s\):$" <<< "$out" | tail -n +2)" \
  "$(printf 'bad.cpp:1:1: error: no good\n1 error generated.')"
check "... no target file left" "$([ -e "$DIR/test_flags" ] && echo present || echo absent)" absent

# The CUDA builds: train_gpt2.cu compiled once a program, the kernel tests one program a precision
# and the benchmarks one program; every suite and benchmark of dev/cuda in the program that runs
# them (a file left out would not run): its #include, and its row by name.
check "make -n cuda: one compile a program" \
  "$(MAKEFLAGS= make -n -B cuda BUILD=build 2>/dev/null | grep -oE '"building [^"]+"' | tr -d '"' | xargs)" \
  "building train_gpt2cu building test_gpt2cu building profile_gpt2cu building train_gpt2fp32cu building test_gpt2fp32cu building build/test_kernels building build/test_kernels_fp32 building build/test_attention_mma_sync building build/bench_kernels"
unlisted=()
for source in dev/cuda/test_*.cu dev/cuda/bench_*.cu; do
  name=$(basename "$source" .cu)
  kind=${name%%_*}
  name=${name#*_}
  [ "$name" = kernels ] && continue
  program=dev/cuda/${kind}_kernels.cu
  namespace=${name}_$([ "$kind" = test ] && echo tests || echo bench)
  grep -qF "#include \"$source\"" "$program" && grep -qF "{\"$name\", $namespace::run" "$program" ||
    unlisted+=("$source")
done
check "every dev/cuda/test_*.cu and bench_*.cu included and named by test_kernels.cu or bench_kernels.cu" \
  "${unlisted[*]}" ""

finish test_makefile
