"""The constants of an exported module: the tensor a get_attr reads, which nodes ops write in place,
and which nodes are only checks.

BatchNorm folding, channel_affine, constant folding, weight-quantization folding and the
once-observers of calibration all need to know that a value is a tensor attribute, and that
nothing changes it. Checks (``_assert_tensor_metadata``, ``_assert_scalar``, ``sym_constrain_range``
...) are what torch.export records about the traced values: they compute nothing any later op
reads, so they never make a constant expression non-constant or a model unimportable.
"""

from __future__ import annotations

from operator import attrgetter

import torch
from torch.fx import GraphModule, Node

_aten = torch.ops.aten
CHECKS = frozenset({
    _aten._assert_tensor_metadata, _aten._assert_scalar, _aten._assert_async, _aten.sym_constrain_range,
    _aten.sym_constrain_range_for_size, _aten._functional_assert_async, _aten._functional_assert_scalar,
    _aten._functional_sym_constrain_range, _aten._functional_sym_constrain_range_for_size})


def is_check(node: Node) -> bool:
    """An export-time check (or its functional form, whose result is only a token for other checks)."""
    target = node.target
    return node.op == "call_function" and getattr(target, "overloadpacket", target) in CHECKS


def attribute_tensor(gm: GraphModule, node: object) -> torch.Tensor | None:
    """The tensor the get_attr ``node`` reads (None for None); LookupError for anything else."""
    if node is None:
        return None
    if not isinstance(node, Node) or node.op != "get_attr":
        raise LookupError(node)
    value = attrgetter(node.target)(gm)
    if not isinstance(value, torch.Tensor):
        raise LookupError(node)
    return value


def set_attribute_tensor(gm: GraphModule, target: str, value: torch.Tensor) -> None:
    """Replace the attribute ``target`` of ``gm`` with ``value`` in its old dtype, a frozen Parameter
    where it was a Parameter (the weight rewrites: equalization, SmoothQuant, bias correction)."""
    owner, _, name = target.rpartition(".")
    old = getattr(gm.get_submodule(owner), name)
    new = value.to(old.dtype)
    setattr(gm.get_submodule(owner), name,
            torch.nn.Parameter(new, requires_grad=False) if isinstance(old, torch.nn.Parameter) else new)


def owned_attribute(node: object, attr_uses: dict[str, int]) -> bool:
    """``node`` is a get_attr whose attribute nothing else reads (``attr_uses``: get_attr nodes per target)."""
    return isinstance(node, Node) and node.op == "get_attr" and attr_uses[node.target] == 1 and len(node.users) == 1


def set_layer_bias(gm: GraphModule, layer: Node, value: torch.Tensor, attr_uses: dict[str, int]) -> None:
    """The bias of the conv / linear ``layer`` (argument 2) becomes ``value``: written in place where
    the layer alone reads its bias attribute, else (no bias, or one shared) a new attribute of its own."""
    bias = layer.args[2] if len(layer.args) > 2 else None
    if owned_attribute(bias, attr_uses):
        set_attribute_tensor(gm, bias.target, value)
        return
    dtype = attribute_tensor(gm, layer.args[1]).dtype
    name = f"{layer.name}_own_bias"
    gm.register_buffer(name, value.detach().to(dtype).clone())
    with gm.graph.inserting_before(layer):
        node = gm.graph.get_attr(name)
    fake_mode = getattr(layer.meta.get("val"), "fake_mode", None)
    tensor = getattr(gm, name)
    node.meta["val"] = fake_mode.from_tensor(tensor, static_shapes=True) if fake_mode is not None else tensor
    layer.args = (*layer.args[:2], node, *layer.args[3:])


def written_nodes(gm: GraphModule) -> set[Node]:
    """Nodes some op writes in place (an argument its schema marks as written), and what they are
    views of: not constants."""
    written: set[Node] = set()
    for node in gm.graph.nodes:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is None:
            continue
        for arg, a in zip(schema.arguments, node.args):
            if isinstance(a, Node) and arg.alias_info is not None and arg.alias_info.is_write:
                while isinstance(a, Node) and a not in written:
                    written.add(a)
                    a = _viewed(a)
    return written


def _viewed(node: Node) -> Node | None:
    """The tensor ``node`` is a view of (its first argument aliases the result), else None."""
    schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
    if schema is None or not schema.arguments or not node.args or schema.arguments[0].alias_info is None:
        return None
    return node.args[0] if isinstance(node.args[0], Node) else None
