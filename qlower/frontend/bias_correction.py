"""Empirical bias correction (Nagel et al. 2019): remove the mean output shift weight quantization causes.

Quantizing a weight ``W`` to ``W_q`` shifts the layer's output; its mean over the calibration data,
per output channel, is a bias the quantized layer adds and the float one does not (large for
per-tensor weights of small-range channels). Here the float graph and the same graph with every
conv / linear weight quantized (``W_q``: what the weight observer of the QuantConfig, observers.py,
makes of it) run side by side over all calibration batches, layer by layer in graph order; at
each layer the mean of (quantized output - float output), per output channel, is subtracted from
its bias, in the quantized run too, before any later layer reads it. So each layer is corrected for
what reaches it from the quantized layers above (their weight errors, and the mean those errors gain
through non-linearities such as hardswish or a squeeze-excitation gate), not only for its own weight
error on float inputs.

The mean is estimated from few samples (32 images, and 1x1 feature maps at the end of a small
network), so it is shrunk towards zero by its own standard error ``se`` (positive-part James-Stein,
``m·max(0, 1 - se²/m²)``; ``se`` from the per-sample means, so the pixels of one image don't count as
independent samples): a shift within noise of zero is left alone, a clear one corrected almost fully.
Unshrunk, the 32-image means at MobileNetV3-Small's 1x1 layers and logits (4-bit weights) lay further
from the shift measured on 640 other images than that shift lay from zero, and the corrections cost
accuracy. With a single sample no ``se`` exists and the mean is taken as is.

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


class _Stepper(Interpreter):
    """One batch through ``gm``, a node at a time (``step``), values freed after their last use.
    ``weights``: per layer, the (weight, bias) to run it with instead of its own."""

    def __init__(self, gm: GraphModule, batch: tuple, weights: dict[Node, list] | None = None) -> None:
        super().__init__(gm)
        self.args_iter = iter(batch)
        self.env = {}
        self.weights = weights or {}

    def step(self, n: Node) -> object:
        if n in self.weights:
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            w, b = self.weights[n]
            out = n.target(args[0], w, b, *args[3:], **kwargs)
        else:
            out = self.run_node(n)
        self.env[n] = out
        for dead in self.user_to_last_uses.get(n, []):
            del self.env[dead]
        return out


def _axis(n: Node, out: torch.Tensor) -> int:
    return out.dim() - 1 if n.target is aten.linear.default else 1


def _per_sample(x: torch.Tensor, axis: int) -> torch.Tensor:
    """``[samples, channels]``: the mean of each sample (dim 0; the whole tensor when ``axis`` is 0) per channel."""
    x = x.detach().to(torch.float64).movedim(axis, -1)
    return x.reshape(x.shape[0] if axis != 0 and x.dim() > 1 else 1, -1, x.shape[-1]).mean(1)


def mean_shift(outs_f: list[torch.Tensor], outs_q: list[torch.Tensor], axis: int) -> torch.Tensor:
    """Per channel of ``axis``: the mean of ``q - f`` over the samples of the batches, shrunk by its
    standard error (positive-part James-Stein; see the module docstring)."""
    shifts = torch.cat([_per_sample(q, axis) - _per_sample(f, axis) for f, q in zip(outs_f, outs_q, strict=True)])
    mean = shifts.mean(0)
    if len(shifts) < 2:
        return mean
    se2 = shifts.var(0) / len(shifts)
    return mean * (1 - se2 / mean.pow(2).clamp_min(1e-300)).clamp_min(0)


def correct_biases(gm: GraphModule, batches: list[tuple], quant: QuantConfig) -> int:
    """Correct, in place, the bias of every conv / linear with a constant weight; returns how many."""
    written = written_nodes(gm)
    ctr = weight_observer(quant.weight_observer, quant.per_channel)
    quantized: dict[Node, list] = {}
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
                                   quant.weight_qmax).to(w.dtype)
        quantized[n] = [w_q, None if bias is None else attribute_tensor(gm, bias).detach()]
    if not quantized or not batches:
        return 0
    corrections: dict[Node, torch.Tensor] = {}
    with torch.no_grad():
        # the quantized run gets its own copies of the inputs: an in-place op must not reach the float run
        floats = [_Stepper(gm, b) for b in batches]
        quants = [_Stepper(gm, tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in b), quantized)
                  for b in batches]
        for n in gm.graph.nodes:
            if n.op == "output":
                break
            outs_f = [s.step(n) for s in floats]
            outs_q = [s.step(n) for s in quants]
            if n not in quantized:
                continue
            axis = _axis(n, outs_f[0])
            shift = mean_shift(outs_f, outs_q, axis)
            corrections[n] = shift
            shape = [1] * outs_q[0].dim()
            shape[axis] = -1
            for s in quants:  # later layers read the corrected output
                s.env[n] = s.env[n] - shift.to(s.env[n].dtype).reshape(shape)
    uses = Counter(n.target for n in gm.graph.nodes if n.op == "get_attr")
    for n, shift in corrections.items():
        bias = quantized[n][1]
        old = bias.to(torch.float64) if bias is not None else torch.zeros_like(shift)
        set_layer_bias(gm, n, old - shift, uses)
    gm.recompile()
    return len(corrections)
