#!/usr/bin/env python3
"""Records draws from PyTorch's CPU generator for build/test_rand to compare with llmc/rand.h.

Usage: python3 dev/test/rand_reference.py OUT.bin
(make test writes build/ref/rand_reference.bin and passes it in RAND_REFERENCE).

PyTorch picks its float normal_ kernel by CPU capability: AVX2 uses cephes
log/sincos (rand.h's avx2 kernel), DEFAULT the C library (rand.h's libm kernel),
AVX512 a variant rand.h does not reproduce. Normal draws are therefore recorded
in child processes started with ATEN_CPU_CAPABILITY=avx2 and =default; a child
whose CPU lacks the capability (PyTorch then falls back silently) records none.
Only generator calls whose use of the MT19937 stream is the same in every
PyTorch version are recorded (uniform_ and normal_, not randint).

File layout (little-endian):
  header: int32 magic 20240611, int32 version 2; then records up to the end of the file
  record: int32 kind, int32 kernel (0 none, 1 avx2, 2 libm), uint64 seed,
          float64 mean, float64 std, int32 number of calls, int32 size of each
          call, int32 number of 4-byte values, the values
  kinds, each after torch.manual_seed(seed):
    1 state:          draw sizes[0] float uniforms (one u32 each), then the 624 MT
                      words and the index of the next word to temper (624: the
                      words are regenerated before the next draw); uint32 values
    2 uniform double: empty(n, dtype=float64).uniform_(); two uint32 per value
                      (the double's bits, low word first)
    3 uniform float:  empty(n).uniform_(); float32 values
    4 normal:         empty(size).normal_(mean, std) for each size in turn,
                      concatenated; float32 values
"""
import os
import platform
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from pydeps import require  # noqa: E402

require("numpy", "torch")
import numpy as np  # noqa: E402
import torch  # noqa: E402

MAGIC = 20240611
VERSION = 2
KIND_STATE, KIND_UNIFORM_DOUBLE, KIND_UNIFORM_FLOAT, KIND_NORMAL = 1, 2, 3, 4
KERNEL_NONE = 0
# ATEN_CPU_CAPABILITY value -> rand.h kernel id, and the capability names PyTorch then reports.
KERNELS = {"avx2": (1, ("AVX2",)), "default": (2, ("DEFAULT", "NO AVX"))}
NORMALS_ONLY_FLAG = "--normals-only"

SEEDS = [0, 1, 42, 1337, 2**32 + 7]  # the last checks that only the low 32 bits count
SIZES = [1, 7, 15, 16, 17, 31, 1000, 4097]


def record(kind, kernel, seed, calls, values, mean=0.0, std=0.0):
    values = np.ascontiguousarray(values)
    raw = values.tobytes()
    assert len(raw) % 4 == 0
    head = struct.pack("<iiQddi", kind, kernel, seed, mean, std, len(calls))
    head += struct.pack("<%di" % len(calls), *calls)
    return head + struct.pack("<i", len(raw) // 4) + raw


def generator_records():
    out = []
    for seed in SEEDS:
        for draws in (0, 1, 623, 624, 1000, 1248):
            torch.manual_seed(seed)
            if draws:
                torch.empty(draws).uniform_()
            raw = torch.get_rng_state().numpy().tobytes()
            # CPU generator state: u64 seed, i32 left, i32 seeded, u64 next, u64 state[624], ...
            left, = struct.unpack_from("<i", raw, 8)
            next_index, = struct.unpack_from("<Q", raw, 16)
            words = np.frombuffer(raw, dtype="<u8", count=624, offset=24).astype(np.uint32)
            position = 624 if left == 1 else next_index
            out.append(record(KIND_STATE, KERNEL_NONE, seed, [draws],
                              np.append(words, np.uint32(position))))
        torch.manual_seed(seed)
        out.append(record(KIND_UNIFORM_DOUBLE, KERNEL_NONE, seed, [1000],
                          torch.empty(1000, dtype=torch.float64).uniform_().numpy()))
        torch.manual_seed(seed)
        out.append(record(KIND_UNIFORM_FLOAT, KERNEL_NONE, seed, [2000],
                          torch.empty(2000).uniform_().numpy()))
    return out


def normal_records(kernel):
    def draw(seed, calls, mean, std):
        torch.manual_seed(seed)
        values = [torch.empty(n).normal_(mean, std).numpy() for n in calls]
        return record(KIND_NORMAL, kernel, seed, calls, np.concatenate(values), mean, std)

    out = [draw(seed, [n], 0.0, 1.0) for seed in SEEDS for n in SIZES]
    out += [draw(42, [n], 0.5, 0.02) for n in SIZES]
    out.append(draw(7, [262147], 0.0, 0.02 / (2 * 12) ** 0.5))
    # Consecutive calls: the kept second value of a scalar pair carries over.
    out.append(draw(3, [7, 5, 20, 3, 16, 1, 33], 0.0, 1.0))
    out.append(draw(5, [3, 3, 17], -1.0, 3.0))
    return out


def cpu_capability():
    for line in torch.__config__.show().splitlines():
        if "CPU capability usage:" in line:
            return line.split(":", 1)[1].strip()
    return "unknown"


def main():
    if len(sys.argv) == 3 and sys.argv[1] == NORMALS_ONLY_FLAG:
        kernel, capabilities = KERNELS[sys.argv[2]]
        if cpu_capability() in capabilities:
            sys.stdout.buffer.write(b"".join(normal_records(kernel)))
        return
    if len(sys.argv) != 2:
        sys.exit("usage: %s OUT.bin" % sys.argv[0])
    out_path = sys.argv[1]
    records = generator_records()
    recorded = []
    for name in KERNELS:
        if name == "default" and platform.machine().lower() not in ("x86_64", "amd64"):
            continue  # elsewhere the compiler may fuse the default kernel's final multiply-add
        env = dict(os.environ, ATEN_CPU_CAPABILITY=name)
        child = subprocess.run([sys.executable, os.path.abspath(__file__), NORMALS_ONLY_FLAG, name],
                               env=env, stdout=subprocess.PIPE, check=True)
        if child.stdout:
            records.append(child.stdout)
            recorded.append(name)
    with open(out_path, "wb") as f:
        f.write(struct.pack("<ii", MAGIC, VERSION))
        for r in records:
            f.write(r)
    print("wrote %s (%d bytes, torch %s, CPU capability %s, normal kernels: %s)" % (
        out_path, os.path.getsize(out_path), torch.__version__, cpu_capability(),
        ", ".join(recorded) or "none"))


if __name__ == "__main__":
    main()
