#!/usr/bin/env bash
# Tests build/shard_tree on a small made-up tree of Python files: the val split holds exactly the
# files of the --val_dirs folders and train all others, each file is EOT + its tokens, in path
# order; empty, binary and non-UTF-8 files, symbolic links and (with --min_tokens) short files are
# skipped; the bytes are the same across runs and thread counts; and every error is one line that
# leaves nothing behind. Expected tokens come from build/encode_text, file by file. Scratch files go
# to build/scratch/test_shard_tree.
#
#   bash dev/test/test_shard_tree.sh        (MAKE=... to use another make command)
set -uo pipefail
cd "$(dirname "$0")/../.."

# MAKEFLAGS cleared: under `make test` the caller's jobserver is not open to this make.
MAKEFLAGS= ${MAKE:-make} -s build/shard_tree build/encode_text || exit 1
SCRATCH=build/scratch/test_shard_tree
rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"
EOT=50256

source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/data_tools_lib.sh"

# The tree: train packages alpha and zeta and a top-level module, val packages beta and gamma
# (also a file named like a val folder at the top: betamax.py, train), files that do not match
# the glob, files to skip, a link, and 40 generated modules so that threads share the work.
root="$SCRATCH/site-packages"
python3 - "$root" <<'PY'
import os, sys
root = sys.argv[1]
def put(path, data):
    os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
    open(os.path.join(root, path), "wb").write(data.encode() if isinstance(data, str) else data)
put("alpha/__init__.py", "from .core import run\n")
put("alpha/core.py", "def run(x):\n    return x * 2  # caf\u00e9 \U0001F600\n")
put("alpha/Zed.py", "class Zed:\n\tpass\n")
put("alpha/sub/deep.py", "import os\n\n\nprint(os.sep)\n")
put("alpha/README.txt", "not python\n")
for i in range(40):
    put(f"alpha/gen/mod_{i:02d}.py", f"VALUE_{i} = {i * 7}\n" + "    x = 1\n" * (i % 5))
put("beta/__init__.py", "")
put("beta/b.py", "# beta\nimport alpha\n")
put("beta/deep/er.py", "s = '''<|endoftext|>'''\n")
put("gamma/g.py", "print('\u4e2d\u6587')\n")
put("gamma/binary.py", b"\x00\x01\x02abc")
put("gamma/latin1.py", b"# caf\xe9\n")
put("zeta/z.py", "z = None\n")
put("top.py", "TOP = True\n")
put("betamax.py", "TAPE = 1\n")
put("only_text/notes.txt", "text\n")
os.makedirs(os.path.join(root, "nothing"))
os.symlink("alpha/core.py", os.path.join(root, "link.py"))
os.symlink("alpha", os.path.join(root, "alpha_link"))
PY

# The expected stream of a split: EOT + the tokens of each file, in the byte order of the paths.
expected_tokens() {
  local path stream=""
  for path in "$@"; do
    stream+=" $EOT $(build/encode_text "$root/$path" 2>/dev/null)"
  done
  echo "${stream# }"
}
val_files=(beta/b.py beta/deep/er.py gamma/g.py)
train_files=(alpha/Zed.py alpha/__init__.py alpha/core.py)
for i in $(seq -w 0 39); do train_files+=("alpha/gen/mod_$i.py"); done
train_files+=(alpha/sub/deep.py betamax.py top.py zeta/z.py)

shard() {  # shard OUTPUT_DIR [FLAG VALUE ...]
  local out=$1
  shift
  build/shard_tree --root "$root" --glob '*.py' --val_dirs beta,gamma --output_dir "$out" \
    --name py --shard_size 100 "$@"
}
out="$SCRATCH/out1"
OMP_NUM_THREADS=1 shard "$out" > "$SCRATCH/out1.log"
check "val: EOT + the tokens of the files of beta and gamma, in path order" \
  "$(shard_tokens "$out" py_val)" "$(expected_tokens "${val_files[@]}")"
check "train: EOT + the tokens of every other file, in path order" \
  "$(shard_tokens "$out" py_train)" "$(expected_tokens "${train_files[@]}")"
read -r -a train <<< "$(expected_tokens "${train_files[@]}")"
expected_names=""
for ((i = 0; i * 100 < ${#train[@]}; i++)); do
  n=$(( ${#train[@]} - i * 100 < 100 ? ${#train[@]} - i * 100 : 100 ))
  expected_names+="$(printf 'py_train_%06d.bin %d' "$i" "$n")"$'\n'
done
check "train shards of 100 tokens, the last one shorter (${#train[@]} tokens)" \
  "$(shard_names "$out" py_train)"$'\n' "$expected_names"
read -r -a val <<< "$(expected_tokens "${val_files[@]}")"
check "it prints the counts" "$(tail -n 3 "$SCRATCH/out1.log")" \
  "val:   3 files (beta,gamma): ${#val[@]} tokens in 1 shards
train: 47 files: ${#train[@]} tokens in $(( (${#train[@]} + 99) / 100 )) shards
skipped: 1 empty files, 2 not UTF-8 text (the first: $root/gamma/binary.py), 0 under 0 tokens"
check "no other files are written" "$(ls "$out" | grep -vc '^py_\(val\|train\)_[0-9]\{6\}\.bin$')" 0

# --min_tokens: the files of fewer tokens than it (EOT not counted) are left out and counted.
min_tokens=7
at_least_min() {  # the files of at least min_tokens tokens
  local path
  for path in "$@"; do
    [ "$(build/encode_text "$root/$path" 2>/dev/null | wc -w)" -ge "$min_tokens" ] && echo "$path"
  done
}
mapfile -t long_val < <(at_least_min "${val_files[@]}")
mapfile -t long_train < <(at_least_min "${train_files[@]}")
short=$(( ${#val_files[@]} + ${#train_files[@]} - ${#long_val[@]} - ${#long_train[@]} ))
shard "$SCRATCH/long" --min_tokens "$min_tokens" > "$SCRATCH/long.log"
check "--min_tokens $min_tokens: val holds its ${#long_val[@]} of ${#val_files[@]} files" \
  "$(shard_tokens "$SCRATCH/long" py_val)" "$(expected_tokens "${long_val[@]}")"
check "--min_tokens $min_tokens: train holds its ${#long_train[@]} of ${#train_files[@]} files" \
  "$(shard_tokens "$SCRATCH/long" py_train)" "$(expected_tokens "${long_train[@]}")"
check "--min_tokens $min_tokens: the short files counted" "$(tail -n 1 "$SCRATCH/long.log")" \
  "skipped: 1 empty files, 2 not UTF-8 text (the first: $root/gamma/binary.py), $short under 7 tokens"

OMP_NUM_THREADS=2 shard "$SCRATCH/out2" > /dev/null
shard "$SCRATCH/out3" --threads 3 > /dev/null
OMP_NUM_THREADS=1 shard "$SCRATCH/out4" > /dev/null
for other in out2 out3 out4; do
  check "$other: the same bytes as out1 ($(ls "$out" | wc -l) shards; 1, 2 and 3 threads)" \
    "$(cd "$SCRATCH/$other" && sha256sum *)" "$(cd "$out" && sha256sum *)"
done

# --- errors: one line each, and no file left in --output_dir
err="$SCRATCH/errors"
check_error "a root with no matching file" \
  "error: --root $root/only_text holds no file matching --glob '*.py': check the folder and the pattern" \
  build/shard_tree --root "$root/only_text" --glob '*.py' --val_dirs x --output_dir "$err" --name e
check_error "a --val_dirs folder that does not exist" \
  "error: --val_dirs delta: $root/delta is not a folder: name top-level folders of --root" \
  shard "$err" --val_dirs beta,delta
check_error "a --val_dirs folder without a matching file" \
  "error: --val_dirs nothing: $root/nothing holds no file matching --glob '*.py'" \
  shard "$err" --val_dirs nothing
check_error "a --val_dirs file, not a folder" "error: --val_dirs top.py: $root/top.py is not a folder" \
  shard "$err" --val_dirs top.py
check_error "a --val_dirs path below the top level" \
  "error: --val_dirs 'alpha/sub': each name must be one top-level folder" \
  shard "$err" --val_dirs alpha/sub
check_error "no --val_dirs" "error: --val_dirs is required" \
  build/shard_tree --root "$root" --output_dir "$err" --name e
check_error "val folders whose files are all skipped" "error: the --val_dirs folders hold no text" \
  shard "$err" --val_dirs gamma --glob '*1.py'
check_error "every file held out" "error: no text is left to train on" \
  build/shard_tree --root "$root/alpha" --val_dirs gen --glob 'mod_*.py' --output_dir "$err" --name e
check_error "a missing --root" "error: --root $SCRATCH/none is not a directory" \
  build/shard_tree --root "$SCRATCH/none" --val_dirs a --output_dir "$err" --name e
check_error "--threads 0" "--threads 0: must be within [1, 4096]" shard "$err" --threads 0
check_error "--min_tokens -1" "error: --min_tokens -1: must be at least 0" shard "$err" --min_tokens -1
check_error "val files all under --min_tokens" "error: the --val_dirs folders hold no text" \
  shard "$err" --min_tokens 1000
check "failed runs leave nothing in --output_dir" "$(ls -A "$err" 2>/dev/null | wc -l)" 0
sums_before=$(cd "$out" && sha256sum *)
check_error "an --output_dir that holds shards" \
  "error: $out already holds shards ($out/py_train_000000.bin): delete them, or use another --output_dir or --name" \
  shard "$out"
check "the refused run leaves the shards byte for byte" "$(cd "$out" && sha256sum *)" "$sums_before"

finish test_shard_tree
