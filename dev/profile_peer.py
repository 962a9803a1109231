"""Where the PyTorch peer's step time and memory go: runs `train_gpt2.py --benchmark 1` with the
given flags under torch.profiler and prints its GPU kernels grouped by kind, per step.

usage: python3 dev/profile_peer.py OUTDIR --model d12 -b 64 -t 1024 [any train_gpt2.py flag]

The profiler records three steps after the untimed warm-up ones (the GPU drained before and after); OUTDIR receives the full kernel
table (kernels.txt) and a trace for chrome://tracing or Perfetto (trace.json).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from pydeps import require  # noqa: E402

require("torch")
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import train_gpt2  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "pylib"))
from kernel_kinds import device_time_us, gpu_kernels, time_by_kind  # noqa: E402

ACTIVE_STEPS = 3


def main():
    if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit(f"usage: {sys.argv[0]} OUTDIR [train_gpt2.py flags]")
    outdir, flags = sys.argv[1], sys.argv[2:]
    if not torch.cuda.is_available():
        sys.exit("error: profile_peer.py profiles the GPU peer; this PyTorch sees no CUDA device")
    os.makedirs(outdir, exist_ok=True)
    first = train_gpt2.WARMUP_STEPS_UNTIMED  # steps before this one compile and warm up
    argv = ["--benchmark", "1", "--num_iterations", str(first + ACTIVE_STEPS + 1)] + flags
    prof = profile(activities=[ProfilerActivity.CUDA])
    steps_done, kept = 0, []

    def step_hook():
        # The profiler records whole steps: the GPU is drained where recording starts and stops.
        nonlocal steps_done
        steps_done += 1
        if steps_done == first:
            torch.cuda.synchronize()
            prof.start()
        elif steps_done == first + ACTIVE_STEPS:
            torch.cuda.synchronize()
            prof.stop()
        kept.append(torch.cuda.memory_allocated())  # between steps: parameters, gradients, AdamW state

    train_gpt2.main(argv, step_hook=step_hook)
    kept_mib = kept[-1] / 2**20
    peak_mib = torch.cuda.max_memory_allocated() / 2**20

    events, total_us = gpu_kernels(prof, torch.autograd.DeviceType.CUDA)
    with open(os.path.join(outdir, "kernels.txt"), "w") as f:
        for e in events:
            f.write(f"{device_time_us(e) / 1000 / ACTIVE_STEPS:9.3f} ms/step {e.count // ACTIVE_STEPS:6d}x  {e.key}\n")
    prof.export_chrome_trace(os.path.join(outdir, "trace.json"))

    print(f"\nGPU kernel time per step: {total_us / 1000 / ACTIVE_STEPS:.2f} ms ({ACTIVE_STEPS} steps profiled)")
    for kind, us in time_by_kind(events).items():
        print(f"  {kind:50s} {us / 1000 / ACTIVE_STEPS:8.2f} ms  {100 * us / total_us:5.1f}%")
    print("largest kernels (ms/step, launches/step):")
    for e in events[:12]:
        print(f"  {device_time_us(e) / 1000 / ACTIVE_STEPS:8.3f} {e.count // ACTIVE_STEPS:5d}  {e.key[:100]}")
    print(f"memory: {kept_mib:.0f} MiB kept between steps (parameters, gradients, AdamW state), "
          f"steady-state peak {peak_mib:.0f} MiB: {peak_mib - kept_mib:.0f} MiB of activations and "
          f"temporaries")


if __name__ == "__main__":
    main()
