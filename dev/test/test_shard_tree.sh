#!/usr/bin/env bash
# Tests build/shard_tree on a small made-up tree of Python files: the val split holds exactly the
# files of the --val_dirs folders and train all others, each file is EOT + its tokens, in path
# order; empty, binary and non-UTF-8 files, symbolic links and (with --min_tokens) short files are
# skipped; the bytes are the same across runs and thread counts; and every error is one line that
# leaves nothing behind. Expected tokens come from build/encode_text, file by file. The flags that
# make a mixture are checked against a Python model of the tool written from its header comment
# (tokens from build/encode_text too): --max_tokens's documents and left-out tails, two roots (a
# second tree with a val folder of its own) in the order given, --shuffle's order (the same
# documents, in the order train_gpt2.py's MT19937 permutation(n) gives the seed, whatever the
# threads), and their bad values. Scratch files go to build/scratch/test_shard_tree.
#
#   bash dev/test/test_shard_tree.sh        (MAKE=... to use another make command, PYTHON=... to
#                                            pick the python with torch that imports train_gpt2)
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
require_python "torch numpy" test_shard_tree PYTHON

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

# --- the mixture's flags against a model: `model FLAG VALUE ...` takes shard_tree's flags (those
# of shard() first, then the ones given) and prints "val tokens: ...", "train tokens: ..." and
# the three count lines that shard_tree should print. A second tree for it: beta, a val folder in
# both roots; delta, a val folder of its own; a file long enough to cut, an empty one, a folder
# without Python.
root2="$SCRATCH/share"
python3 - "$root2" <<'PY'
import os, sys
root = sys.argv[1]
def put(path, data):
    os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
    open(os.path.join(root, path), "w").write(data)
put("beta/extra.py", "EXTRA = 'beta of the second root'\n")
put("delta/d.py", "import sys\nsys.exit(0)\n")
put("delta/long.py", "def long_function(alpha, beta, gamma):\n    return alpha + beta * gamma\n")
put("omega/o.py", "for i in range(3):\n    print(i, i * i, i ** 3)\n")
put("omega/empty.py", "")
put("nothing/readme.txt", "no python here\n")
put("top2.py", "SECOND = 2\n")
PY
model() {
  PYTHONPATH=. "$PY" - "$SCRATCH/tokens.json" "$EOT" --root "$root" --glob '*.py' \
    --val_dirs beta,gamma --shard_size 100 "$@" <<'PY'
import argparse, fnmatch, json, os, subprocess, sys
import train_gpt2 as tg
cache_path, eot = sys.argv[1], int(sys.argv[2])
parser = argparse.ArgumentParser()
for flag in ["--root", "--glob", "--val_dirs", "--threads"]:
    parser.add_argument(flag)
for flag in ["--shard_size", "--min_tokens", "--max_tokens"]:
    parser.add_argument(flag, type=int, default=0)
parser.add_argument("--shuffle", type=int)
args = parser.parse_args(sys.argv[3:])
roots, val_dirs = args.root.split(","), args.val_dirs.split(",")
cache = json.load(open(cache_path)) if os.path.exists(cache_path) else {}

def listing(root, folder=""):  # regular files matching the glob; links are not followed
    for entry in os.scandir(os.path.join(root, folder)):
        path = folder + entry.name
        if entry.is_dir(follow_symlinks=False):
            yield from listing(root, path + "/")
        elif entry.is_file(follow_symlinks=False) and fnmatch.fnmatchcase(entry.name, args.glob):
            yield path

files = [(root, path) for root in roots for path in sorted(listing(root), key=str.encode)]
if args.shuffle is not None:  # the i-th file is the listing's perm[i], as the trainer's shards
    files = [files[i] for i in tg.MT19937(args.shuffle).permutation(len(files))]
stream = {"val": [], "train": []}
count = {"val": [0, 0], "train": [0, 0]}  # files, documents
empty = not_text = short = tails = 0
first_not_text = ""
for root, path in files:
    full = f"{root}/{path}"
    data = open(full, "rb").read()
    if not data:
        empty += 1
        continue
    try:
        text = data.decode("utf-8") and b"\0" not in data
    except UnicodeDecodeError:
        text = False
    if not text:
        not_text += 1
        first_not_text = first_not_text or full
        continue
    if full not in cache:
        out = subprocess.run(["build/encode_text", full], capture_output=True, text=True)
        cache[full] = [int(t) for t in out.stdout.split()]
    ids = cache[full]
    size = args.max_tokens or len(ids)
    pieces = [ids[k:k + size] for k in range(0, len(ids), size)]
    kept = [piece for piece in pieces if len(piece) >= args.min_tokens]
    if not kept:
        short += 1
        continue
    tails += len(pieces) - len(kept)
    split = "val" if "/" in path and path.split("/")[0] in val_dirs else "train"
    for piece in kept:
        stream[split] += [eot] + piece
    count[split][0] += 1
    count[split][1] += len(kept)
json.dump(cache, open(cache_path, "w"))
print("val tokens:", *stream["val"])
print("train tokens:", *stream["train"])
cut = args.max_tokens > 0
def after_cut(split):
    return f"{count[split][1]} documents after --max_tokens {args.max_tokens}"
def totals(split):
    n = len(stream[split])
    return f"{n} tokens in {(n + args.shard_size - 1) // args.shard_size} shards"
val_about = args.val_dirs + ("; " + after_cut("val") if cut else "")
print(f"val:   {count['val'][0]} files ({val_about}): {totals('val')}")
print(f"train: {count['train'][0]} files" + (f" ({after_cut('train')})" if cut else "")
      + f": {totals('train')}")
print(f"skipped: {empty} empty files, {not_text} not UTF-8 text"
      + (f" (the first: {first_not_text})" if not_text else "")
      + f", {short} under {args.min_tokens} tokens"
      + (f", {tails} tails of cut files under {args.min_tokens} tokens" if cut else ""))
PY
}
# check_model NAME WHAT FLAG VALUE ...: shard_tree with the flags into $SCRATCH/NAME, its two
# splits and count lines against the model's.
check_model() {
  local name=$1 what=$2 split
  shift 2
  shard "$SCRATCH/$name" "$@" > "$SCRATCH/$name.log"
  model "$@" > "$SCRATCH/$name.model"
  for split in val train; do
    check "$what: $split as the model's" "$(shard_tokens "$SCRATCH/$name" "py_$split")" \
      "$(sed -n "s/^$split tokens: //p" "$SCRATCH/$name.model")"
  done
  check "$what: the count lines" "$(tail -n 3 "$SCRATCH/$name.log")" \
    "$(tail -n 3 "$SCRATCH/$name.model")"
}
# documents DIR PREFIX: the documents of the shards, one a line (each EOT first), in order.
documents() {
  shard_tokens "$1" "$2" | tr ' ' '\n' |
    awk -v eot="$EOT" '$1 == eot && doc != "" { print doc; doc = "" } { doc = doc $1 " " }
                       END { print doc }'
}

check "the model without the new flags: out1's shards" \
  "$(model | sed -n 's/^\(val\|train\) tokens: //p')" \
  "$(shard_tokens "$out" py_val)"$'\n'"$(shard_tokens "$out" py_train)"
check_model cut10 "--max_tokens 10 --min_tokens 5" --max_tokens 10 --min_tokens 5
check "--max_tokens 10 --min_tokens 5 cuts files, leaves out tails and short files in this tree" \
  "$(tail -n 3 "$SCRATCH/cut10.log" | grep -c \
      ' documents after\|, [1-9][0-9]* under 5 tokens, [1-9][0-9]* tails')" 3
check_model cut7 "--max_tokens 7" --max_tokens 7
read -r -a mod_04 <<< "$(build/encode_text "$root/alpha/gen/mod_04.py" 2>/dev/null)"
pieces=""
for ((k = 0; k < ${#mod_04[@]}; k += 7)); do pieces+="$EOT ${mod_04[*]:k:7} "$'\n'; done
check "--max_tokens 7: alpha/gen/mod_04.py's ${#mod_04[@]} tokens are documents of 7 and the rest" \
  "$(documents "$SCRATCH/cut7" py_train |
     grep -x -F -A $(( $(wc -l <<< "$pieces") - 2 )) "${pieces%%$'\n'*}")"$'\n' "$pieces"
shard "$SCRATCH/uncut" --max_tokens 100000 > /dev/null
check "--max_tokens above every file: out1's bytes" "$(cd "$SCRATCH/uncut" && sha256sum *)" \
  "$(cd "$out" && sha256sum *)"

# Two roots: root by root, in the order given; a val folder of either root is val.
val2=(beta/extra.py delta/d.py delta/long.py)
train2=(omega/o.py top2.py)
check_model two "two roots" --root "$root,$root2" --val_dirs beta,gamma,delta
check "two roots: val is the first root's, then the second's" \
  "$(shard_tokens "$SCRATCH/two" py_val)" \
  "$(shard_tokens "$out" py_val) $(root=$root2 expected_tokens "${val2[@]}")"
check "two roots: train is the first root's, then the second's" \
  "$(shard_tokens "$SCRATCH/two" py_train)" \
  "$(shard_tokens "$out" py_train) $(root=$root2 expected_tokens "${train2[@]}")"
shard "$SCRATCH/two_swapped" --root "$root2,$root" --val_dirs beta,gamma,delta > /dev/null
check "two roots given the other way round: the second's train first" \
  "$(shard_tokens "$SCRATCH/two_swapped" py_train)" \
  "$(root=$root2 expected_tokens "${train2[@]}") $(shard_tokens "$out" py_train)"
check_model two_cut "two roots, --max_tokens 8 --min_tokens 3" --root "$root,$root2" \
  --val_dirs beta,gamma,delta --max_tokens 8 --min_tokens 3

# --shuffle: the files in the seed's order, their documents unchanged.
check_model shuffle1 "--shuffle 1" --shuffle 1
for split in val train; do
  check "--shuffle 1: the documents of $split are out1's" \
    "$(documents "$SCRATCH/shuffle1" "py_$split" | sort)" "$(documents "$out" "py_$split" | sort)"
done
check "--shuffle 1: train is not in path order" \
  "$(documents "$SCRATCH/shuffle1" py_train | cmp -s - <(documents "$out" py_train); echo $?)" 1
shard "$SCRATCH/shuffle1_again" --shuffle 1 --threads 1 > /dev/null
shard "$SCRATCH/shuffle1_threads" --shuffle 1 --threads 3 > /dev/null
for other in shuffle1_again shuffle1_threads; do
  check "--shuffle 1: $other has the same bytes (--threads 1, 3 and the default)" \
    "$(cd "$SCRATCH/$other" && sha256sum *)" "$(cd "$SCRATCH/shuffle1" && sha256sum *)"
done
shard "$SCRATCH/shuffle2" --shuffle 2 > /dev/null
check "--shuffle 2: another order of train than --shuffle 1" \
  "$(cmp -s "$SCRATCH/shuffle2/py_train_000000.bin" "$SCRATCH/shuffle1/py_train_000000.bin"; echo $?)" 1
check_model shuffle_max "--shuffle 4294967295 (2^32 - 1, the largest seed)" --shuffle 4294967295
check_model shuffle_two_cut "two roots, --shuffle 5 --max_tokens 8 --min_tokens 3" \
  --root "$root,$root2" --val_dirs beta,gamma,delta --shuffle 5 --max_tokens 8 --min_tokens 3
check "two roots, --shuffle 5 --max_tokens 8: the documents of the unshuffled run" \
  "$(documents "$SCRATCH/shuffle_two_cut" py_train | sort)" \
  "$(documents "$SCRATCH/two_cut" py_train | sort)"

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
# check_error_line DESCRIPTION MESSAGE COMMAND...: the command fails with MESSAGE, one line.
check_error_line() {
  local description=$1 message=$2 output
  shift 2
  if output=$("$@" 2>&1); then
    check "$description fails" "exit 0: $output" "a non-zero exit"
  else
    check "$description fails with one line" "$output" "$message"
  fi
}
for value in 0 -3; do
  check_error_line "--max_tokens $value" "error: --max_tokens $value: must be at least 1" \
    shard "$err" --max_tokens "$value"
done
check_error_line "--max_tokens under --min_tokens" "error: --max_tokens 4 is under --min_tokens 7: \
every document would be left out; give --max_tokens at least 7" \
  shard "$err" --min_tokens 7 --max_tokens 4
for value in -1 4294967296; do  # under the least seed, one past the largest (2^32: no seed is cut)
  check_error_line "--shuffle $value" "error: --shuffle $value: must be within [0, 4294967295]" \
    shard "$err" --shuffle "$value"
done
for value in abc '' 1e3; do
  check_error_line "--shuffle '$value'" "error: --shuffle '$value': not an integer" \
    shard "$err" --shuffle "$value"
done
for roots in "$root," ",$root" "$root,,$root2"; do
  check_error_line "--root '$roots'" "error: --root '$roots': an empty folder name; give folders \
apart by single commas" shard "$err" --root "$roots"
done
check_error_line "a missing second --root" \
  "error: --root $SCRATCH/none is not a directory: give the folder of the text files" \
  shard "$err" --root "$root,$SCRATCH/none"
check_error_line "a second --root without a matching file" "error: --root $root2/nothing holds \
no file matching --glob '*.py': check the folder and the pattern" \
  shard "$err" --root "$root,$root2/nothing"
for roots in "$root,$root/alpha" "$root/alpha/sub,$root" "$root2,$root2/" "$root,$root/alpha/.."; do
  check_error_line "--root $roots: overlapping roots" "error: --root ${roots%%,*} and \
${roots#*,} overlap (one is or holds the other): their files would be read twice; give folders \
apart" shard "$err" --root "$roots"
done
check_error_line "a --val_dirs folder in neither root" "error: --val_dirs epsilon: none of \
$root/epsilon, $root2/epsilon is a folder: name top-level folders of --root" \
  shard "$err" --root "$root,$root2" --val_dirs beta,epsilon
check_error_line "a --val_dirs folder of two roots without a matching file" "error: --val_dirs \
nothing: none of $root/nothing, $root2/nothing holds a file matching --glob '*.py': name folders \
with text" shard "$err" --root "$root,$root2" --val_dirs nothing
check_error_line "a --val_dirs folder of one of two roots, without a matching file" \
  "error: --val_dirs only_text: $root/only_text holds no file matching --glob '*.py': name \
folders with text" shard "$err" --root "$root2,$root" --val_dirs only_text
check "failed runs leave nothing in --output_dir" "$(ls -A "$err" 2>/dev/null | wc -l)" 0
sums_before=$(cd "$out" && sha256sum *)
check_error "an --output_dir that holds shards" \
  "error: $out already holds shards ($out/py_train_000000.bin): delete them, or use another --output_dir or --name" \
  shard "$out"
check "the refused run leaves the shards byte for byte" "$(cd "$out" && sha256sum *)" "$sums_before"

finish test_shard_tree
