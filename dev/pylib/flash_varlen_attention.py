"""FlashAttention-3's flash_attn_varlen_func, as record #89's train_gpt.py calls it, by torch's own
FlashAttention-2 kernel (aten._flash_attention_forward, which takes packed documents and a window):
the stand-in its offline copy imports (dev/reference89_offline.py) where the original loads
FlashAttention-3 from the Hugging Face hub.

The call: q, k, v [T, H, D] in BF16 or FP16, the documents packed one after another, cu_seqlens [n]
their starts (int32, the first 0, padded at the end with T), causal, a sliding window (w, 0): query i
sees key j when both lie in one document and i - w <= j <= i (w + 1 keys, FlashAttention's convention;
-1: no window). The aten operator has its own backward and its own fake tensor, so the reference's
fullgraph compile takes it as one opaque call, as it takes FlashAttention-3's kernel.
"""
import torch


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           causal=True, softmax_scale=None, window_size=(-1, -1)):
    """The attention over the packed documents, [T, H, D] out, for the arguments record #89 gives:
    causal, window (w, 0) with w >= 0 or -1 (causal makes the right side 0, as FlashAttention-3 has it)."""
    if not causal or window_size[1] not in (0, -1) or window_size[0] < -1:
        raise ValueError("flash_varlen_attention: only causal attention with a window (w, 0), w >= 0 or -1")
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"flash_varlen_attention: {q.dtype}; FlashAttention takes bfloat16 or float16")
    outputs = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, 0.0, True, False,
        scale=softmax_scale, window_size_left=window_size[0], window_size_right=0)
    return outputs[0]
