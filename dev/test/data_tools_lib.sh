# Shared by the data tools' tests (source it after lib.sh): read_shards, shard_names and
# shard_tokens read token shards with a small Python reader written from dev/SPEC.md, independent
# of the C++ code; check_error runs a command that must fail with a given message.

# read_shards DIR PREFIX prints "NAME count" per shard of DIR named PREFIX_*.bin, then
# "tokens: ..." with all their tokens in order; a shard whose header or size is wrong prints
# "bad NAME: why". shard_names and shard_tokens print only the one part or the other.
read_shards() {
  python3 - "$1" "$2" <<'PY'
import glob, os, struct, sys
directory, prefix = sys.argv[1], sys.argv[2]
tokens = []
for path in sorted(glob.glob(os.path.join(directory, prefix + "_*.bin"))):
    data = open(path, "rb").read()
    magic, version, count = struct.unpack_from("<3i", data)
    name = os.path.basename(path)
    if magic != 20240520 or version != 1 or len(data) != 1024 + 2 * count:
        print(f"bad {name}: magic {magic} version {version} count {count} size {len(data)}")
        continue
    print(name, count)
    tokens += struct.unpack_from(f"<{count}H", data, 1024)
print("tokens:", *tokens)
PY
}
shard_names() { read_shards "$1" "$2" | grep -v '^tokens:'; }
shard_tokens() { read_shards "$1" "$2" | grep '^tokens:' | cut -d' ' -f2-; }

# Runs a command that must fail; checks that its error message contains NEEDLE.
check_error() {  # check_error DESCRIPTION NEEDLE COMMAND...
  local description=$1 needle=$2
  shift 2
  local output
  if output=$("$@" 2>&1); then
    check "$description fails" "exit 0: $output" "a non-zero exit"
  elif [[ "$output" == *"$needle"* ]]; then
    check "$description fails mentioning '$needle'" yes yes
  else
    check "$description fails mentioning '$needle'" "$output" "a message with '$needle'"
  fi
}
