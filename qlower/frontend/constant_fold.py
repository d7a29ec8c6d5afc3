"""Fold what an exported graph computes from constants alone into constants, before prepare_pt2e.

A weight computed in the graph from parameters (``weight_norm`` and other parametrizations, a
reshaped, transposed or concatenated weight) is otherwise not a get_attr when PT2E annotates it:
it is observed at every calibration batch, and its per-channel quantize stays a run-time op the
importer can't take. A position embedding interpolated from a parameter, or a Fourier encoding
built with ``arange``, is otherwise quantized op by op (PT2E annotates some of the pieces), so the
importer can't fold it and its integer arithmetic runs, and may overflow, at run time.

Here every node whose inputs are all constant (get_attr of a tensor nothing writes, deterministic
ATen ops on them, constructors such as ``arange``) is evaluated with PyTorch, once; each such node
that a non-constant node reads becomes a get_attr of its value, but for a constructor read
directly (``full(-inf)`` in a mask fill is what the quantizer recognises). An op whose result is a
model output stays in the graph (on constant inputs): the output's quantization is its own. The
values are what the graph computes (the same ops on the same tensors), so the float function is
unchanged, and everything downstream (BatchNorm folding, the quantizer, weight folding) sees
plain constants.
Checks on constants (``_assert_tensor_metadata`` ...) are run and, when they hold, removed.
"""

from __future__ import annotations

import operator

import torch
from torch.fx import GraphModule, Node
from torch.utils import _pytree as pytree

from qlower.frontend.constants import attribute_tensor, is_check, written_nodes

# deterministic by their tags but not by their values (uninitialised memory)
_UNDEFINED = {torch.ops.aten.empty, torch.ops.aten.empty_like, torch.ops.aten.empty_strided,
              torch.ops.aten.new_empty, torch.ops.aten.new_empty_strided}
# read only the shape and dtype of their first operand (YOLO's anchors: ``torch.full`` of a stride's ``.item()``
# traces as ``new_full`` of an activation): constant when the other operands are, at a static shape
_SHAPE_ONLY = {torch.ops.aten.new_full, torch.ops.aten.new_zeros, torch.ops.aten.new_ones,
               torch.ops.aten.full_like, torch.ops.aten.zeros_like, torch.ops.aten.ones_like}
MAX_FOLDED_ELEMENTS = 1 << 24  # a larger constant (an expand to a big shape) is left to compute


def fold_constant_subgraphs(gm: GraphModule) -> int:
    """Replace, in place, every constant expression a run-time op reads by a get_attr of its value;
    returns how many were replaced."""
    written = written_nodes(gm)
    values: dict[Node, object] = {}  # node -> its constant value (a tensor, or a tuple of tensors)
    checks = []
    for node in gm.graph.nodes:
        if node in written:
            continue
        if is_check(node):
            checks.append(node)
            continue
        if node.op == "call_function" and any(u.op == "output" for u in node.users):
            continue  # a model output stays an op: its quantization is the output's (QuantConfig.fixed)
        value = _evaluate(gm, node, values)
        if value is not None:
            values[node] = value
    removed = 0
    for node in reversed(checks):  # a check that holds on constants says nothing more (consumers first)
        if not node.users and all(a in values for a in node.all_input_nodes) and _holds(node, values):
            gm.graph.erase_node(node)
            removed += 1
    folded = 0
    for node, value in list(values.items()):
        if node.op == "get_attr" or not node.all_input_nodes or not isinstance(value, torch.Tensor):
            continue  # a parameter, or a constructor (full, arange: already a constant, and what rules match)
        if all(u in values for u in node.users):
            continue  # read by constants only: folded with them
        target = _free_name(gm, f"_folded_{node.name}")
        # a tensor of its own: a view of a parameter must not follow the parameter
        gm.register_buffer(target, value.detach().clone())
        with gm.graph.inserting_before(node):
            constant = gm.graph.get_attr(target)
        constant.meta.update(node.meta)  # source line, module path and the fake value PT2E reads
        node.replace_all_uses_with(constant)
        gm.graph.erase_node(node)
        constant.name = node.name  # as in the float graph (per-layer comparison matches by name)
        folded += 1
    if folded or removed:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return folded


def _evaluate(gm: GraphModule, node: Node, values: dict[Node, object]) -> object:
    """``node``'s value when it is computed from constants only, else None."""
    if node.op == "get_attr":
        try:
            return attribute_tensor(gm, node)
        except LookupError:
            return None
    if node.op != "call_function":
        return None
    target = node.target
    if target is operator.getitem:
        source = node.args[0]
        return values[source][node.args[1]] if source in values else None
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
        return None
    if (target.overloadpacket in _UNDEFINED or torch.Tag.nondeterministic_seeded in target.tags
            or target._schema.is_mutable):
        return None
    known = values
    if target.overloadpacket in _SHAPE_ONLY and node.args[0] not in values:
        fake = node.args[0].meta.get("val")
        if not isinstance(fake, torch.Tensor) or not all(isinstance(d, int) for d in fake.shape):
            return None
        known = {**values, node.args[0]: torch.zeros(fake.shape, dtype=fake.dtype)}  # its values are not read
    if not all(a in known for a in node.all_input_nodes):
        return None
    args, kwargs = pytree.tree_map_only(Node, known.__getitem__, (node.args, node.kwargs))
    try:
        with torch.no_grad():
            out = target(*args, **kwargs)
    except Exception:  # noqa: BLE001  (left to compute as before; whatever fails will fail there)
        return None
    if isinstance(out, torch.Tensor):
        return out if out.numel() <= MAX_FOLDED_ELEMENTS else None
    if isinstance(out, (bool, int, float)):
        return out  # ``.item()`` of a constant: folded into the constants that read it
    if isinstance(out, (tuple, list)) and out and all(isinstance(t, torch.Tensor) for t in out):
        return tuple(out) if sum(t.numel() for t in out) <= MAX_FOLDED_ELEMENTS else None
    return None


def _holds(node: Node, values: dict[Node, object]) -> bool:
    args, kwargs = pytree.tree_map_only(Node, values.__getitem__, (node.args, node.kwargs))
    try:
        node.target(*args, **kwargs)
    except Exception:  # noqa: BLE001  (a failing check is left where it is)
        return False
    return True


def _free_name(gm: GraphModule, name: str) -> str:
    candidate, i = name, 0
    while hasattr(gm, candidate):
        i += 1
        candidate = f"{name}_{i}"
    return candidate
