"""Values, ops and graphs: the qlower IR.

The IR is a typed SSA graph. Every ``Value`` is defined exactly once, by a graph
input or by one op, and never changes: passes build new graphs (through
``GraphBuilder``), they do not edit values in place (DESIGN.md rule 3).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qlower.ir.dtypes import DType
from qlower.ir.quant import QuantSpec


@dataclass(frozen=True)
class TensorType:
    """Shape, element type and, for quantized codes, how they map to reals."""

    shape: tuple[int, ...]
    dtype: DType
    quant: QuantSpec | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __str__(self) -> str:
        dims = "x".join(str(d) for d in self.shape) if self.shape else "scalar"
        q = f" {self.quant}" if self.quant is not None else ""
        return f"{self.dtype.value}[{dims}]{q}"


@dataclass(frozen=True)
class Origin:
    """Where a value comes from in the user's model, for errors and per-layer reports.

    ``layout`` is the permutation that takes the PyTorch (NCHW) tensor to this
    value (e.g. ``(0, 2, 3, 1)`` for NHWC), or None when the two agree.
    """

    node: str = ""
    module: str = ""
    source: str = ""
    layout: tuple[int, ...] | None = None

    def describe(self) -> str:
        parts = [p for p in (self.module, self.node) if p]
        where = ".".join(parts) if parts else "<unknown>"
        return f"{where} ({self.source})" if self.source else where


_value_ids = itertools.count()


@dataclass(frozen=True, eq=False)
class Value:
    """An SSA value. Identity is the object itself; ``name`` is for printing."""

    name: str
    type: TensorType
    origin: Origin | None = None
    uid: int = field(default_factory=lambda: next(_value_ids), repr=False)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def quant(self) -> QuantSpec | None:
        return self.type.quant

    def __repr__(self) -> str:
        return f"%{self.name}"


Operand = Value | None | tuple[Value, ...]


@dataclass(frozen=True, eq=False)
class Op:
    """One operation: its kind, operands (None for an absent optional operand,
    a tuple for a variadic one), attributes and result values."""

    kind: str
    operands: tuple[Operand, ...]
    attrs: Mapping[str, Any]
    results: tuple[Value, ...]

    @property
    def result(self) -> Value:
        if len(self.results) != 1:
            raise ValueError(f"{self.kind} has {len(self.results)} results")
        return self.results[0]

    def input_values(self) -> Iterator[Value]:
        """Every value this op reads, variadic operands flattened, absent ones skipped."""
        for operand in self.operands:
            if isinstance(operand, tuple):
                yield from operand
            elif operand is not None:
                yield operand

    @property
    def origin(self) -> Origin | None:
        return self.results[0].origin if self.results else None


@dataclass(frozen=True, eq=False)
class Graph:
    """A function: inputs, ops in a topological order, outputs."""

    inputs: tuple[Value, ...]
    ops: tuple[Op, ...]
    outputs: tuple[Value, ...]
    name: str = "main"

    def producers(self) -> dict[Value, Op]:
        return {r: op for op in self.ops for r in op.results}

    def users(self) -> dict[Value, list[Op]]:
        uses: dict[Value, list[Op]] = {}
        for op in self.ops:
            for v in op.input_values():
                uses.setdefault(v, []).append(op)
        return uses

    def values(self) -> Iterator[Value]:
        yield from self.inputs
        for op in self.ops:
            yield from op.results

    def constant_data(self, value: Value) -> np.ndarray | None:
        op = self.producers().get(value)
        return op.attrs["data"] if op is not None and op.kind == "constant" else None

    def count_ops(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for op in self.ops:
            counts[op.kind] = counts.get(op.kind, 0) + 1
        return counts

    def __str__(self) -> str:
        from qlower.ir.printer import print_graph

        return print_graph(self)
