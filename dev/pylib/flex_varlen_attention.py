"""FlashAttention-3's flash_attn_varlen_func, as record #89's train_gpt.py calls it, by FlexAttention:
the stand-in its offline copy imports (dev/reference89_offline.py) where the original loads
FlashAttention-3 from the Hugging Face hub.

The call: q, k, v [T, H, D], the documents packed one after another, cu_seqlens [n] their starts
(int32, the first 0, padded at the end with T), causal, a sliding window (w, 0): query i sees key j
when both lie in one document and i - w <= j <= i (w + 1 keys, FlashAttention's convention).
Everything here is tensor operations, no host reads, so that it traces inside the reference's
forward, which it compiles with fullgraph=True.
"""
import torch

BLOCK = 128  # FlexAttention's block of queries and keys


def document_window_blocks(cu_seqlens, length, window, block=BLOCK):
    """The BlockMask's block lists for `length` positions (a multiple of block): (partial_num,
    partial_indices, full_num, full_indices), each [Q_BLOCKS] or [Q_BLOCKS, KV_BLOCKS], and doc [length]
    each position's document. A block pair is full when every query in it sees every key in it (one
    document, the keys all before the queries, the farthest pair within the window); partial when
    some query may see some key and not all do (the document mask then decides a pair at a time);
    each list holds its key blocks in increasing order first, the rest of the row unused."""
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
    partial = any_pair & ~full
    return block_lists(partial) + block_lists(full) + (doc,)


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
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
    if not causal or window_size[1] != 0 or cu_seqlens_q is not cu_seqlens_k:
        raise ValueError("flex_varlen_attention: only causal attention, one cu_seqlens tensor for queries and keys "
                         "and a window (w, 0)")
    length = q.size(0)
    window = length if window_size[0] < 0 else window_size[0]
    partial_num, partial_indices, full_num, full_indices, doc = document_window_blocks(cu_seqlens_q, length, window)

    def document_window(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= window) & (doc[q_idx] == doc[kv_idx])

    mask = BlockMask.from_kv_blocks(partial_num[None, None], partial_indices[None, None], full_num[None, None],
                                    full_indices[None, None], BLOCK_SIZE=BLOCK, mask_mod=document_window)
    heads_first = [t.transpose(0, 1)[None] for t in (q, k, v)]
    y = flex_attention(*heads_first, block_mask=mask, scale=softmax_scale)
    return y[0].transpose(0, 1).contiguous()
