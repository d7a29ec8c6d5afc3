"""Which TFLite builtin operators TensorFlow Lite Micro runs, on which dtypes.

TFLM implements a subset of TFLite's kernels, each for fewer types: it has no
int64 arithmetic at all, no int16 or int32 GATHER table, no int32 SUM or
FLOOR_MOD, and CAST only among int8, int16, int32, float32 and bool. Measured
one operator at a time with ``tflite-micro`` 0.dev20261023182759 (loads and
runs as NumPy; tests/test_tflm_kernels.py checks the elementwise ones, CAST and
GATHER against the interpreter, the zoo tests the rest).
The key is the dtype of the operator's first input (SELECT_V2: its values', its condition is bool;
the catalogue cases of tests/test_tflm_catalog.py run it, the logical ops, REDUCE_MIN and ARG_MIN); CAST is keyed by
``(input dtype, output dtype)``. An exported operator outside this table is a
reason for its IR op to stay on the host.
"""

from __future__ import annotations

from tflite.BuiltinOperator import BuiltinOperator as B

_NUMBERS = frozenset({"int32", "float32"})
_ANY = frozenset({"int8", "int16", "int32", "float32"})
_CASTABLE = ("int8", "int16", "int32", "float32", "bool")

ACCEPTED: dict[int, frozenset[str]] = {
    B.ADD: frozenset({"int8", "int32", "float32"}),   # int8: quantized, TFLite ADD's form (fused_add.py)
    B.SUB: _NUMBERS,
    B.MUL: _NUMBERS,
    B.MAXIMUM: _ANY, B.MINIMUM: _ANY,
    B.FLOOR_MOD: frozenset({"float32"}),
    B.DIV: _NUMBERS,
    # (int16 GREATER loads but compares wrongly without quantization parameters: measured)
    B.EQUAL: _NUMBERS, B.NOT_EQUAL: _NUMBERS, B.GREATER_EQUAL: _NUMBERS, B.GREATER: _NUMBERS,
    B.GATHER: frozenset({"int8", "float32"}),
    B.REDUCE_MAX: frozenset({"int8", "float32"}), B.REDUCE_MIN: frozenset({"int8", "float32"}),
    B.ARG_MAX: frozenset({"int8", "float32"}), B.ARG_MIN: frozenset({"int8", "float32"}),
    # (an integer sum is exact in float32 below 2**24; int16: requantized by the ratio of its tensors' scales,
    # exact at scale 1 -- the only int16 SUM accepted, see first_refusal: export.py's plane sums)
    B.SUM: frozenset({"float32", "int16"}),
    # (int8 over axes 1 and 2 of a 4-D tensor, keeping them: the special case whose rounding tflm/mean.py models)
    B.MEAN: frozenset({"int8"}),
    B.LOGICAL_AND: frozenset({"bool"}), B.LOGICAL_OR: frozenset({"bool"}), B.LOGICAL_NOT: frozenset({"bool"}),
    B.TRANSPOSE: frozenset({"int8", "int16", "float32"}),
    B.PADV2: _ANY, B.RESHAPE: _ANY, B.CONCATENATION: _ANY, B.STRIDED_SLICE: _ANY, B.SPLIT_V: _ANY,
    B.MAX_POOL_2D: frozenset({"int8", "int16", "float32"}),
    B.SELECT_V2: frozenset({"int8", "int16", "float32"}),   # keyed by the picked values (KEY_INPUT)
    B.CONV_2D: frozenset({"int8", "float32"}),
    B.DEPTHWISE_CONV_2D: frozenset({"int8", "float32"}),
    B.FULLY_CONNECTED: frozenset({"int8", "float32"}),
    B.BATCH_MATMUL: frozenset({"int8"}),
}
# ranks beyond which TFLM's kernel refuses its first input (measured; the other kernels took rank 6)
MAX_RANK: dict[int, int] = {B.STRIDED_SLICE: 4, B.TRANSPOSE: 5, B.PADV2: 5}
MAX_INPUTS: dict[int, int] = {B.CONCATENATION: 10}   # TFLM's kMaxInputNum
KEY_INPUT: dict[int, int] = {B.SELECT_V2: 1}   # the input whose dtype picks the kernel (SELECT_V2's is bool)
CASTS = frozenset((a, b) for a in _CASTABLE for b in _CASTABLE if a != b)
_NAMES = {v: k for k, v in vars(B).items() if not k.startswith("_")}


def refusal(code: int, in_dtype: str, out_dtype: str, rank: int = 0) -> str | None:
    """Why TFLM has no kernel for builtin ``code`` reading ``in_dtype`` of ``rank`` (writing ``out_dtype``),
    or None."""
    name = _NAMES.get(code, str(code))
    if rank > MAX_RANK.get(code, rank):
        return f"TFLM's {name} takes tensors of rank {MAX_RANK[code]} at most, not {rank}"
    if code == B.CAST:
        if (in_dtype, out_dtype) in CASTS:
            return None
        return f"TFLM's CAST has no {in_dtype} -> {out_dtype} kernel"
    accepted = ACCEPTED.get(code)
    if accepted is None:
        return f"TFLM's kernels don't include {name}"
    if in_dtype not in accepted:
        return f"TFLM's {name} takes {', '.join(sorted(accepted))}, not {in_dtype}"
    return None


def first_refusal(writer, start: int = 0) -> str | None:
    """The first reason an operator of ``writer`` (a litert ``ModelWriter``) from ``start`` on has no TFLM kernel."""
    for op in writer.operators[start:]:
        code = writer.opcodes[op.opcode]
        if len(op.inputs) > MAX_INPUTS.get(code, len(op.inputs)):
            return f"TFLM's {_NAMES.get(code, code)} takes {MAX_INPUTS[code]} inputs at most, not {len(op.inputs)}"
        key = KEY_INPUT.get(code, 0)
        first = writer.tensors[op.inputs[key]] if len(op.inputs) > key else None
        if code == B.SUM and first is not None and first.dtype == "int16" and not all(
                t.quant is not None and t.quant.scale == (1.0,) for t in (first, writer.tensors[op.outputs[0]])):
            return "TFLM's int16 SUM requantizes its sums; only one at scale 1 (exact) is written"
        reason = refusal(code, first.dtype if first else "none",
                         writer.tensors[op.outputs[0]].dtype, len(first.shape) if first else 0)
        if reason is not None:
            return reason
    return None
