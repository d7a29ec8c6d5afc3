"""Empirical bias correction (Nagel et al. 2019): remove the mean output shift weight quantization causes.

Quantizing a weight ``W`` to ``W_q`` shifts the layer's output by ``(W_q - W) * x``; its mean over
the calibration data, per output channel, is a bias the quantized layer adds and the float one
does not (large for per-tensor weights of small-range channels). Here every conv / linear whose
weight is a constant runs, on each calibration batch of the float graph, its own op with the
weight error ``W_q - W`` and no bias; the mean of that result over everything but the output
channel is subtracted from the layer's bias. ``W_q`` is what the weight observer of the
QuantConfig (observers.py) makes of the weight, so the correction matches the quantization.

The float function changes (on purpose): the float model ``qlower`` compares against is the
one captured before this pass. A bias read by other ops too is not changed: the layer gets a
copy of its own.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.fx import GraphModule, Interpreter, Node

from qlower.frontend.config import QuantConfig
from qlower.frontend.constants import attribute_tensor, set_layer_bias, written_nodes
from qlower.frontend.observers import fake_quantize_weight, weight_observer

aten = torch.ops.aten

GEMMS = {aten.conv1d.default, aten.conv1d.padding, aten.conv2d.default, aten.conv2d.padding, aten.linear.default}


class _Shifts(Interpreter):
    """Runs the float graph; sums, per target layer, the mean output of its weight error."""

    def __init__(self, gm: GraphModule, errors: dict[Node, torch.Tensor]) -> None:
        super().__init__(gm)
        self.errors = errors
        self.sums: dict[Node, torch.Tensor] = {}

    def run_node(self, n: Node):
        out = super().run_node(n)
        if n in self.errors:
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            args = (args[0], self.errors[n], None, *args[3:])
            shift = n.target(*args, **kwargs).detach().to(torch.float64)
            axis = shift.dim() - 1 if n.target is aten.linear.default else 1
            mean = shift.movedim(axis, 0).reshape(shift.shape[axis], -1).mean(1)
            self.sums[n] = self.sums.get(n, 0) + mean
        return out


def correct_biases(gm: GraphModule, batches: list[tuple], quant: QuantConfig) -> int:
    """Correct, in place, the bias of every conv / linear with a constant weight; returns how many."""
    written = written_nodes(gm)
    ctr = weight_observer(quant.weight_observer, quant.per_channel)
    errors = {}
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target not in GEMMS:
            continue
        weight = n.args[1]
        bias = n.args[2] if len(n.args) > 2 else None
        if not isinstance(weight, Node) or weight.op != "get_attr" or weight in written or not (
                bias is None or isinstance(bias, Node) and bias.op == "get_attr"):
            continue  # a run-time weight, or a bias computed at run time: nothing constant to correct
        w = attribute_tensor(gm, weight).detach()
        if not w.is_floating_point():
            continue
        w_q = fake_quantize_weight(w.float(), ctr, 0 if quant.per_channel else None, quant.weight_qmin,
                                   quant.weight_qmax)
        errors[n] = (w_q - w.float()).to(w.dtype)
    if not errors or not batches:
        return 0
    shifts = _Shifts(gm, errors)
    with torch.no_grad():
        for batch in batches:
            shifts.run(*batch)
    uses = Counter(n.target for n in gm.graph.nodes if n.op == "get_attr")
    for n, total in shifts.sums.items():
        bias = n.args[2] if len(n.args) > 2 else None
        old = (attribute_tensor(gm, bias).detach().to(torch.float64) if bias is not None
               else torch.zeros_like(total))
        set_layer_bias(gm, n, old - total / len(batches), uses)
    gm.recompile()
    return len(shifts.sums)

