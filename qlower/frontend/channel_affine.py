"""``qlower::channel_affine``: an eval-mode BatchNorm that no conv/linear absorbed, as a per-channel affine map.

A BatchNorm after a conv / linear is folded into it (batch_norm_fold.py). A BatchNorm left after that
(after a pooling, an add, at the model's input ...) is rewritten, before annotation, into
``channel_affine(x, scale, shift) = x * scale[c] + shift[c]`` along dim 1, with
``scale = weight / sqrt(running_var + eps)`` and ``shift = bias - running_mean * scale``
(float64, stored as float32 buffers). Two reasons:

- the quantizer annotates it like any op that owns its output domain, and the importer turns
  it into integer ops (rules/normalization.py);
- no BatchNorm node is left for convert_pt2e, which otherwise spends more than a minute
  tracing QAT conv-bn folding patterns for every BatchNorm it finds.

The fake-quant model runs this op (in float32, like the eager BatchNorm up to rounding).
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule

from qlower.frontend.constants import attribute_tensor

aten = torch.ops.aten


@torch.library.custom_op("qlower::channel_affine", mutates_args=())
def channel_affine(input: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    shape = (1, -1) + (1,) * (input.dim() - 2)
    return input * scale.reshape(shape) + shift.reshape(shape)


@channel_affine.register_fake
def _channel_affine_fake(input: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(input)


def _constant(gm: GraphModule, node: object) -> torch.Tensor | None:
    value = attribute_tensor(gm, node)
    return None if value is None else value.detach().to(torch.float64)


def replace_unfolded_batch_norm(gm: GraphModule) -> GraphModule:
    """Rewrite, in place, every eval-mode ``aten.batch_norm`` with constant statistics into ``channel_affine``."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target != aten.batch_norm.default:
            continue
        x, weight, bias, mean, var, training, _momentum, eps = node.args[:8]
        if training or x.meta.get("val") is None or x.meta["val"].dim() < 2:
            continue
        try:
            w, b, m, v = (_constant(gm, a) for a in (weight, bias, mean, var))
        except LookupError:
            continue
        if m is None or v is None:
            continue
        scale = (w if w is not None else torch.ones_like(v)) / torch.sqrt(v + eps)
        shift = (b if b is not None else torch.zeros_like(v)) - m * scale
        names = []
        for kind, data in (("scale", scale), ("shift", shift)):
            name = f"_qlower_{node.name}_{kind}"
            gm.register_buffer(name, data.to(torch.float32))
            names.append(name)
        with gm.graph.inserting_before(node):
            getters = [gm.graph.get_attr(n) for n in names]
            for g, n in zip(getters, names):
                g.meta["val"] = getattr(gm, n)
            new = gm.graph.call_function(torch.ops.qlower.channel_affine.default, (x, *getters))
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()
    return gm
