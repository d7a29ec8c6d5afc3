"""What a kernel builder sees at prepare time, and the table of builders (op kind -> builder).

A builder turns one IR op into a kernel: a closure over everything that can be
decided before the first run (packed weights, multipliers, shapes), called with
the op's operand tensors (a list for a variadic operand, None for an absent
one) and returning its result tensor(s).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from qlower.backends.cpu.native import NativeKernels
from qlower.errors import UnsupportedOpError
from qlower.ir import Graph, Op, Value
from qlower.reference import KERNELS as REFERENCE_KERNELS
from qlower.registry import Registry

Kernel = Callable[..., torch.Tensor | tuple[torch.Tensor, ...]]
Builder = Callable[[Op, "BuildContext"], Kernel]

BUILDERS: Registry[str, Builder] = Registry("cpu kernel builders")

GEMM_ENGINES = ("int8", "float32", "float64")


def builder(*kinds: str) -> Callable[[Builder], Builder]:
    return BUILDERS.register(*kinds)


@dataclass
class BuildContext:
    """Prepare-time facts shared by the builders of one plan.

    ``gemm_engine`` forces how integer GEMMs are computed ("int8": torch._int_mm,
    "float32": float32 GEMMs with the reduction split for exactness, "float64");
    None picks the fastest exact one. ``native`` is the C library or None.
    """

    graph: Graph
    native: NativeKernels | None = None
    gemm_engine: str | None = None
    _producers: dict[Value, Op] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.gemm_engine is not None and self.gemm_engine not in GEMM_ENGINES:
            raise ValueError(f"gemm_engine must be one of {GEMM_ENGINES} or None, got {self.gemm_engine!r}")
        self._producers = self.graph.producers()

    def constant(self, value: Value | None) -> np.ndarray | None:
        """The data of ``value`` when a constant op defines it, else None."""
        if value is None:
            return None
        op = self._producers.get(value)
        return op.attrs["data"] if op is not None and op.kind == "constant" else None


def build_kernel(op: Op, ctx: BuildContext) -> Kernel:
    try:
        fn = BUILDERS[op.kind]
    except KeyError:
        raise UnsupportedOpError(f"the cpu backend has no kernel for '{op.kind}' (%{op.results[0].name})") from None
    return fn(op, ctx)


def by_reference(op: Op) -> Kernel:
    """A float kernel that runs the reference interpreter's own (float64 NumPy): one definition, so
    the CPU is bit-identical to the reference by construction, not by copying."""
    fn = REFERENCE_KERNELS[op.kind]
    return lambda *xs: torch.from_numpy(np.ascontiguousarray(fn(op, *(x.numpy() for x in xs)), dtype=np.float32))
