"""Import a torch GraphModule into the qlower IR.

The input is either the converted PT2E module (quantize/dequantize nodes around
every quantized edge) or the exported float module. Quantize/dequantize pairs
are folded into the types of IR values: a tensor observed as ``q(s, zp) → dq``
becomes an int8 value with that QuantSpec. Graph inputs stay float32 in PyTorch
layout (an explicit ``quantize`` follows when the model quantizes them); graph
outputs are dequantized to float32 in PyTorch layout, so the IR program takes
and returns exactly what the PyTorch model does.

Constant subgraphs that involve no quantization (``torch.ones(...) * 0.5``,
reshapes of buffers) are evaluated with PyTorch at import time; quantized
constants stay IR constants, so constant folding of quantized arithmetic is
left to the passes.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np
import torch
from torch.fx import GraphModule, Node
from torch.fx.operator_schemas import normalize_function
from torch.utils import _pytree as pytree

from qlower.errors import UnsupportedOpError
from qlower.frontend import layout
from qlower.frontend.constants import is_check
from qlower.frontend.context import ImportContext, Ref
from qlower.frontend.decompose import KEEP_META, decomposition
from qlower.frontend.fallback import can_fall_back, import_fallback, ir_type, plain_integer_constant
from qlower.frontend.rules import load_all, rule_for
from qlower.ir import DType, Graph, TensorType, Value, verify_graph

# creation ops are folded; anything random is not a constant
_NOT_FOLDABLE = {torch.ops.aten.rand, torch.ops.aten.randn, torch.ops.aten.randint, torch.ops.aten.dropout,
                 torch.ops.aten.bernoulli, torch.ops.aten.normal, torch.ops.aten.empty}


@dataclass(frozen=True)
class Imported:
    """The IR graph and, per fx node name, the IR value holding that node's result and its layout."""

    graph: Graph
    node_values: dict[str, tuple[Value, layout.Perm]]
    float_reasons: tuple[str, ...] = ()  # ops an integer rule could not take, each with its reason


def _normalized(node: Node) -> tuple[tuple, dict] | None:
    target = node.target
    if isinstance(target, torch._ops.OpOverloadPacket):
        target = target.default
    if not isinstance(target, torch._ops.OpOverload):
        return None
    pair = normalize_function(target, node.args, node.kwargs, normalize_to_only_use_kwargs=True)
    return None if pair is None else (pair.args, pair.kwargs)


def _foldable(ctx: ImportContext, node: Node) -> bool:
    """Pure ATen computation on constants only (float, bool or integer; no quantization involved)."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
        return False
    if target.overloadpacket in _NOT_FOLDABLE:
        return False
    inputs = node.all_input_nodes
    return all(isinstance(ctx.env.get(a), Ref) and ctx.env[a].is_const and ctx.env[a].quant is None for a in inputs)


def _fold_float(ctx: ImportContext, node: Node) -> Ref | tuple[Ref, ...]:
    result = ctx.fold(node, {a: torch.from_numpy(np.array(ctx.env[a].data)) for a in node.all_input_nodes})
    if isinstance(result, (tuple, list)) and result and all(isinstance(r, torch.Tensor) for r in result):
        return tuple(_constant_of(ctx, node, r) for r in result)  # split, unbind ... of a constant
    if isinstance(result, (bool, int, float)):
        return result  # ``.item()`` of a constant: its readers' rules take it as they take a literal scalar
    if not isinstance(result, torch.Tensor):
        raise ctx.unsupported("a constant expression that doesn't produce a tensor")
    return _constant_of(ctx, node, result)


def _constant_of(ctx: ImportContext, node: Node, result: torch.Tensor) -> Ref:
    data = result.detach().contiguous().numpy().copy()
    return Ref.constant(data.astype(np.float32) if data.dtype.kind == "f" else data, origin=ctx.origin_of(node))


def _call_rule(ctx: ImportContext, node: Node) -> object:
    rule = rule_for(node.target)
    if rule is None:
        return _fall_back(ctx, node, "qlower has no import rule for this op")

    def lookup(a: object) -> object:
        return ctx.env[a] if isinstance(a, Node) else a

    normalized = _normalized(node)
    try:
        if normalized is None:
            args = pytree.tree_map(lookup, node.args)
            kwargs = pytree.tree_map(lookup, dict(node.kwargs))
            return rule(ctx, node, *args, **kwargs)
        _, kwargs = normalized
        kwargs = {k: pytree.tree_map(lookup, v) for k, v in kwargs.items()}
        return rule(ctx, node, **kwargs)
    except UnsupportedOpError as e:
        if ctx.fallback != "float":
            raise
        ctx.float_reasons.append(str(e))
        ctx.node = node
        if can_fall_back(node):
            return import_fallback(ctx, node)
        pieces = _import_decomposed(ctx, node)
        if pieces is None:
            raise
        return pieces


def _import_decomposed(ctx: ImportContext, node: Node) -> object | None:
    """A non-core op whose rule can't take this case, imported as PyTorch's decomposition of it, in
    float (its pieces are not quantized: each becomes a float op or a core ATen fallback)."""
    def example_of(a: Node) -> torch.Tensor | None:
        ref = ctx.env.get(a)
        if not isinstance(ref, Ref):
            return None
        plain = ref.spec is not None and ref.spec.is_plain_integer and ref.scale is None
        bool_value = not ref.is_const and ref.value.dtype is DType.BOOL
        dtype = torch.int64 if plain else torch.bool if bool_value else torch.float32
        return torch.zeros(ref.torch_shape, dtype=dtype)

    found = decomposition(node, example_of)
    if found is None:
        return None
    module, inputs, out_spec = found
    placeholders = iter(inputs)
    leaves: list[object] = []
    for sub in module.graph.nodes:
        if sub.op == "placeholder":
            ref = ctx.env[next(placeholders)]
            ctx.env[sub] = Ref.of(ctx.as_float(ref), ref.perm) if isinstance(ref, Ref) and ref.is_quantized \
                and not (ref.spec.is_plain_integer and ref.scale is None) else ref
        elif sub.op == "get_attr":
            ctx.env[sub] = _get_attr(ctx, sub, module)
        elif sub.op == "call_function":
            for k in KEEP_META:  # errors and origins name the user's line, not the decomposition's
                if k in node.meta:
                    sub.meta[k] = node.meta[k]
            ctx.node = sub
            foldable = sub.target is not operator.getitem and _foldable(ctx, sub)
            ctx.env[sub] = _fold_float(ctx, sub) if foldable else _call_rule(ctx, sub)
        elif sub.op == "output":
            leaves = [ctx.env[a] if isinstance(a, Node) else a for a in pytree.tree_leaves(sub.args[0])]
    ctx.node = node
    return pytree.tree_unflatten(leaves, out_spec)


def _fall_back(ctx: ImportContext, node: Node, reason: str) -> object:
    """An op without a rule: a float fallback, or the clear refusal the user asked for."""
    if ctx.fallback == "float" and can_fall_back(node):
        return import_fallback(ctx, node)
    if ctx.fallback == "float":
        reason += (" and it is not a deterministic op of PyTorch's core ATen set that could run in float on "
                   "the host")
    else:
        reason += " (QuantConfig(fallback='error'); fallback='float' would run it in float on the host)"
    raise ctx.unsupported(reason + "; rewrite the model to use supported ops (see qlower.frontend.rules) "
                          "or leave this part out of the exported model")


def _placeholder(ctx: ImportContext, node: Node) -> Ref:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise ctx.unsupported("graph inputs must be tensors", node)
    if val.dtype == torch.float32:
        ir_t = TensorType(tuple(val.shape), DType.FLOAT32)
    else:
        try:
            ir_t = ir_type(val)  # token ids, indices and masks enter as plain integers / bools
        except TypeError:
            ir_t = None
        if ir_t is None or ir_t.dtype is DType.FLOAT32:
            raise ctx.unsupported(f"graph inputs must be float32, integer or bool tensors, got {val.dtype}", node)
    value = ctx.b.input(node.name, ir_t, origin=ctx.origin_of(node))
    return Ref.of(value, layout.identity(val.dim()))


def _get_attr(ctx: ImportContext, node: Node, owner: torch.nn.Module | None = None) -> Ref:
    data = ctx.attr(node.target, owner)
    if not isinstance(data, torch.Tensor):
        raise ctx.unsupported(f"attribute '{node.target}' is a {type(data).__name__}, not a tensor", node)
    array = data.detach().contiguous().numpy().copy()
    if array.dtype.kind == "f":
        array = array.astype(np.float32)
    return Ref.constant(array, origin=ctx.origin_of(node))


def _outputs(ctx: ImportContext, node: Node) -> list[Value]:
    leaves, _ = pytree.tree_flatten(node.args[0])
    outputs = []
    for leaf in leaves:
        if not isinstance(leaf, Node):
            raise ctx.unsupported(f"model outputs must be tensors, got {leaf!r}", node)
        ref = ctx.ref(leaf)
        ctx.node = leaf
        identity = layout.identity(ref.rank)
        plain = ref.spec is not None and ref.spec.is_plain_integer and ref.scale is None
        if ref.is_const and ref.quant is None and ref.data.dtype.kind in "biu":
            outputs.append(ctx.constant(ref.data.astype(np.bool_)) if ref.data.dtype.kind == "b"
                           else plain_integer_constant(ctx, ref.data))
        elif plain or (not ref.is_const and ref.value.dtype is DType.BOOL):
            outputs.append(ctx.value_in(ref, identity))  # integer and bool results stay what they are
        else:
            outputs.append(ctx.as_float(ref, identity))
    return outputs


def import_graph(gm: GraphModule, name: str = "main", fallback: str = "float") -> Imported:
    """Translate ``gm`` into a verified IR graph (see the module docstring for the contract).

    ``fallback="float"``: an op without an integer rule becomes a float ``aten`` op on the host;
    ``"error"``: it is refused with an UnsupportedOpError naming the op and the source line.
    """
    load_all()
    ctx = ImportContext(gm, name, fallback)
    outputs: list[Value] = []
    for node in gm.graph.nodes:
        ctx.node = node
        if node.op == "placeholder":
            ctx.env[node] = _placeholder(ctx, node)
        elif node.op == "get_attr":
            ctx.env[node] = _get_attr(ctx, node)
        elif node.op == "call_module":
            if not str(node.target).startswith("_guards"):
                raise ctx.unsupported("calls to submodules are not supported in an exported graph")
        elif is_check(node):
            ctx.env[node] = None  # an export-time check: nothing to compute, constant inputs or not
        elif node.op == "call_function":
            if node.target is not operator.getitem and _foldable(ctx, node):
                ctx.env[node] = _fold_float(ctx, node)
            else:
                ctx.env[node] = _call_rule(ctx, node)
        elif node.op == "output":
            outputs = _outputs(ctx, node)
        else:
            raise ctx.unsupported(f"fx node kind '{node.op}' is not supported", node)
    graph = verify_graph(ctx.b.build(outputs), after="import")
    defined = set(graph.values())
    node_values = {}
    for node, entry in ctx.env.items():
        if isinstance(entry, Ref) and entry.value is not None and entry.value in defined:
            node_values[node.name] = (entry.value, entry.perm)
    return Imported(graph, node_values, tuple(ctx.float_reasons))
