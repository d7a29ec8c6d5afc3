"""Fold eval-mode BatchNorms into the conv / linear that feeds them, before prepare_pt2e.

prepare_pt2e folds them itself, but torchao 0.18's fold
- sweeps the whole graph for dead code after every BatchNorm (O(nodes x BatchNorms):
  a quarter of a second of MobileNetV2's compile);
- folds into a conv whose result has other readers too, which then silently read the
  normalised value;
- drops the BatchNorm of a second conv that shares the first one's weight ("fake fuse").

Here every ``conv -> batch_norm`` (and ``linear -> batch_norm`` on a 2-D input, where both
act on the same dimension) is folded with torch's own ``fuse_*_bn_weights``, so the weights,
and so the quantization parameters, are those torchao computes. A conv that is the
BatchNorm's only reader and owns its weight and bias is rewritten in place, as torchao does;
otherwise the fused conv is a new node with weights of its own, and the original keeps
serving its other readers. torchao's fold then finds nothing left to fold.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.fx import GraphModule, Node
from torch.nn.utils.fusion import fuse_conv_bn_weights, fuse_linear_bn_weights

from qlower.frontend.constants import attribute_tensor

aten = torch.ops.aten

CONVS = {aten.conv1d.default, aten.conv1d.padding, aten.conv2d.default, aten.conv2d.padding,
         aten.conv3d.default, aten.conv3d.padding}
TRANSPOSED_CONVS = {aten.conv_transpose1d.default, aten.conv_transpose2d.input, aten.conv_transpose3d.input}


def fold_batch_norms(gm: GraphModule) -> int:
    """Fold, in place, every eval-mode BatchNorm read from a conv / linear with constant
    parameters; returns how many were folded."""
    attr_uses = Counter(n.target for n in gm.graph.nodes if n.op == "get_attr")
    folded = 0
    for bn in list(gm.graph.nodes):
        if bn.op != "call_function" or bn.target != aten.batch_norm.default or bn.args[5]:  # args[5]: training
            continue
        gemm = bn.args[0]
        if not isinstance(gemm, Node) or not _foldable(gemm):
            continue
        weight, bias = gemm.args[1], gemm.args[2] if len(gemm.args) > 2 else None
        try:
            w, b = attribute_tensor(gm, weight), attribute_tensor(gm, bias)
            bn_w, bn_b, mean, var = (attribute_tensor(gm, a) for a in bn.args[1:5])
        except LookupError:
            continue
        if mean is None or var is None:
            continue
        eps = bn.args[7]
        if gemm.target == aten.linear.default:
            bn_w = torch.ones_like(var) if bn_w is None else bn_w
            bn_b = torch.zeros_like(var) if bn_b is None else bn_b
            fused_w, fused_b = fuse_linear_bn_weights(w, b, mean, var, eps, bn_w, bn_b)
        else:
            fused_w, fused_b = fuse_conv_bn_weights(w, b, mean, var, eps, bn_w, bn_b,
                                                    transpose=gemm.target in TRANSPOSED_CONVS)
        owned = len(gemm.users) == 1 and all(p is None or attr_uses[p.target] == 1 and len(p.users) == 1
                                             for p in (weight, bias))
        if owned:
            _set_attr(gm, weight.target, fused_w)
            if bias is not None:
                _set_attr(gm, bias.target, fused_b)
            else:
                bias = _new_attr(gm, gemm, gemm, weight.target + "_bias", fused_b)
                gemm.args = (*gemm.args[:2], bias, *gemm.args[3:])
            bn.replace_all_uses_with(gemm)
        else:
            w_node = _new_attr(gm, bn, gemm, f"{weight.target}_{bn.name}", fused_w)
            b_node = _new_attr(gm, bn, gemm, f"{weight.target}_{bn.name}_bias", fused_b)
            with gm.graph.inserting_before(bn):
                fused = gm.graph.call_function(gemm.target, (gemm.args[0], w_node, b_node, *gemm.args[3:]),
                                               dict(gemm.kwargs))
            fused.meta.update(gemm.meta)
            bn.replace_all_uses_with(fused)
        gm.graph.erase_node(bn)
        folded += 1
    if folded:
        gm.graph.eliminate_dead_code()  # the BatchNorms' parameters
        gm.recompile()
    return folded


def _foldable(gemm: Node) -> bool:
    if gemm.op != "call_function":
        return False
    if gemm.target in CONVS or gemm.target in TRANSPOSED_CONVS:
        return True
    # linear acts on the last dim, BatchNorm on dim 1: the same only for a 2-D input
    x = gemm.args[0]
    return (gemm.target == aten.linear.default and isinstance(x, Node)
            and isinstance(x.meta.get("val"), torch.Tensor) and x.meta["val"].dim() == 2)


def _set_attr(gm: GraphModule, target: str, value: torch.nn.Parameter) -> None:
    owner, _, name = target.rpartition(".")
    setattr(gm.get_submodule(owner), name, value)


def _new_attr(gm: GraphModule, before: Node, gemm: Node, target: str, value: torch.nn.Parameter) -> Node:
    """A get_attr of a new parameter ``target``; its "val" is a fake tensor of ``gemm``'s fake mode, as
    torch.export's (and torchao's fold) are."""
    _set_attr(gm, target, value)
    with gm.graph.inserting_before(before):
        node = gm.graph.get_attr(target)
    fake_mode = getattr(gemm.meta.get("val"), "fake_mode", None)
    node.meta["val"] = fake_mode.from_tensor(value, static_shapes=True) if fake_mode is not None else value.detach()
    return node
