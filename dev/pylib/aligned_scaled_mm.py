"""torch._scaled_mm as record #89's FP8 MLP calls it, with each scale copied into a tensor of its own:
the stand-in its offline copy's triton_kernels.py calls (dev/reference89_offline.py).

The reference passes the down projection's two per-tensor scales as one-element slices of a buffer of
twelve, layer i's at a 4-byte offset i. From the second layer on, torch 2.11's cuBLAS 13 refuses
those pointers (CUBLAS_STATUS_NOT_SUPPORTED from cublasLtMatmul); a scale in an allocation of its own
is taken. A copy inside the reference's compiled graph is not enough, as the compiler passes the
slice itself to the matmul and drops the copy: so the call is one opaque operator to that compile
(aligned_scaled_mm::scaled_mm), which copies the scales and calls torch._scaled_mm with the same
values. Only the forward is needed (the reference's backward of that projection stays BF16).
Importing this needs torch 2.4 or newer (torch.library.custom_op).
"""
import torch


@torch.library.custom_op("aligned_scaled_mm::scaled_mm", mutates_args=())
def _scaled_mm_scales_copied(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                             out_dtype: torch.dtype, use_fast_accum: bool) -> torch.Tensor:
    return torch._scaled_mm(a, b, scale_a=scale_a.clone(), scale_b=scale_b.clone(), out_dtype=out_dtype,
                            use_fast_accum=use_fast_accum)


@_scaled_mm_scales_copied.register_fake
def _(a, b, scale_a, scale_b, out_dtype, use_fast_accum):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


def scaled_mm(a, b, *, scale_a, scale_b, out_dtype, use_fast_accum=False):
    """torch._scaled_mm(a, b, scale_a=..., scale_b=..., out_dtype=..., use_fast_accum=...)'s result."""
    return _scaled_mm_scales_copied(a, b, scale_a, scale_b, out_dtype, use_fast_accum)
