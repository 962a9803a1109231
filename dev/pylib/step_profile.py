"""Chosen training steps of record #89's script under torch.profiler (dev/reference89_offline.py
--profile_steps, which copies this file and kernel_kinds.py beside the script): start(step, steps)
before a step's micro steps and stop(step, recording) after its optimizer step and FP8 casts. The GPU
is drained where a recording starts and ends, so it holds that step's kernels alone; rank 0 writes
logs/profile_stepNNNNNN.txt in the script's folder: the GPU kernel time, by kind, then every kernel
(ms, launches), longest first. The recorded step takes longer than the others (the profiler's own
work and the drains). A profiler that fails is reported in one line and the run goes on: the tables
are a by-product of a run that may be long."""
import os

import torch
from torch.profiler import ProfilerActivity, profile

import kernel_kinds


def start(step, steps):
    """A recording started before `step` if it is one of `steps`, else None."""
    if step not in steps:
        return None
    torch.cuda.synchronize()
    try:
        recording = profile(activities=[ProfilerActivity.CUDA])
        recording.start()
    except Exception as e:  # noqa: BLE001 (any failure of the profiler leaves the training alone)
        print(f"step_profile: step {step} not recorded: {e}", flush=True)
        return None
    return recording


def stop(step, recording):
    if recording is None:
        return
    torch.cuda.synchronize()
    try:
        recording.stop()
        if int(os.environ.get("RANK", "0")) == 0:
            write_table(step, recording)
    except Exception as e:  # noqa: BLE001
        print(f"step_profile: step {step}'s table not written: {e}", flush=True)


def write_table(step, recording):
    events, total_us = kernel_kinds.gpu_kernels(recording, torch.autograd.DeviceType.CUDA)
    os.makedirs("logs", exist_ok=True)
    with open(os.path.join("logs", f"profile_step{step:06d}.txt"), "w") as f:
        f.write(f"step {step}: GPU kernel time {total_us / 1000:.2f} ms\n")
        for kind, us in kernel_kinds.time_by_kind(events).items():
            f.write(f"  {kind:50s} {us / 1000:8.2f} ms  {100 * us / total_us:5.1f}%\n")
        f.write("kernels (ms, launches):\n")
        for e in events:
            f.write(f"{kernel_kinds.device_time_us(e) / 1000:9.3f} {e.count:6d}  {e.key}\n")
