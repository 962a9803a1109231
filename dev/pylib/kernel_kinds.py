"""GPU kernels of a torch.profiler recording grouped by kind: shared by dev/profile_peer.py (the PyTorch
peer) and step_profile.py (record #89's script, dev/reference89_offline.py --profile_steps)."""
import re

# Kernel name patterns, first match wins: what each kind of GPU work is called by cuBLAS, cuDNN,
# FlashAttention, Triton (Inductor's fused kernels and hand-written ones), the fused AdamW and record
# #89's own kernels. Attention comes first: FlashAttention's names hold their template arguments,
# `cutlass::bfloat16_t` among them. Record #89's: its up projection with ReLU^2 (linear_relu_square),
# its composed attention's corrections (_dc_*), its cross-entropy (ce_fwd_bwd, CUDA through NVRTC).
KINDS = [("attention", r"flash|fmha|cudnn|attention|sdpa|^_dc_"),
         ("matmul", r"gemm|cutlass|sm90_xmma|nvjet|cublas|linear_relu_square"),
         ("AdamW", r"adam"),
         ("layernorm (Triton)", r"^triton_.*layer_norm"),
         ("cross-entropy", r"^ce_fwd|^triton_.*(nll_loss|log_softmax)"),
         ("GELU (Triton)", r"^triton_.*gelu"),
         ("other fused elementwise and reductions (Triton)", r"^triton_"),
         ("gradient clipping", r"multi_tensor_apply|norm"),
         ("copies and fills", r"copy|memcpy|memset|fill|elementwise")]


def kind_of(name):
    return next((kind for kind, pattern in KINDS if re.search(pattern, name, re.IGNORECASE)), "other")


def device_time_us(event):
    """An averaged event's own GPU time in microseconds (its attribute's name moved in torch 2.4)."""
    return getattr(event, "self_device_time_total", None) or event.self_cuda_time_total


def gpu_kernels(profiler, device_type):
    """The recording's GPU events (averaged by name), longest first, and their total time in us."""
    events = [e for e in profiler.key_averages() if e.device_type == device_type]
    events.sort(key=device_time_us, reverse=True)
    return events, sum(device_time_us(e) for e in events)


def time_by_kind(events):
    """{kind: us}, largest first."""
    by_kind = {}
    for e in events:
        by_kind[kind_of(e.key)] = by_kind.get(kind_of(e.key), 0.0) + device_time_us(e)
    return dict(sorted(by_kind.items(), key=lambda item: -item[1]))
