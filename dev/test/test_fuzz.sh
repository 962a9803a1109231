#!/usr/bin/env bash
# Builds the libFuzzer targets of dev/fuzz (`make fuzz`) and runs each for a bounded time, starting
# from seed files written here: small valid files of each format, written from dev/SPEC.md and the
# format comments in llmc/*.h (no binary seed is committed). Prints one line per target and ends
# with "test_fuzz: N passed, M failed". A target fails on a crash, a sanitizer report, a hang, an
# allocation over the memory limit, an exception other than llmc::Error, or a broken property that
# it checks; the input that did it is saved and named in the line. Missing clang or its fuzzer
# runtime is a failure too, naming the package to install.
#
#   bash dev/test/test_fuzz.sh     (FUZZ_SECONDS per target, default 15; FUZZ_JOBS targets at a
#                                   time, default the number of CPUs; MAKE=... for another make)
set -uo pipefail
cd "$(dirname "$0")/../.."

SCRATCH=build/scratch/test_fuzz
SECONDS_EACH=${FUZZ_SECONDS:-15}
JOBS=${FUZZ_JOBS:-$(nproc)}
rm -rf "$SCRATCH"
mkdir -p "$SCRATCH/tmp"

finish() {  # finish PASSED FAILED
  echo "test_fuzz: $1 passed, $2 failed"
  [ "$2" -eq 0 ]
  exit
}

# The fuzzer runtime is a separate package on Debian (only recommended by clang, so installs with
# --no-install-recommends lack it); name it for the clang that is there.
clang_major=$(clang++ --version 2>/dev/null |
  sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -n1)
runtime_package="libclang-rt-${clang_major:-14}-dev"
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
  > "$SCRATCH/probe.cpp"
if ! clang++ -fsanitize=fuzzer,address,undefined "$SCRATCH/probe.cpp" -o "$SCRATCH/probe" \
    > "$SCRATCH/probe.log" 2>&1; then
  if [ -z "$clang_major" ]; then
    echo "FAIL clang++ not found: install clang and $runtime_package" \
      "(apt-get install clang $runtime_package)"
  else
    echo "FAIL clang++ $clang_major cannot link -fsanitize=fuzzer: install its fuzzer runtime" \
      "(apt-get install $runtime_package)"
    sed 's/^/     /' "$SCRATCH/probe.log" | head -n 5
  fi
  finish 0 1
fi

# MAKEFLAGS cleared: under `make test` the caller's jobserver is not open to this make.
if ! MAKEFLAGS= ${MAKE:-make} -s -j"$JOBS" fuzz; then
  echo "FAIL building the fuzz targets (make fuzz)"
  finish 0 1
fi

# --- Seeds: SEEDS/<target>/<name>
python3 - "$SCRATCH/seeds" <<'PY'
import json, math, os, struct, sys, zlib

root = sys.argv[1]

def seed(target, name, data):
    os.makedirs(os.path.join(root, target), exist_ok=True)
    with open(os.path.join(root, target, name), "wb") as f:
        f.write(data)

def header(*values):  # a 256-int32 header
    return struct.pack("<256i", *values, *([0] * (256 - len(values))))

# Token shard: [0]=20240520 [1]=1 [2]=count, then count uint16 (fuzz_token_shard's vocab is 1000).
def shard(tokens):
    return header(20240520, 1, len(tokens)) + struct.pack("<%dH" % len(tokens), *tokens)

seed("token_shard", "min", shard([i * 37 % 1000 for i in range(13)]))
seed("token_shard", "longer", shard([i * 7 % 1000 for i in range(50)]))

# Checkpoint: header [0]=20240326 [1]=3 (FP32) or 5 (BF16) [2]=maxT [3]=V [4]=L [5]=NH [6]=C
# [7]=Vp, then the parameters of llmc/gpt2.h's table.
def parameter_count(L, C, T, Vp):
    return Vp * C + T * C + 2 * C + L * (12 * C * C + 13 * C)

def checkpoint(version, L, NH, C, T, V):
    Vp = (V + 127) // 128 * 128
    n = parameter_count(L, C, T, Vp)
    if version == 3:
        body = struct.pack("<%df" % n, *[(i % 17) * 0.01 for i in range(n)])
    else:
        body = struct.pack("<%dH" % n, *[0x3C00 + i % 17 for i in range(n)])
    return header(20240326, version, T, V, L, NH, C, Vp) + body

def with_checksum(data):  # the CRC-32 of llmc/file_header.h in header slots 254 and 255
    data = bytearray(data)
    data[254 * 4:256 * 4] = struct.pack("<iI", 1, 0)
    data[255 * 4:256 * 4] = struct.pack("<I", zlib.crc32(data))
    return bytes(data)

seed("checkpoint", "fp32", checkpoint(3, L=1, NH=1, C=4, T=2, V=1))
seed("checkpoint", "fp32_checksum", with_checksum(checkpoint(3, L=1, NH=1, C=4, T=2, V=1)))
seed("checkpoint", "bf16", checkpoint(5, L=2, NH=2, C=4, T=3, V=130))
# Regression: V = maxT = 2^31-1 padded to a negative Vp made the parameter count wrap around to 26,
# so this 26-parameter file was accepted.
seed("checkpoint", "wrapped_count", header(20240326, 3, 2**31 - 1, 2**31 - 1, 1, 1, 1, -2**31) +
     bytes(26 * 4))
# Regression: a header of 2^16 layers (the most a config may have) took the layer plan's kept
# outputs a quadratic search, past the fuzzer's timeout.
seed("checkpoint", "most_layers", header(20240326, 3, 2, 1, 2**16, 1, 4, 128) + bytes(64))

# Debug state for fuzz_debug_state's model (L=1 NH=1 C=4 maxT=4 V=8): header [0]=20240327 [1]=3
# [2]=B [3]=T [4]=steps [5]=V [6..11] float bits of the hyperparameters, then x, y, logits, loss,
# gradients and the step losses.
def debug_state(B, T, steps, L=1, C=4, max_T=4, V=8, Vp=128):
    hyper = struct.unpack("<6i", struct.pack("<6f", 6e-4, 0.9, 0.95, 1e-8, 0.1, 1.0))
    BT = B * T
    P = parameter_count(L, C, max_T, Vp)
    tokens = struct.pack("<%di" % BT, *[i % V for i in range(BT)])
    return (header(20240327, 3, B, T, steps, V, *hyper) + tokens + tokens +
            struct.pack("<%df" % (BT * V), *[0.5] * (BT * V)) + struct.pack("<f", 2.08) +
            struct.pack("<%df" % P, *[0.01] * P) + struct.pack("<%df" % steps, *[2.0] * steps))

two_steps = debug_state(B=1, T=2, steps=2)
seed("debug_state", "two_steps", two_steps)
seed("debug_state", "full_batch", debug_state(B=2, T=4, steps=0))
# Regression: B = 2^31-1 was allocated for (16 GiB) before the file size was checked.
seed("debug_state", "huge_batch", two_steps[:8] + struct.pack("<i", 2**31 - 1) + two_steps[12:])
# Version 5: the loss's settings after the header (their length, the text padded to 4-byte words),
# then the prefix table's rows (Vp) and ids.
settings = b"-mtp 1.0,0.5 -pw 0.25"
settings_block = (struct.pack("<i", len(settings)) + settings.ljust(-(-len(settings) // 4) * 4, b"\0") +
                  struct.pack("<i", 128) + struct.pack("<128i", *[-1] * 128))
seed("debug_state", "settings", two_steps[:4] + struct.pack("<i", 5) + two_steps[8:1024] + settings_block +
     two_steps[1024:])

# Tokenizer vocabulary: header [0]=20240328 [1]=2 [2]=count [3]=EOT id, then per token a uint8
# length and the bytes.
def vocabulary(tokens, eot):
    return header(20240328, 2, len(tokens), eot) + b"".join(bytes([len(t)]) + t for t in tokens)

seed("tokenizer", "words",
     vocabulary([b"a", b"b", b" the", b"\xe2\x82", b"\xac", b"<|endoftext|>"], eot=5))
seed("tokenizer", "bytes", vocabulary([bytes([i]) for i in range(256)] + [b"<|endoftext|>"], 256))
# Regression: 2^24 tokens (512 MiB of strings) were allocated before the file size was checked.
seed("tokenizer", "huge_count", header(20240328, 2, 2**24, 0) + b"\x01a")

# HellaSwag eval file (llmc/hellaswag.h): header [0]=20240522 [1]=1 [2]=examples [3]=longest
# example in bytes, then per example uint16: 65535, byte length, index, label, 4, context length,
# context, then per ending its length and tokens.
def hellaswag(examples):
    stream, longest = [], 0
    for index, (label, context, endings) in enumerate(examples):
        fields = [65535, 0, index, label, 4, len(context)] + context
        for ending in endings:
            fields += [len(ending)] + ending
        fields[1] = 2 * len(fields)
        longest = max(longest, fields[1])
        stream += fields
    return header(20240522, 1, len(examples), longest) + struct.pack("<%dH" % len(stream), *stream)

seed("hellaswag", "one", hellaswag([(0, [464, 3290], [[257], [318, 262], [11], [50256]])]))
seed("hellaswag", "two", hellaswag([(3, [1, 2, 3], [[4], [5, 6], [7, 8, 9], [10]]),
                                    (1, [100], [[200, 300], [400], [500], [600, 700, 800]])]))

# HellaSwag jsonl: each line of the sample set.
for number, line in enumerate(open("dev/test/hellaswag_sample.jsonl", "rb")):
    seed("hellaswag_jsonl", "line%d" % number, line)

# JSON: escapes of every kind, numbers, and nesting to the depth limit.
seed("json", "values", b'{"s": "a\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00", '
                       b'"n": [0, -1.5e+3, 2E-2], "b": [true, false, null, {}, []]}')
seed("json", "nested", b"[" * 64 + b"1" + b"]" * 64)

# BPE files: encoder.json, NUL, vocab.bpe. GPT-2's alphabet spells the 188 printable bytes as
# themselves and the other 68, in order, as U+0100 onwards; ids 0-255 are the bytes (printable
# ones first), then one id per merge, then <|endoftext|>.
printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or b >= 0xAE]
unprintable = [b for b in range(256) if b not in printable]
symbol = {b: chr(b) for b in printable}
symbol.update({b: chr(256 + i) for i, b in enumerate(unprintable)})

def spell(data):
    return "".join(symbol[b] for b in data)

def bpe_files(merges):
    tokens = [symbol[b] for b in printable + unprintable]
    lines = ["#version: 0.2"]
    for left, right in merges:
        lines.append(spell(left) + " " + spell(right))
        tokens.append(spell(left + right))
    tokens.append("<|endoftext|>")
    encoder = json.dumps({t: i for i, t in enumerate(tokens)}, ensure_ascii=False)
    return encoder.encode() + b"\0" + ("\n".join(lines) + "\n").encode()

seed("bpe_files", "latin", bpe_files([(b" ", b"t"), (b"h", b"e"), (b" t", b"he"), (b"l", b"l"),
                                      (b"e", b"ll"), (b"1", b"2")]))
seed("bpe_files", "multibyte",
     bpe_files([(b"\xe6", b"\x97"), (b"\xe6\x97", b"\xa5"), (b" ", b" ")]))

# BPE encode: the tokenizer test corpus in pieces of five lines, and some invalid UTF-8.
lines = open("dev/test/tokenizer_corpus.txt", "rb").read().split(b"\n")
for start in range(0, len(lines), 5):
    seed("bpe_encode", "corpus%03d" % start, b"\n".join(lines[start:start + 5]))
seed("bpe_encode", "invalid", b"abc \xff\xfe def \xed\xa0\x80 \xc3")

# Resume state: k, then XOR bytes for a DataLoaderState (2608 bytes) and an OutlierState (8216);
# all zero, so each seed restores an undamaged state.
for k in (0, 7, 27, 45, 150):
    seed("resume_state", "k%d" % k, bytes([k]) + bytes(2608 + 8216))

# Training state for fuzz_train_state (step 3, rank 0 of 1, 4 parameters; llmc/train_state.h):
# header [0]=20240528 [1]=version [2]=step [3]=rank [4]=world [5]=AdamW updates [6]=master weights
# [8..9]=n [10]=FP8 history entries [11]=its steps (version 4 on) [12]=the matrices' optimizer
# [13..14]=the training data's tokens, checksummed; then the host state
# (two RngStates of 2512 bytes, a DataLoaderState of 2608 bytes, 2584 before version 5, two
# OutlierStates), m, v, the master weights and the FP8 history (uint32).
def train_state(master, updates, version=5, fp8_entries=0, fp8_steps=0, optimizer=0, data_tokens=0):
    n, host_bytes = 4, 2 * 2512 + (2608 if version >= 5 else 2584) + 2 * 8216
    head = header(20240528, version, 3, 0, 1, updates, int(master), 0, n, 0, fp8_entries, fp8_steps, optimizer,
                  data_tokens & 0xFFFFFFFF, data_tokens >> 32)
    moments = struct.pack("<%df" % ((3 if master else 2) * n), *[0.25 * i for i in range((3 if master else 2) * n)])
    history = struct.pack("<%dI" % fp8_entries, *[0x3f800000 + 977 * i for i in range(fp8_entries)])
    return with_checksum(head + bytes(host_bytes) + moments + history)

seed("train_state", "master", train_state(True, 3))
seed("train_state", "no_master", train_state(False, 0))
seed("train_state", "fp8_history", train_state(True, 3, fp8_entries=6, fp8_steps=2))
seed("train_state", "version_4", train_state(True, 3, version=4, fp8_entries=6, fp8_steps=2))
seed("train_state", "version_3", train_state(True, 3, version=3))
seed("train_state", "muon_data", train_state(True, 3, optimizer=2, data_tokens=5 << 32 | 2048))

# Rendezvous record for fuzz_rendezvous (4 processes, run token 1234.0.0; llmc/rendezvous.h):
# uint32 magic "RDV1", process count, sender's rank, status; the token in 65 bytes, NUL-padded;
# the 128-byte id; 3 bytes of padding.
def rendezvous_record(rank, status, token=b"1234.0.0"):
    return struct.pack("<4I65s128s3x", 0x52445631, 4, rank, status, token, bytes(range(128)))

seed("rendezvous", "rank0", rendezvous_record(0, 0))
seed("rendezvous", "hello_rank3", rendezvous_record(3, 0))
seed("rendezvous", "refusal", rendezvous_record(0, 1))
seed("rendezvous", "other_token", rendezvous_record(1, 0, token=b"1234.0.1"))

# Outlier: a series of doubles, falling, with a spike, a NaN and an Inf.
series = [3.0 + 5.0 / (1 + i) + 0.1 * math.sin(i) for i in range(48)]
series[20], series[30], series[40] = 9.0, float("nan"), float("inf")
seed("outlier", "series", struct.pack("<%dd" % len(series), *series))
PY
[ $? -eq 0 ] || { echo "FAIL writing the seed files"; finish 0 1; }

# --- Runs, JOBS at a time. Each writes its log and exit status under $SCRATCH. No input is more
# than a few KiB, so one allocation of 256 MiB can only be a size taken from a header unchecked.
run_target() {
  local name=$1
  mkdir -p "$SCRATCH/corpus/$name" "$SCRATCH/seeds/$name"
  TMPDIR="$SCRATCH/tmp" "build/fuzz_$name" -max_total_time="$SECONDS_EACH" -timeout=5 \
    -rss_limit_mb=2048 -malloc_limit_mb=256 -artifact_prefix="$SCRATCH/$name-" \
    "$SCRATCH/corpus/$name" "$SCRATCH/seeds/$name" > "$SCRATCH/$name.log" 2>&1
  echo $? > "$SCRATCH/$name.status"
}

targets=()
for source in dev/fuzz/fuzz_*.cpp; do
  name=$(basename "$source" .cpp)
  targets+=("${name#fuzz_}")
done
for name in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  run_target "$name" &
done
wait

passed=0
failed=0
for name in "${targets[@]}"; do
  log="$SCRATCH/$name.log"
  status=$(cat "$SCRATCH/$name.status" 2>/dev/null || echo "none")
  if [ "$status" = 0 ]; then
    passed=$((passed + 1))
    runs=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1 runs in \2 s/p' "$log")
    found=$(ls "$SCRATCH/corpus/$name" | wc -l)
    echo "ok   fuzz_$name: ${runs:-finished}, corpus of $found new inputs"
  else
    failed=$((failed + 1))
    # The first line that says what went wrong: a broken property, an escaped exception, a
    # sanitizer or libFuzzer error.
    why=$(grep -m1 -E -e "fuzz property violated|what\(\):|runtime error" \
      -e "ERROR: (AddressSanitizer|libFuzzer)|SUMMARY" "$log")
    input=$(ls "$SCRATCH/$name-"* 2>/dev/null | head -n1)
    echo "FAIL fuzz_$name (exit $status): ${why:-see the log}"
    echo "     input: ${input:-none saved}; log: $log; reproduce: build/fuzz_$name ${input:-INPUT}"
  fi
done
finish "$passed" "$failed"
