"""The state an import rule works with: fx node results as IR references, and the helpers every rule
shares (layout requests, constants, quantization look-ahead, requantization through ``rescale``).

Shared concerns live here once, so that a rule is only the translation of its op:
- layout: ``value_in(ref, perm)`` emits a transpose only when a rule asks for an
  order the value isn't in (cached, so a value is transposed at most once per layout);
- constants stay NumPy data in PyTorch order until a consumer places them;
- quantization: ``out_spec(node)`` reads the QuantSpec of the quantize node(s)
  consuming a node, ``requant`` rescales a result into it. Multipliers are never
  computed here: every change of scale is an IR ``rescale``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from operator import attrgetter

import numpy as np
import torch
from torch.fx import Node

from qlower.errors import UnsupportedOpError
from qlower.frontend import layout
from qlower.frontend.layout import Perm
from qlower.frontend.quantizer import ACTIVATIONS, packet
from qlower.frontend.source import describe_node, module_path, source_location
from qlower.ir import DType, GraphBuilder, Origin, QuantSpec, Value

QD = torch.ops.quantized_decomposed
_TORCH_DTYPES = {torch.int8: DType.INT8, torch.uint8: DType.UINT8, torch.int16: DType.INT16, torch.int32: DType.INT32}


def ir_dtype(dtype: torch.dtype) -> DType:
    try:
        return _TORCH_DTYPES[dtype]
    except KeyError:
        raise UnsupportedOpError(f"quantized dtype {dtype} is not supported (int8, uint8, int16, int32 are)") from None


def spec_from_qparams(scale: float, zero_point: int, qmin: int, qmax: int, dtype: torch.dtype) -> QuantSpec:
    return QuantSpec.per_tensor(float(scale), int(zero_point), ir_dtype(dtype), int(qmin), int(qmax))


@dataclass(frozen=True)
class Ref:
    """An fx node's result during import.

    Either an IR ``value`` whose layout is ``perm`` (see layout.py), or constant
    ``data`` in PyTorch order that is not emitted until a consumer places it.
    Integer constants carry their ``quant`` (a per-channel axis counts in PyTorch
    order). Dynamically quantized codes carry their run-time ``scale`` value.
    """

    value: Value | None = None
    perm: Perm = ()
    data: np.ndarray | None = None
    quant: QuantSpec | None = None
    scale: Value | None = None
    origin: Origin | None = None

    @staticmethod
    def of(value: Value, perm: Perm, scale: Value | None = None) -> Ref:
        return Ref(value=value, perm=tuple(perm), scale=scale)

    @staticmethod
    def constant(data: np.ndarray, quant: QuantSpec | None = None, origin: Origin | None = None) -> Ref:
        data = np.asarray(data)
        return Ref(data=data, perm=layout.identity(data.ndim), quant=quant, origin=origin)

    @property
    def is_const(self) -> bool:
        return self.data is not None

    @property
    def spec(self) -> QuantSpec | None:
        return self.value.quant if self.value is not None else self.quant

    @property
    def is_quantized(self) -> bool:
        return self.spec is not None

    @property
    def is_float_const(self) -> bool:
        return self.is_const and self.quant is None and self.data.dtype.kind == "f"

    @property
    def rank(self) -> int:
        return len(self.perm)

    @property
    def torch_shape(self) -> tuple[int, ...]:
        if self.is_const:
            return tuple(self.data.shape)
        return layout.torch_shape(self.value.shape, self.perm)


def _located(node: Node, depth: int = 4) -> Node:
    """``node``, or when it has no source line (the quantize / dequantize nodes PT2E inserts) the nearest
    node that has one: a reader first (the conv a weight's quantize feeds), else an input."""
    if source_location(node):
        return node
    seen, frontier = {node}, [node]
    for _ in range(depth):
        frontier = [m for n in frontier for m in (*n.users, *n.all_input_nodes) if m not in seen]
        seen.update(frontier)
        found = next((m for m in frontier if source_location(m)), None)
        if found is not None:
            return found
    return node


class ImportContext:
    """Builder, environment and shared helpers of one import."""

    def __init__(self, graph_module: torch.fx.GraphModule, name: str = "main", fallback: str = "float") -> None:
        self.gm = graph_module
        self.fallback = fallback
        self.b = GraphBuilder(name)
        self.env: dict[Node, object] = {}
        self.node: Node | None = None
        self._placed: dict[tuple[Value, Perm], Value] = {}
        self._floats: dict[tuple[Value, Perm], Value] = {}
        self._consts: dict[tuple[int, Perm], tuple[Ref, Value]] = {}
        self.memo: dict[object, object] = {}  # rules' own caches (e.g. one dynamic_quantize per source)
        self.float_reasons: list[str] = []  # why a rule could not make an op integer (it runs in float)

    # -- lookups ---------------------------------------------------------------------------
    def ref(self, node: Node) -> Ref:
        entry = self.env[node]
        if not isinstance(entry, Ref):
            raise self.unsupported(f"'{node.name}' ({node.target}) is used as a tensor but isn't one here")
        return entry

    def attr(self, target: str, owner: torch.nn.Module | None = None) -> object:
        return attrgetter(target)(self.gm if owner is None else owner)

    def origin_of(self, node: Node | None, perm: Perm | None = None) -> Origin:
        if node is None:
            return Origin(layout=layout.origin_layout(perm) if perm else None)
        return Origin(node=node.name, module=module_path(node), source=source_location(node),
                      layout=layout.origin_layout(perm) if perm else None)

    def unsupported(self, reason: str, node: Node | None = None) -> UnsupportedOpError:
        node = node or self.node
        if node is None:
            return UnsupportedOpError(reason)
        op = str(node.target) if node.op == "call_function" else f"{node.op} {node.target}"
        return UnsupportedOpError(f"{op} (node '{node.name}') {describe_node(_located(node))}: {reason}")

    # -- emission ----------------------------------------------------------------------------
    def emit(self, kind: str, *operands, perm: Perm, origin: Origin | None = None, **attrs) -> Value:
        """Append an IR op for the current node; its result has layout ``perm``."""
        origin = origin or self.origin_of(self.node, perm)
        return self.b.op(kind, *operands, name=origin.node or kind, origin=origin, **attrs)

    def emit_multi(self, kind: str, *operands, perm: Perm, **attrs) -> tuple[Value, ...]:
        origin = self.origin_of(self.node, perm)
        return self.b.op(kind, *operands, name=origin.node or kind, origin=origin, **attrs)

    def constant(self, data: np.ndarray, quant: QuantSpec | None = None, perm: Perm | None = None,
                 origin: Origin | None = None, name: str | None = None) -> Value:
        """Emit a constant given in PyTorch order, laid out as ``perm``."""
        ref = Ref.constant(data, quant, origin)
        return self.place_constant(ref, ref.perm if perm is None else tuple(perm), name)

    def place_constant(self, ref: Ref, perm: Perm, name: str | None = None) -> Value:
        """Emit constant ``ref`` laid out as ``perm`` (once per layout); ``name`` is a printing hint."""
        key = (id(ref.data), perm)
        hit = self._consts.get(key)
        if hit is not None and hit[0].data is ref.data and hit[0].quant == ref.quant:
            return hit[1]
        quant = ref.quant
        if quant is not None:
            data = ref.data.astype(quant.dtype.numpy)
            if quant.is_per_channel:
                quant = quant.with_axis(perm.index(quant.axis))
        elif ref.data.dtype.kind == "f":
            data = ref.data.astype(np.float32)
        elif ref.data.dtype.kind == "b":  # a mask (read by a float fallback such as where)
            data = ref.data
        else:
            raise self.unsupported(f"an integer constant ({ref.data.dtype}) without quantization can't be imported")
        origin = ref.origin or self.origin_of(self.node)
        if not origin.module and self.node is not None:  # a parameter: where its first consumer is
            consumer = self.origin_of(self.node)
            origin = replace(origin, module=consumer.module, source=origin.source or consumer.source)
        origin = replace(origin, layout=layout.origin_layout(perm))
        value = self.b.constant(layout.permute_array(data, perm), quant, name=name or origin.node or "const",
                                origin=origin)
        self._consts[key] = (ref, value)
        return value

    # -- layout ------------------------------------------------------------------------------
    def value_in(self, ref: Ref, perm: Perm | None = None) -> Value:
        """``ref`` as an IR value in layout ``perm`` (its own layout when None)."""
        perm = tuple(ref.perm if perm is None else perm)
        if ref.is_const:
            return self.place_constant(ref, perm)
        if perm == ref.perm:
            return ref.value
        if ref.scale is not None and ref.value.quant.dynamic == "per_row":
            raise self.unsupported("per-row dynamically quantized codes can't change layout")
        key = (ref.value, perm)
        if key not in self._placed:
            move = layout.transpose_between(ref.perm, perm)
            source = ref.value.origin
            if source is not None:
                # the result is the source node's tensor moved twice: by the source's layout, then by
                # ``move``; recording that composition (not ``perm``, which is relative to the node
                # being imported) keeps per-layer comparison matched by computation, not by shape
                before = source.layout or layout.identity(len(move))
                origin = replace(source, layout=layout.origin_layout(tuple(before[i] for i in move)))
            else:
                origin = replace(self.origin_of(self.node), layout=layout.origin_layout(perm))
            self._placed[key] = self.b.op("transpose", ref.value, name=origin.node or "transpose", origin=origin,
                                          perm=move)
        return self._placed[key]

    def as_float(self, ref: Ref, perm: Perm | None = None) -> Value:
        """``ref`` as float32 in layout ``perm``: quantized values get an explicit ``dequantize``."""
        perm = tuple(ref.perm if perm is None else perm)
        if ref.scale is not None:  # dynamic codes: dequantize where they are, then move the floats
            key = (ref.value, ref.perm)
            if key not in self._floats:
                self._floats[key] = self.b.op("dequantize", ref.value, ref.scale, name=ref.value.name,
                                              origin=ref.value.origin)
            return self.value_in(Ref.of(self._floats[key], ref.perm), perm)
        value = self.value_in(ref, perm)
        if value.quant is None:
            return value
        key = (value, perm)
        if key not in self._floats:
            origin = value.origin or self.origin_of(self.node, perm)
            self._floats[key] = self.b.op("dequantize", value, None, name=origin.node or "dequantize", origin=origin)
        return self._floats[key]

    def broadcast(self, refs: Sequence[Ref], perm: Perm | None = None, floats: bool = False
                  ) -> tuple[Perm, list[Value]]:
        """Place operands of a broadcasting op in one rank and layout (PyTorch rules: leading 1s)."""
        rank = max(r.rank for r in refs)
        if perm is None:
            runtime = [r for r in refs if not r.is_const and r.rank == rank]
            preferred = [r for r in runtime if not layout.is_identity(r.perm)] or runtime
            perm = preferred[0].perm if preferred else layout.identity(rank)
        values = []
        for r in refs:
            k = rank - r.rank
            if r.is_const:
                quant = r.quant.with_axis(r.quant.axis + k) if r.quant is not None and r.quant.is_per_channel else r.quant
                r = Ref.constant(r.data.reshape((1,) * k + r.data.shape), quant, r.origin)
            elif k:
                v = self.emit("reshape", self.value_in(r), perm=layout.prepend_dims(r.perm, k),
                              shape=(1,) * k + r.value.shape)
                r = Ref.of(v, layout.prepend_dims(r.perm, k), r.scale)
            values.append(self.as_float(r, perm) if floats else self.value_in(r, perm))
        return tuple(perm), values

    # -- quantization ------------------------------------------------------------------------
    def out_spec(self, node: Node | None = None) -> QuantSpec | None:
        """The QuantSpec every consumer quantizes ``node``'s result to, or None when it stays float."""
        node = node or self.node
        specs = set()
        for user in node.users:
            if user.op != "call_function" or user.target != QD.quantize_per_tensor.default:
                return None
            specs.add(spec_from_qparams(*user.args[1:6]))
        return specs.pop() if len(specs) == 1 else None

    def requant_target(self, node: Node | None = None) -> QuantSpec | None:
        """Where ``node``'s result is requantized to: its own quantize, or that of the single
        activation fused after it (conv → relu with no q/dq in between)."""
        node = node or self.node
        spec = self.out_spec(node)
        if spec is None and len(node.users) == 1:
            user = next(iter(node.users))
            if packet(user) in ACTIVATIONS:
                spec = self.out_spec(user)
        return spec

    def rescale(self, value: Value, spec: QuantSpec, perm: Perm) -> Value:
        if value.quant == spec:
            return value
        return self.emit("rescale", value, perm=perm, out=spec)

    def requant(self, value: Value, perm: Perm, node: Node | None = None) -> Ref:
        """Rescale an integer result to the domain its consumers quantize it to (if known)."""
        target = self.requant_target(node)
        if target is not None and value.quant is not None and not value.quant.dynamic:
            value = self.rescale(value, target, perm)
        return Ref.of(value, perm)

    def quantize_value(self, data: np.ndarray, spec: QuantSpec) -> np.ndarray:
        """Codes of float data under a per-tensor spec, exactly as PyTorch's quantize_per_tensor."""
        t = torch.as_tensor(np.asarray(data, dtype=np.float32))
        q = QD.quantize_per_tensor.default(t, spec.scale[0], spec.zero_point[0], spec.qmin, spec.qmax, torch.int32)
        return q.numpy().astype(spec.dtype.numpy)

    def fold(self, node: Node, replacements: dict[Node, torch.Tensor]) -> torch.Tensor:
        """Evaluate ``node`` with PyTorch on constant inputs (used only for constants)."""
        args = torch.fx.node.map_arg(node.args, lambda n: replacements[n])
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: replacements[n])
        with torch.no_grad():
            return node.target(*args, **kwargs)
