"""Non-finite values in a partition's float inputs, for runtimes that must not meet them unchecked.

NaN has no quantized code: the reference refuses to quantize it, so a partition refuses it too (an
InputError naming the input). ±inf has one where the input is only quantized: the reference saturates
it to qmin / qmax, and a runtime whose quantize was measured to do exactly that (TFLM's QUANTIZE, the
VGF emulation layer's; tests/test_float_inputs.py) takes it there. Into any other float op (a
subtraction of two infinities makes a NaN the runtime may read as -inf, where the reference refuses)
it is refused. The positions that saturate are computed from the subgraph when lowering and kept in
the payload's metadata (``SATURATING``), checked against the subgraph when a program file is loaded.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qlower.contract import Payload
from qlower.errors import InputError
from qlower.ir import Graph

SATURATING = "saturating_inputs"


def quantized_only(subgraph: Graph) -> list[int]:
    """The positions of ``subgraph``'s float inputs that only per-tensor ``quantize`` ops read (the form
    measured) and that are not outputs themselves."""
    users, outputs = subgraph.users(), set(subgraph.outputs)
    return [i for i, v in enumerate(subgraph.inputs)
            if v.dtype.is_float and v not in outputs and users.get(v)
            and all(op.kind == "quantize" and op.attrs["out"].axis is None for op in users[v])]


def saturating_problem(subgraph: Graph, payload: Payload) -> str | None:
    """Why ``payload``'s ``SATURATING`` metadata (a program file's) is not ``quantized_only(subgraph)``;
    None when it is, or when it is absent (a payload from before it: no input saturates)."""
    if SATURATING in payload.meta and payload.meta[SATURATING] != quantized_only(subgraph):
        return (f"its metadata {SATURATING!r} {str(payload.meta[SATURATING])[:60]} is not the float inputs its "
                f"subgraph only quantizes ({quantized_only(subgraph)}): altered after compilation")
    return None


def check_finite(payload: Payload, arrays: Sequence[np.ndarray], what: str) -> None:
    """An InputError for a float input of ``payload`` holding NaN, or ±inf where it does not saturate."""
    saturating = payload.meta.get(SATURATING) or ()
    for i, x in enumerate(arrays):
        if x.dtype.kind != "f" or np.isfinite(x).all():
            continue
        if np.isnan(x).any():
            raise InputError(f"input {i} of {what} holds NaN, which has no quantized code (the reference "
                             "refuses to quantize it)")
        if i not in saturating:
            raise InputError(f"input {i} of {what} holds infinity and goes into float ops before it is "
                             "quantized, where a NaN made of it (inf - inf, inf * 0) need not be refused as the "
                             f"reference refuses it; pass finite values (an input {what} only quantizes "
                             "saturates, as in the reference)")
