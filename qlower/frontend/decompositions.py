"""qlower's own decompositions of composite ops, used before quantization instead of PyTorch's.

``scaled_dot_product_attention``: PyTorch's math decomposition guards rows whose
scores are all ``-inf`` with ``eq``/``all``/``where`` on the scores, which would
put the attention's middle on the host in float (and ``all.dim`` can't even be a
float fallback). Here the guard reads the *mask* instead, so that the scores →
softmax → matmul chain stays integer:
- no mask: ``softmax(q @ kᵀ · scale) @ v``, no guard (nothing is masked);
- a float mask is added to the scores; a bool mask (or ``is_causal``) fills
  ``-inf`` where it is False (the quantizer then leaves that softmax's input in
  float: ``-inf`` has no code; the matmuls around it stay integer);
- a row masked everywhere is 0, as in PyTorch, without ever computing a NaN: its
  mask row is neutralised (0 / all True) and the result is multiplied by a 0/1
  column, both computed from the mask alone (folded when the mask is a constant).
  A quantized model needs finite additive masks (an observer can't measure -inf).
The scale is applied to the scores (PyTorch scales q and k by its square root;
the two agree up to float rounding).
"""

from __future__ import annotations

import math

import torch

aten = torch.ops.aten


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if dropout_p:
        raise NotImplementedError("scaled_dot_product_attention with dropout in an inference graph")
    length, source = query.shape[-2], key.shape[-2]
    if enable_gqa and query.shape[-3] != key.shape[-3]:
        groups = query.shape[-3] // key.shape[-3]
        key = key.repeat_interleave(groups, dim=-3)
        value = value.repeat_interleave(groups, dim=-3)
    factor = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = torch.matmul(query, key.transpose(-2, -1)) * factor
    keep = torch.ones(length, source, dtype=torch.bool).tril() if is_causal else None
    row_any = None
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        keep = attn_mask if keep is None else keep & attn_mask
        row_any = keep.any(dim=-1, keepdim=True)
        keep = keep | row_any.logical_not()  # a row masked everywhere: computed unmasked, zeroed below
    if keep is not None:
        scores = scores.masked_fill(keep.logical_not(), float("-inf"))
    elif attn_mask is not None:
        row_any = (attn_mask != float("-inf")).any(dim=-1, keepdim=True)
        scores = scores + torch.where(row_any, attn_mask, 0.0)
    out = torch.matmul(torch.softmax(scores, dim=-1), value)
    if row_any is not None:
        out = out * torch.where(row_any, 1.0, 0.0)
    return out


QLOWER_DECOMPOSITIONS = {aten.scaled_dot_product_attention.default: _sdpa}
