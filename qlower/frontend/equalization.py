"""Cross-layer equalization (Nagel et al. 2019, "Data-Free Quantization"), on the exported float graph.

Two consecutive layers ``y = W2 f(W1 x + b1)`` where ``f`` is the identity, ReLU or a clamp
``[0, M]`` (ReLU6) compute the same function when output channel ``i`` of the first is divided
by ``s_i > 0`` and input channel ``i`` of the second multiplied by it: ReLU commutes with a
positive scale, and the clamp's bound becomes ``M / s_i``. With
``s_i = sqrt(r1_i / r2_i)`` (``r1_i`` = max |W1| over output channel ``i``, ``r2_i`` = max |W2|
over input channel ``i``) both ranges become ``sqrt(r1_i * r2_i)``, so a per-tensor weight scale
no longer has to cover one channel's outliers at the expense of all the others (depthwise
convolutions after BatchNorm folding are the classic case). Chains are swept until the
scales settle.

A per-channel bound has no place in one per-tensor requantization, so a ReLU6 whose bounds now
differ becomes ``clamp(y, 0, max_i M / s_i)`` (still fused into the first layer) followed by
``minimum(., M / s)``, a pick in the same quantization domain: exact in float and in integers.

Pairs: conv -> conv (the second with groups 1, or depthwise with one output per input channel)
and linear -> linear, where the first's result (or its activation's) has no other reader and each
layer owns its weight and bias. BatchNorms must be folded first (batch_norm_fold.py). The float
function is unchanged up to float rounding (tests/test_equalization.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
from torch.fx import GraphModule, Node

from qlower.frontend.constants import attribute_tensor, set_attribute_tensor

aten = torch.ops.aten

CONVS = {aten.conv1d.default, aten.conv1d.padding, aten.conv2d.default, aten.conv2d.padding}
LINEAR = aten.linear.default
SWEEPS = 20
SETTLED = 1e-4  # a sweep whose scales all lie within this of 1 ends the search
SCALE_LIMIT = 1e4  # no channel is rescaled by more (a dead channel keeps scale 1)


@dataclass
class _Pair:
    first: Node
    second: Node
    clamp: Node | None  # a hardtanh(y, 0, M) between them
    total: torch.Tensor  # the product of the scales applied so far, per channel


def _groups(node: Node) -> int:
    return int(node.args[6]) if len(node.args) > 6 else int(node.kwargs.get("groups", 1))


def _bias(node: Node) -> Node | None:
    b = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    return b if isinstance(b, Node) else None


def _owned(node: Node, attr_uses: Counter) -> bool:
    """``node`` (a conv / linear) is the only reader of its weight and bias parameters."""
    params = [node.args[1], _bias(node)]
    return isinstance(params[0], Node) and all(
        p is None or (p.op == "get_attr" and attr_uses[p.target] == 1 and len(p.users) == 1) for p in params)


def _activation(node: Node) -> tuple[bool, Node | None]:
    """(positively homogeneous, the clamp node if it is a ``[0, M]`` clamp)."""
    if node.op != "call_function":
        return False, None
    if node.target in (aten.relu.default, aten.relu_.default):
        return True, None
    if node.target in (aten.hardtanh.default, aten.hardtanh_.default):
        lo = node.args[1] if len(node.args) > 1 else -1.0
        hi = node.args[2] if len(node.args) > 2 else 1.0
        if lo == 0 and isinstance(hi, (int, float)) and hi > 0:
            return True, node
    return False, None


def _pairs(gm: GraphModule) -> list[_Pair]:
    attr_uses = Counter(n.target for n in gm.graph.nodes if n.op == "get_attr")
    pairs = []
    for first in gm.graph.nodes:
        if first.op != "call_function" or first.target not in CONVS | {LINEAR} or not _owned(first, attr_uses):
            continue
        if len(first.users) != 1:
            continue
        middle, clamp = next(iter(first.users)), None
        ok, clamp = _activation(middle)
        if ok:
            if len(middle.users) != 1:
                continue
            second = next(iter(middle.users))
        else:
            middle, second = first, middle
        if second.op != "call_function" or second.args[0] is not middle or not _owned(second, attr_uses):
            continue
        if (first.target is LINEAR) != (second.target is LINEAR):
            continue  # a conv's channels are dim 1, a linear's the last
        channels = _weight(gm, first).shape[0]
        w2 = _weight(gm, second)
        if second.target in CONVS:
            groups = _groups(second)
            if not (groups == 1 or (groups == channels and w2.shape[0] == channels and w2.shape[1] == 1)):
                continue
        if w2.dim() < 2 or (second.target is LINEAR and w2.shape[1] != channels):
            continue
        pairs.append(_Pair(first, second, clamp, torch.ones(channels, dtype=torch.float64)))
    return pairs


def _weight(gm: GraphModule, node: Node) -> torch.Tensor:
    return attribute_tensor(gm, node.args[1])


def _input_ranges(gm: GraphModule, node: Node) -> torch.Tensor:
    """max |W| over each input channel of ``node`` (per output channel for a depthwise conv)."""
    w = _weight(gm, node).detach().to(torch.float64).abs()
    if node.target in CONVS and _groups(node) > 1:
        return w.reshape(w.shape[0], -1).amax(1)
    return w.movedim(1, 0).reshape(w.shape[1], -1).amax(1)


def _output_ranges(gm: GraphModule, node: Node) -> torch.Tensor:
    w = _weight(gm, node).detach().to(torch.float64).abs()
    return w.reshape(w.shape[0], -1).amax(1)


def _apply(gm: GraphModule, pair: _Pair, s: torch.Tensor) -> None:
    """Output channel i of ``first`` divided by ``s_i``, input channel i of ``second`` multiplied."""
    w1 = _weight(gm, pair.first).detach().to(torch.float64)
    shape = (-1,) + (1,) * (w1.dim() - 1)
    set_attribute_tensor(gm, pair.first.args[1].target, w1 / s.reshape(shape))
    bias = _bias(pair.first)
    if bias is not None:
        set_attribute_tensor(gm, bias.target, attribute_tensor(gm, bias).detach().to(torch.float64) / s)
    w2 = _weight(gm, pair.second).detach().to(torch.float64)
    if pair.second.target in CONVS and _groups(pair.second) > 1:
        w2 = w2 * s.reshape((-1,) + (1,) * (w2.dim() - 1))
    else:
        w2 = w2 * s.reshape((1, -1) + (1,) * (w2.dim() - 2))
    set_attribute_tensor(gm, pair.second.args[1].target, w2)
    pair.total *= s


def equalize(gm: GraphModule) -> int:
    """Equalize, in place, every pair of layers described above; returns how many pairs changed."""
    pairs = _pairs(gm)
    for _ in range(SWEEPS):
        largest = 0.0
        for pair in pairs:
            r1, r2 = _output_ranges(gm, pair.first), _input_ranges(gm, pair.second)
            s = torch.where((r1 > 0) & (r2 > 0), torch.sqrt(r1 / r2.clamp_min(1e-300)), torch.ones_like(r1))
            s = s.clamp(1 / SCALE_LIMIT, SCALE_LIMIT)
            largest = max(largest, float((s.log().abs()).max()) if len(s) else 0.0)
            _apply(gm, pair, s)
        if largest < SETTLED:
            break
    changed = [p for p in pairs if not torch.all(p.total == 1)]
    for pair in changed:
        if pair.clamp is not None:
            _split_clamp(gm, pair)
    if changed:
        gm.graph.lint()
        gm.recompile()
    return len(changed)


def _split_clamp(gm: GraphModule, pair: _Pair) -> None:
    """``hardtanh(y, 0, M)`` on channels scaled by ``1 / total`` → ``hardtanh(y, 0, max(M / total))``,
    then ``minimum`` with the per-channel bounds ``M / total`` (left out if they are all equal)."""
    clamp = pair.clamp
    top = float(clamp.args[2])
    bounds = (top / pair.total).to(torch.float32)
    widest = float(bounds.max())
    clamp.args = (clamp.args[0], 0.0, widest, *clamp.args[3:])
    if torch.all(bounds == widest):
        return
    dims = clamp.meta["val"].dim() if isinstance(clamp.meta.get("val"), torch.Tensor) else 4
    shape = (-1,) if pair.first.target is LINEAR else (-1,) + (1,) * (dims - 2)
    name = f"equalized_bound_{pair.first.args[1].target.replace('.', '_')}"
    gm.register_buffer(name, bounds.reshape(shape).clone())
    with gm.graph.inserting_after(clamp):
        bound = gm.graph.get_attr(name)
    fake_mode = getattr(clamp.meta.get("val"), "fake_mode", None)
    value = getattr(gm, name)
    bound.meta["val"] = fake_mode.from_tensor(value, static_shapes=True) if fake_mode is not None else value
    with gm.graph.inserting_after(bound):
        picked = gm.graph.call_function(aten.minimum.default, (clamp, bound))
    picked.meta.update({k: v for k, v in clamp.meta.items() if k != "quantization_annotation"})
    pair.second.replace_input_with(clamp, picked)
