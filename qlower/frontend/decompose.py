"""Decompose composite ops that qlower has no rule for, before quantization.

An exported graph keeps high-level ops (``aten.lstm``, ``aten.layer_norm``,
``aten.chunk``, ``aten.linalg_vector_norm`` ...). When qlower has no import rule
for such an op and it is not in PyTorch's core ATen op set, it is replaced by
PyTorch's own decomposition (what ``ExportedProgram.run_decompositions`` does
for that op alone), spliced in place. This runs before PT2E annotates the
graph, so the pieces (linear, sigmoid, tanh, mul, ...) are quantized and
imported by their integer rules wherever those exist; what is left becomes a
core ATen float fallback. Nothing else in the graph changes.

The spliced nodes keep the replaced node's source location and module path, so
every message about them still names the user's line.
"""

from __future__ import annotations

import collections
import operator
import warnings
from collections.abc import Callable
from operator import attrgetter

import torch
from torch import nn
from torch.fx import GraphModule, Node
from torch.utils import _pytree as pytree

KEEP_META = ("stack_trace", "nn_module_stack", "source_fn_stack", "from_node", "torch_fn")
MAX_ROUNDS = 4


def _decomposition_of(target: torch._ops.OpOverload) -> dict:
    """The decomposition of ``target``: qlower's own (decompositions.py), else export's default table,
    else torch._decomp's."""
    from torch._decomp import decomposition_table

    from qlower.frontend.decompositions import QLOWER_DECOMPOSITIONS

    for table in (QLOWER_DECOMPOSITIONS, torch.export.default_decompositions(), decomposition_table):
        if target in table:
            return {target: table[target]}
    if torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), "CompositeImplicitAutograd"):
        return {target: target.decompose}  # export keeps some (linear, conv2d) unless asked
    return {}


def decomposition(node: Node, example_of: Callable[[Node], torch.Tensor | None] | None = None
                  ) -> tuple[GraphModule, list[Node], object] | None:
    """The op of ``node`` alone, exported and decomposed: (module, its tensor inputs, output spec).
    ``example_of`` gives an input's shape and dtype where the graph has no metadata for it (the
    quantize/dequantize nodes PT2E writes)."""
    target = node.target
    flat, spec = pytree.tree_flatten((node.args, node.kwargs))
    where = [i for i, a in enumerate(flat) if isinstance(a, Node)]
    inputs = [flat[i] for i in where]
    vals = [n.meta.get("val") if isinstance(n.meta.get("val"), torch.Tensor) or example_of is None
            else example_of(n) for n in inputs]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        return None

    class Call(nn.Module):
        def forward(self, *tensors):
            leaves = list(flat)
            for i, t in zip(where, tensors):
                leaves[i] = t
            args, kwargs = pytree.tree_unflatten(leaves, spec)
            return target(*args, **kwargs)

    key = _signature(target, flat, where, vals)
    if key is not None and key in _DECOMPOSED:
        _DECOMPOSED.move_to_end(key)
        found = _DECOMPOSED[key]
        return None if found is None else (found[0], inputs, found[1])
    examples = tuple(torch.zeros(tuple(v.shape), dtype=v.dtype) for v in vals)
    found = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.export.export(Call(), examples, strict=False)
            program = program.run_decompositions(_decomposition_of(target))
        module = program.module(check_guards=False)
        if not any(n.target == target for n in module.graph.nodes):
            found = (module, program.call_spec.out_spec)
    except Exception:  # noqa: BLE001  (no decomposition: the op stays as it is)
        pass
    if key is not None:
        _DECOMPOSED[key] = found
        while len(_DECOMPOSED) > MAX_REMEMBERED:
            _DECOMPOSED.popitem(last=False)
    return None if found is None else (found[0], inputs, found[1])


# A decomposition costs an export and run_decompositions (about a second, mostly fixed costs):
# each op signature is decomposed once, not once per node (a model's 16 LayerNorms: 31 s -> 2 s).
# The module is only read by _splice (nodes copied, constants cloned), so it can be shared.
MAX_REMEMBERED = 256
_DECOMPOSED: collections.OrderedDict[tuple, tuple[GraphModule, object] | None] = collections.OrderedDict()


def _signature(target: object, flat: list, where: list[int], vals: list[torch.Tensor]) -> tuple | None:
    """What the op's decomposition depends on: the op, its non-tensor arguments, its tensor
    inputs' shapes and dtypes; None when an argument can't be a key."""
    tensors = dict(zip(where, vals))

    def leaf(i: int, a: object) -> object:
        if i in tensors:
            return ("tensor", tuple(tensors[i].shape), tensors[i].dtype)
        return (type(a).__name__, tuple(a) if isinstance(a, list) else a)

    key = (target, tuple(leaf(i, a) for i, a in enumerate(flat)))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _splice(gm: GraphModule, node: Node, module: GraphModule, inputs: list[Node], out_spec) -> None:
    graph = gm.graph
    env: dict[Node, Node] = {}
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    env.update(zip(placeholders, inputs))
    meta = {k: node.meta[k] for k in KEEP_META if k in node.meta}
    outputs = None
    with graph.inserting_before(node):
        for n in module.graph.nodes:
            if n.op == "placeholder":
                continue
            if n.op == "output":
                outputs = [env[a] if isinstance(a, Node) else a for a in pytree.tree_leaves(n.args[0])]
                continue
            if n.op == "get_attr":
                name = f"_qlower_decomposed_{len(list(gm.named_buffers())) + len(env)}_{n.target.replace('.', '_')}"
                value = attrgetter(n.target)(module)
                gm.register_buffer(name, value.detach().clone() if isinstance(value, torch.Tensor) else value)
                new = graph.get_attr(name)
                new.meta.update(n.meta)
            else:
                new = graph.node_copy(n, lambda a: env[a])
                for k in KEEP_META:  # where the user wrote the op, never this module's wrapper
                    new.meta.pop(k, None)
                new.meta.update(meta)
            env[n] = new
    structure = pytree.tree_unflatten(outputs, out_spec) if out_spec is not None else outputs
    _replace_uses(graph, node, structure)


def _replace_uses(graph, node: Node, structure: object) -> None:
    """Point every use of ``node`` (directly, or through getitem chains) at the matching new node."""
    if isinstance(structure, Node):
        node.replace_all_uses_with(structure)
        graph.erase_node(node)
        return
    for user in list(node.users):
        if user.op == "call_function" and user.target is operator.getitem:
            _replace_uses(graph, user, structure[user.args[1]])
    if not node.users:
        graph.erase_node(node)


def decompose_unruled(gm: GraphModule, has_rule: Callable[[object], bool]) -> GraphModule:
    """Replace, in place, every aten op that has no qlower rule and isn't core ATen by its decomposition."""
    for _ in range(MAX_ROUNDS):
        changed = False
        for node in list(gm.graph.nodes):
            target = node.target
            if (node.op != "call_function" or not isinstance(target, torch._ops.OpOverload)
                    or target.namespace != "aten" or has_rule(target) or torch.Tag.core in target.tags):
                continue
            found = decomposition(node)
            if found is not None:
                _splice(gm, node, *found)
                changed = True
        if not changed:
            break
        gm.graph.lint()
        gm.recompile()
    return gm
