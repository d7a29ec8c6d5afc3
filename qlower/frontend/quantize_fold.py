"""Fold the quantization of constants (the weights) into integer constants, after convert_pt2e.

``convert_pt2e(fold_quantize=True)`` does this with torchao's generic constant folder, which
interprets the whole graph to find the few quantize ops fed by constants (a tenth of a second on
MobileNetV2). Here only those ops' producer chains are evaluated, with the same rules: a chain
of get_attr and pure, deterministic ops on tensors (no constructor, no random op, nothing written
in place, no dequantize); each such quantize becomes a buffer ``_frozen_param<i>`` read by a
get_attr of the quantize op's own name, as torchao writes it.
"""

from __future__ import annotations

import functools

import torch
from torch.fx import GraphModule, Node
from torch.utils import _pytree as pytree

from qlower.frontend.constants import attribute_tensor, written_nodes


@functools.cache
def _quantize_ops() -> tuple[set, set]:
    """(quantize ops, dequantize ops); looked up when first needed: torchao registers them on import."""
    qd = torch.ops.quantized_decomposed
    return ({qd.quantize_per_tensor.default, qd.quantize_per_tensor.tensor, qd.quantize_per_channel.default},
            {qd.dequantize_per_tensor.default, qd.dequantize_per_tensor.tensor, qd.dequantize_per_channel.default})


def fold_constant_quantize(gm: GraphModule) -> int:
    """Replace, in place, every quantize op computed from constants only by its result; returns how many."""
    quantize_ops = _quantize_ops()[0]
    written = written_nodes(gm)
    values: dict[Node, torch.Tensor | None] = {}

    def value(node: Node) -> torch.Tensor | None:
        """``node``'s constant value, or None when it isn't one."""
        if node not in values:
            values[node] = _evaluate(gm, node, value) if node not in written else None
        return values[node]

    folded = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in quantize_ops:
            continue
        result = value(node)
        if result is None:
            continue
        count = getattr(gm, "_frozen_param_count", 0)
        while hasattr(gm, f"_frozen_param{count}"):
            count += 1
        qualname = f"_frozen_param{count}"
        gm._frozen_param_count = count + 1
        gm.register_buffer(qualname, result)
        with gm.graph.inserting_before(node):
            constant = gm.graph.create_node("get_attr", qualname)
        node.replace_all_uses_with(constant)
        constant.meta.update(node.meta)
        gm.graph.erase_node(node)
        constant.name = node.name
        folded += 1
    if folded:
        for node in list(gm.graph.find_nodes(op="get_attr")):
            if not node.users:
                if hasattr(gm, node.target):
                    delattr(gm, node.target)
                gm.graph.erase_node(node)
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return folded


def _evaluate(gm: GraphModule, node: Node, value) -> torch.Tensor | None:
    if node.op == "get_attr":
        try:
            return attribute_tensor(gm, node)
        except LookupError:
            return None
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    if node.target in _quantize_ops()[1] or torch.Tag.nondeterministic_seeded in node.target.tags:
        return None
    inputs = node.all_input_nodes
    if not inputs:
        return None  # a constructor: left to run
    known = {}
    for n in inputs:
        v = value(n)
        if v is None:
            return None
        known[n] = v
    args, kwargs = pytree.tree_map_only(Node, known.__getitem__, (node.args, node.kwargs))
    if not any(isinstance(a, torch.Tensor) for a in pytree.arg_tree_leaves(*args, **kwargs)):
        return None
    out = node.target(*args, **kwargs)
    return out if isinstance(out, torch.Tensor) else None
