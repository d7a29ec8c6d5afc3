"""The reference interpreter: the single definition of what every IR op means.

Integer results are computed in int64 and must fit their dtype: an int32
accumulator that would overflow is an error here, never a silent wrap. Only
plain integer add / sub / mul (PyTorch's integer tensors) wrap, as PyTorch does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qlower.errors import ExecutionError, InputError
from qlower.ir import Graph, Op, Value
from qlower.reference import aten_fallback, data_movement, elementwise, linear, pooling, quantization, reductions  # noqa: F401  (register kernels)
from qlower.reference.registry import KERNELS


def check_inputs(graph: Graph, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Inputs as arrays of the graph's dtypes; a clear InputError naming the input otherwise."""
    if len(inputs) != len(graph.inputs):
        raise InputError(f"graph '{graph.name}' takes {len(graph.inputs)} input(s) "
                         f"({', '.join('%' + v.name for v in graph.inputs)}), got {len(inputs)}")
    out = []
    for i, (v, x) in enumerate(zip(graph.inputs, inputs)):
        x = np.asarray(x)
        if tuple(x.shape) != v.shape:
            raise InputError(f"input {i} (%{v.name}) has shape {tuple(x.shape)}, expected {v.shape}")
        want = v.dtype.numpy
        if x.dtype != want:
            if v.dtype.is_float and x.dtype.kind == "f":
                x = x.astype(want)
            elif v.type.quant is not None and v.type.quant.is_plain_integer and x.dtype.kind in "iu":
                if x.size and (x.min() < v.dtype.min or x.max() > v.dtype.max):
                    raise InputError(f"input {i} (%{v.name}) holds integers outside {v.dtype.value}")
                x = x.astype(want)
            else:
                raise InputError(f"input {i} (%{v.name}) has dtype {x.dtype}, expected {want}")
        out.append(x)
    return out


def _to_result_dtype(op: Op, value: Value, array: np.ndarray) -> np.ndarray:
    dt = value.type.dtype
    if dt.is_integer:
        if array.size and (array.min() < dt.min or array.max() > dt.max):
            raise ExecutionError(f"{op.kind} producing %{value.name} overflows {dt.value} "
                                 f"(range {array.min()}..{array.max()})"
                                 + (f" at {value.origin.describe()}" if value.origin else ""))
    array = np.asarray(array)
    if array.dtype != dt.numpy:
        array = array.astype(dt.numpy)
    if tuple(array.shape) != value.shape:
        raise ExecutionError(f"{op.kind} produced shape {array.shape} for %{value.name}, typed {value.shape}")
    return array


def run_op(op: Op, env: dict[Value, np.ndarray]) -> None:
    """Evaluate one op, reading operands from and writing results to ``env``."""
    try:
        fn = KERNELS[op.kind]
    except KeyError:
        raise ExecutionError(f"the reference interpreter has no kernel for '{op.kind}'") from None
    args = [[env[v] for v in o] if isinstance(o, tuple) else (None if o is None else env[o]) for o in op.operands]
    try:
        res = fn(op, *args)
    except (ArithmeticError, ValueError) as e:
        where = f" at {op.origin.describe()}" if op.origin else ""
        raise ExecutionError(f"{op.kind} producing %{op.results[0].name}{where}: {e}") from e
    res = res if isinstance(res, tuple) else (res,)
    for value, array in zip(op.results, res):
        env[value] = _to_result_dtype(op, value, array)


def run_graph(graph: Graph, inputs: Sequence[np.ndarray], keep_all: bool = False
              ) -> list[np.ndarray] | tuple[list[np.ndarray], dict[Value, np.ndarray]]:
    """Run ``graph``; with ``keep_all`` also return every intermediate value."""
    env: dict[Value, np.ndarray] = dict(zip(graph.inputs, check_inputs(graph, inputs)))
    last_use: dict[Value, int] = {}
    if not keep_all:
        for i, op in enumerate(graph.ops):
            for v in op.input_values():
                last_use[v] = i
    keep = set(graph.outputs)
    for i, op in enumerate(graph.ops):
        run_op(op, env)
        if not keep_all:  # free dead intermediates: large models stay within memory
            for v in op.input_values():
                if last_use.get(v) == i and v not in keep:
                    env.pop(v, None)
    outs = [env[v] for v in graph.outputs]
    return (outs, env) if keep_all else outs
