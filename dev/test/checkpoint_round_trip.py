"""Shared by test_train_gpt2_py.sh's checks: a model written as an FP32 checkpoint and read back."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from pydeps import require  # noqa: E402

require("numpy", "torch")
import torch  # noqa: E402

import train_gpt2 as tg  # noqa: E402


def checkpoint_round_trip(model, name):
    """model written to $WORK/NAME.bin (FP32): (the model read back, the file's header ints)."""
    path = os.path.join(os.environ["WORK"], f"{name}.bin")
    tg.write_checkpoint(model, path, tg.CHECKPOINT_FP32)
    header = torch.from_file(path, False, tg.HEADER_INTS, dtype=torch.int32)
    return tg.read_checkpoint(path), header
