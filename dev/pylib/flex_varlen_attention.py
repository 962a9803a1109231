"""FlashAttention-3's flash_attn_varlen_func, as record #89's train_gpt.py calls it, by FlexAttention:
the stand-in its offline copy imports (dev/reference89_offline.py) where the original loads
FlashAttention-3 from the Hugging Face hub.

The call: q, k, v [T, H, D], the documents packed one after another, cu_seqlens [n] their starts
(int32, the first 0, padded at the end with T), causal, a sliding window (w, 0): query i sees key j
when both lie in one document and i - w <= j <= i (w + 1 keys, FlashAttention's convention).
The reference compiles its forward with fullgraph=True: to that compile the call is one opaque
operator (flex_varlen_attention::forward, its backward another), as FlashAttention-3's kernel is;
inside, the block lists are tensor operations alone (no host reads) and FlexAttention runs compiled
on its own. Importing this needs torch; calling it, torch 2.5 or newer (FlexAttention).
"""
import torch

BLOCK = 128  # FlexAttention's block of queries and keys


def block_pairs(cu_seqlens, length, window, block=BLOCK):
    """(partial, full, doc): [Q_BLOCKS, KV_BLOCKS] booleans and each position's document. A block pair is
    full when every query in it sees every key in it (one document, the keys all before the queries, the
    farthest pair within the window); partial when some query may see some key and not all do (the
    document mask then decides a pair at a time)."""
    if length % block != 0:
        raise ValueError(f"flex_varlen_attention: {length} positions, not a multiple of {block}")
    device = cu_seqlens.device
    positions = torch.arange(length, device=device, dtype=cu_seqlens.dtype)
    doc = torch.searchsorted(cu_seqlens, positions, right=True) - 1
    first = torch.arange(0, length, block, device=device)
    last = first + (block - 1)
    doc_first, doc_last = doc[first], doc[last]  # positions in order, documents in order
    q_first, q_last = first[:, None], last[:, None]
    k_first, k_last = first[None, :], last[None, :]
    # Some pair may be seen: the keys some query of the block reaches, [q_first - w, q_last], meet the
    # key block, and the two blocks' document ranges overlap.
    reached = (k_first <= q_last) & (k_last >= q_first - window)
    shared = (doc_first[:, None] <= doc_last[None, :]) & (doc_first[None, :] <= doc_last[:, None])
    any_pair = reached & shared
    one_document = (doc_first == doc_last)[:, None] & (doc_first == doc_last)[None, :] & \
        (doc_first[:, None] == doc_first[None, :])
    full = one_document & (k_last <= q_first) & (q_last - k_first <= window)
    return any_pair & ~full, full, doc


def block_lists(blocks):
    """(count, indices) of a [Q_BLOCKS, KV_BLOCKS] boolean: each row's true columns first, in order."""
    count = blocks.sum(dim=-1, dtype=torch.int32)
    order = torch.sort((~blocks).to(torch.int8), dim=-1, stable=True).indices.to(torch.int32)
    return count, order


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
                           causal=True, softmax_scale=None, window_size=(-1, -1)):
    """FlashAttention-3's varlen attention over one packed sequence, [T, H, D] in and out, for the
    arguments record #89 gives it: the same cu_seqlens for queries and keys, causal, window (w, 0)
    with w >= 0 (-1: no window)."""
    if not causal or window_size[1] != 0 or cu_seqlens_q is not cu_seqlens_k:
        raise ValueError("flex_varlen_attention: only causal attention, one cu_seqlens tensor for queries and "
                         "keys and a window (w, 0)")
    length = q.size(0)
    window = length if window_size[0] < 0 else window_size[0]
    scale = q.size(-1) ** -0.5 if softmax_scale is None else float(softmax_scale)
    if _OP is None:
        raise RuntimeError("flex_varlen_attention: this torch has no FlexAttention (torch 2.5 or newer)")
    return _OP(q, k, v, cu_seqlens_q, window, scale)


# The attention is one opaque operator to torch.compile, as FlashAttention-3's kernel is in the
# reference's graph: FlexAttention lowered inside the reference's own fullgraph compile fails where
# its mask reads a tensor the graph computed (the documents; Inductor's "convert FlexibleLayout to
# FixedLayout first"). The operator runs FlexAttention compiled on its own, where those tensors are
# inputs. Its backward computes the attention again and takes the gradients by autograd, which the
# dispatcher has turned off inside an operator: it is turned back on around that computation alone.
RECOMPILE_LIMIT = 64  # one compile a length, window tensor aside, and grad mode: the stages' few of each


def _define_attention_op():
    """The operator, defined at import (not inside the caller's trace), or None without FlexAttention."""
    try:
        from torch.nn.attention.flex_attention import BlockMask, flex_attention
    except ImportError:
        return None
    import torch._dynamo
    from torch import Tensor
    from torch.utils._python_dispatch import _disable_current_modes
    compiled = torch.compile(flex_attention, dynamic=False)
    limit_name = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    autograd_keys = torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradFunctionality)
    for name in ("AutogradOther", "AutogradNestedTensor", "ADInplaceOrView"):
        autograd_keys = autograd_keys | torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, name))

    def attend(q, k, v, cu_seqlens, window, scale):
        with _disable_current_modes():  # plain eager code, as a kernel is: no mode of the caller's graph
            return attend_eagerly(q, k, v, cu_seqlens, window, scale)

    def attend_eagerly(q, k, v, cu_seqlens, window, scale):
        partial, full, doc = block_pairs(cu_seqlens, q.size(0), window)
        window_tensor = torch.tensor(window, device=q.device)  # a tensor: a new window is not a new compile

        def document_window(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (q_idx - kv_idx <= window_tensor) & (doc[q_idx] == doc[kv_idx])

        # The lists of both sides made here (the backward reads the query side): BlockMask.from_kv_blocks
        # would transpose them by vmap, which the caller's compiled graph has turned off.
        # (The transposes made contiguous: FlexAttention reads the lists as contiguous rows.)
        (kv_num, kv_idx), (full_kv_num, full_kv_idx), (q_num, q_idx), (full_q_num, full_q_idx) = (
            [t[None, None] for t in block_lists(pairs.contiguous())] for pairs in (partial, full, partial.T, full.T))
        mask = BlockMask(seq_lengths=(q.size(0), k.size(0)), kv_num_blocks=kv_num, kv_indices=kv_idx,
                         full_kv_num_blocks=full_kv_num, full_kv_indices=full_kv_idx, q_num_blocks=q_num,
                         q_indices=q_idx, full_q_num_blocks=full_q_num, full_q_indices=full_q_idx,
                         BLOCK_SIZE=(BLOCK, BLOCK), mask_mod=document_window)
        heads_first = [t.transpose(0, 1)[None] for t in (q, k, v)]
        with torch._dynamo.config.patch(**{limit_name: RECOMPILE_LIMIT}):
            y = compiled(*heads_first, block_mask=mask, scale=scale)
        return y[0].transpose(0, 1).contiguous()

    def autograd_on():
        exclude = torch._C._dispatch_tls_local_exclude_set() - autograd_keys
        return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude)

    @torch.library.custom_op("flex_varlen_attention::forward", mutates_args=())
    def forward(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, window: int, scale: float) -> Tensor:
        return attend(q.detach(), k.detach(), v.detach(), cu_seqlens, window, scale)  # no graph kept here

    @forward.register_fake
    def _(q, k, v, cu_seqlens, window, scale):
        return torch.empty_like(q)

    @torch.library.custom_op("flex_varlen_attention::backward", mutates_args=())
    def backward(dy: Tensor, q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, window: int,
                 scale: float) -> tuple[Tensor, Tensor, Tensor]:
        with autograd_on(), torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            y = attend(*leaves, cu_seqlens, window, scale)
            return tuple(g.contiguous() for g in torch.autograd.grad(y, leaves, dy))

    @backward.register_fake
    def _(dy, q, k, v, cu_seqlens, window, scale):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def setup_context(ctx, inputs, output):
        q, k, v, cu_seqlens, window, scale = inputs
        ctx.save_for_backward(q, k, v, cu_seqlens)
        ctx.window, ctx.scale = window, scale

    def gradients(ctx, dy):
        q, k, v, cu_seqlens = ctx.saved_tensors
        return backward(dy, q, k, v, cu_seqlens, ctx.window, ctx.scale) + (None, None, None)

    forward.register_autograd(gradients, setup_context=setup_context)
    return forward


_OP = _define_attention_op()
