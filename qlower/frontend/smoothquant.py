"""SmoothQuant (Xiao et al. 2023): move activation outliers into the weights of the linear layers.

A transformer's LayerNorm output often has a few channels far wider than the rest; one
per-tensor int8 scale must cover them, and every other channel loses resolution. Dividing
channel ``j`` of the LayerNorm's affine (weight and bias) by ``s_j`` and multiplying column ``j``
of every linear reading it by ``s_j`` leaves the float function unchanged (up to float
rounding) and narrows the activation; with
``s_j = max|X_j| ** alpha / max|W_j| ** (1 - alpha)`` (``max|X_j|`` over the calibration data,
``max|W_j|`` over the readers' column ``j``), ``alpha`` sets how much of the difficulty moves
to the weights (0.5 in the paper).

Smoothed:
- each LayerNorm with an affine it alone reads whose normalised result is read only by linear
  layers with constant weights they own (a pre-norm block's qkv and first MLP layer);
- each linear whose input is another linear's output, directly or through a ReLU / leaky ReLU /
  ReLU6 (the pairs of equalization.py: the first's output channel ``j`` divided by ``s_j``, its
  ReLU6 bound per channel, exact for the same reason).
A matmul of two activations has no weight to absorb the scale, and a linear after GELU / SiLU
(transformer MLPs) can't take it through the activation: both are left alone.
"""

from __future__ import annotations

import operator
from collections import Counter

import torch
from torch.fx import GraphModule, Node

from qlower.frontend.constants import attribute_tensor, set_attribute_tensor
from qlower.frontend.equalization import channel_extremes, find_pairs, rescale, split_clamp

aten = torch.ops.aten


def _candidates(gm: GraphModule) -> dict[Node, tuple[Node, list[Node]]]:
    """LayerNorm result (getitem 0) -> (the LayerNorm, the linear layers reading it)."""
    uses = Counter(n.target for n in gm.graph.nodes if n.op == "get_attr")

    def owned(p: object) -> bool:
        return isinstance(p, Node) and p.op == "get_attr" and uses[p.target] == 1 and len(p.users) == 1

    found = {}
    for norm in gm.graph.nodes:
        if norm.op != "call_function" or norm.target != aten.native_layer_norm.default:
            continue
        if len(norm.args) < 4 or not owned(norm.args[2]) or not owned(norm.args[3]) or len(norm.args[1]) != 1:
            continue
        results = [u for u in norm.users if u.target is operator.getitem and u.args[1] == 0]
        if len(results) != 1 or not results[0].users:
            continue
        out = results[0]
        readers = list(out.users)
        if all(r.op == "call_function" and r.target == aten.linear.default and r.args[0] is out
               and owned(r.args[1]) for r in readers):
            found[out] = (norm, readers)
    return found


def _scales(x_max: torch.Tensor, w_max: torch.Tensor, alpha: float) -> torch.Tensor:
    s = x_max.clamp_min(1e-12) ** alpha / w_max.clamp_min(1e-12) ** (1 - alpha)
    return torch.where((x_max > 0) & (w_max > 0), s, torch.ones_like(s)).clamp(1e-4, 1e4)


def smooth(gm: GraphModule, batches: list[tuple], alpha: float) -> int:
    """Smooth, in place, every LayerNorm -> linear group and linear -> linear pair described above;
    returns how many."""
    found = _candidates(gm)
    pairs = find_pairs(gm, linear_only=True)
    if not (found or pairs) or not batches:
        return 0
    amax = channel_extremes(gm, {n: -1 for n in [*found, *(p.second.args[0] for p in pairs)]}, batches,
                            magnitude=True)
    for out, (norm, readers) in found.items():
        x_max = amax.get(out)
        if x_max is None:
            continue
        w_max = torch.stack([attribute_tensor(gm, r.args[1]).detach().abs().amax(0).to(torch.float64)
                             for r in readers]).amax(0)
        s = _scales(x_max, w_max, alpha)
        for p in norm.args[2:4]:
            set_attribute_tensor(gm, p.target, attribute_tensor(gm, p).detach().to(torch.float64) / s)
        for r in readers:
            set_attribute_tensor(gm, r.args[1].target, attribute_tensor(gm, r.args[1]).detach().to(torch.float64) * s)
    for pair in pairs:
        x_max = amax.get(pair.second.args[0])
        if x_max is None:
            continue
        w_max = attribute_tensor(gm, pair.second.args[1]).detach().abs().amax(0).to(torch.float64)
        rescale(gm, pair, _scales(x_max, w_max, alpha))
        if pair.clamp_top is not None:
            split_clamp(gm, pair)
    gm.graph.lint()
    gm.recompile()
    return len(found) + len(pairs)
