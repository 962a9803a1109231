"""Each parameter of a model at its init, and its fixed tables, in one line each (dev/reference89_offline.py
--init_check copies this file beside record #89's script, which draws its init unseeded): name, shape,
dtype, mean, standard deviation, largest magnitude and the share of zeros, in float64. Compared with
ours' init role by role (each tensor's draw, its scale and its zeros), and over several runs, they say
whether both sides start from the same distribution.

    init NAME SHAPE DTYPE mean M std S max A zeros Z
"""
import torch

# The script's fixed tables drawn at init that are buffers, not parameters.
TABLE_BUFFERS = ("bigram_sign_table",)


def line(name, tensor):
    values = tensor.detach().double()
    shape = "x".join(str(n) for n in tensor.shape) or "scalar"
    zeros = (values == 0).double().mean().item()
    std = values.std().item() if values.numel() > 1 else 0.0
    return (f"init {name} {shape} {str(tensor.dtype).replace('torch.', '')} mean {values.mean().item():.6e} "
            f"std {std:.6e} max {values.abs().max().item():.6e} zeros {zeros:.6f}")


def report(model, print0):
    """One line a parameter, then a line a table buffer, through the script's print0 (rank 0, to its log
    and the console)."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            print0(line(name, parameter), console=True)
        for name, buffer in model.named_buffers():
            if name in TABLE_BUFFERS:
                print0(line(name, buffer), console=True)
