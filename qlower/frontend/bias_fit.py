"""Weight scales that let a conv's or linear's bias fit its int32 accumulator.

The importer quantizes a float bias to int32 codes at the accumulator's scale ``s_in * s_w[c]``
(rules/gemm.py). Where the input's range is tiny and the bias is not (YOLO's detection head: class
biases near -8.5 after a stack of small activations), ``|b| / (s_in * s_w)`` passes 2**31 and no int32
holds the bias. The weight's scale is then widened, per output channel, to

    s_w[c] = max(observed s_w[c], |b[c]| / (s_in * BIAS_LIMIT))

once calibration has fixed ``s_in``, so the bias codes are at most BIAS_LIMIT = 2**30 and the sum of
products keeps the other half of the accumulator. Nothing else changes: the weight is quantized at
that scale in the fake-quant model and in the program alike, and the accumulator is requantized as
usual.

What it costs is little: where the widening applies, ``s_in * s_w[c] = |b[c]| / 2**30``, so the sum of
products ``Σ x·w`` of a K-long dot product is at most ``K · 255 · 127 · |b[c]| / 2**30``, about
``K · 3e-5 · |b[c]|``: beside the bias, whose output scale is at least ``|b[c]| / 255``, the weights'
whole contribution is under one output step for K below about 130, and the precision the wider weight
step loses is a fraction of that.
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.observer import ObserverBase

from qlower.frontend.constants import attribute_tensor

aten = torch.ops.aten
BIAS_LIMIT = 2**30
_SYMMETRIC = (torch.per_tensor_symmetric, torch.per_channel_symmetric)
# (input, weight, bias) argument positions of the gemm ops whose bias the importer quantizes
_OPERANDS = {aten.conv1d: (0, 1, 2), aten.conv2d: (0, 1, 2), aten.linear: (0, 1, 2),
             aten.conv_transpose1d: (0, 1, 2), aten.conv_transpose2d: (0, 1, 2), aten.addmm: (1, 2, 0)}


class BiasFitWeightObserver(ObserverBase):
    """A weight's observer whose scales are widened where the bias would not fit (module doc). It
    observes through ``weight``, and reads ``input``'s scale, the one the accumulator multiplies by."""

    def __init__(self, weight: ObserverBase, input: ObserverBase, bias: torch.Tensor) -> None:
        super().__init__(dtype=weight.dtype, is_dynamic=False)
        self.weight = weight
        self.__dict__["_input"] = input   # another node's observer: read, not owned (not a submodule)
        self.register_buffer("bias", bias.detach().to(torch.float64).reshape(-1).clone())
        self.qscheme, self.quant_min, self.quant_max = weight.qscheme, weight.quant_min, weight.quant_max
        self.ch_axis = getattr(weight, "ch_axis", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight(x)

    def calculate_qparams(self):
        scale, zero_point = self.weight.calculate_qparams()
        s_in = float(self._input.calculate_qparams()[0].reshape(-1)[0])
        need = self.bias.abs() / (s_in * BIAS_LIMIT)
        if scale.numel() != need.numel():
            need = need.max()
        rounded = need.to(scale.dtype)
        rounded = torch.where(rounded.double() < need, torch.nextafter(rounded, torch.tensor(torch.inf)), rounded)
        return torch.maximum(scale, rounded), zero_point


def gemm_operands(node: Node) -> tuple[Node, Node, Node] | None:
    """(input, weight, bias) of a conv / linear / addmm node with all three, else None."""
    positions = _OPERANDS.get(getattr(node.target, "overloadpacket", None)) if node.op == "call_function" else None
    if positions is None:
        return None
    args = list(node.args) + [node.kwargs.get("bias")] * (3 - len(node.args))
    found = tuple(args[i] for i in positions)
    return found if all(isinstance(a, Node) for a in found) else None


def fit_biases(model: GraphModule, observers: dict) -> int:
    """Wrap, in ``observers`` (prepare_pt2e's map from edges and nodes to observers), the weight observer
    of every statically quantized gemm whose bias is a constant, so its scale fits the bias; returns
    how many. A weight observer shared with other edges, a fake quantize (QAT learns its own scale)
    and an asymmetric weight are left alone."""
    shared: dict[int, int] = {}
    for obs in observers.values():
        shared[id(obs)] = shared.get(id(obs), 0) + 1
    wrapped = 0
    for node in model.graph.nodes:
        operands = gemm_operands(node)
        if operands is None:
            continue
        x, w, b = operands
        w_obs, x_obs = observers.get((w, node)), observers.get((x, node))
        if not all(isinstance(o, ObserverBase) and not getattr(o, "is_dynamic", False) for o in (w_obs, x_obs)):
            continue
        if shared[id(w_obs)] != 1 or getattr(w_obs, "qscheme", None) not in _SYMMETRIC:
            continue
        try:
            bias = attribute_tensor(model, b)
        except LookupError:
            continue   # a bias computed at run time: the importer keeps the op float
        if bias is None or not bias.is_floating_point() or bias.dim() != 1:
            continue
        observers[(w, node)] = BiasFitWeightObserver(w_obs, x_obs, bias)
        wrapped += 1
    return wrapped
