"""Small valid programs that between them use every IR construct, for program-file tests.

``sample_programs()`` returns programs built directly with GraphBuilder: a conv
network, data movement with tables and int32 arithmetic, a dynamically
quantized float network, and a partitioned program whose partitions run on
``BlobBackend``. Every op kind of the registry (but ``delegate``, which only
partitioning creates) appears in the first three; ``delegate`` in the last.

``BlobBackend`` is a test backend whose payload is self-contained bytes: its
main blob is the partition subgraph saved as a program file, which ``execute``
loads and runs on the reference interpreter. So a program that went through
save/load runs only from what the file holds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qlower.contract import Backend, Payload, Verdict
from qlower.ir import DType, Graph, GraphBuilder, Origin, QuantSpec, TensorType, verify_graph
from qlower.partition import partition
from qlower.program.program import Program
from qlower.reference.aten_fallback import Operand, encode_call

BLOB_TARGET = "qlower-test-blob"
INT32 = DType.INT32


def _per_tensor32(scale: float) -> QuantSpec:
    return QuantSpec.per_tensor(scale, 0, INT32)


def conv_graph() -> Graph:
    """conv2d (per-channel weights, bias, stride, pad) → rescale → clamp → max_pool → depthwise conv
    without bias → reshape → fully_connected without bias → rescale (double rounding)."""
    rng = np.random.default_rng(10)
    b = GraphBuilder("conv_net")
    q_in = QuantSpec.per_tensor(0.05, 3)
    x = b.input("x", TensorType((1, 6, 6, 4), DType.INT8, q_in), Origin("x", "", "", (0, 2, 3, 1)))
    wq = QuantSpec.per_channel(np.linspace(0.01, 0.02, 8), axis=0, qmin=-127, qmax=127)
    w = b.constant(rng.integers(-127, 128, (8, 3, 3, 4)).astype(np.int8), wq, name="w",
                   origin=Origin("features.0.weight", "features.0", "model.py:12"))
    acc = QuantSpec.accumulator(q_in, wq, axis=0)
    bias = b.constant(rng.integers(-500, 500, 8).astype(np.int32), acc, name="bias")
    where = Origin("conv", "features.0", "model.py:12", (0, 2, 3, 1))
    c = b.op("conv2d", x, w, bias, stride=(2, 2), pad=(1, 1, 1, 1), name="conv", origin=where)
    r = b.op("rescale", c, out=QuantSpec.per_tensor(0.1, -2), name="conv_rq", origin=where)
    cl = b.op("clamp", r, min=-2, max=127, name="relu", origin=Origin("relu", "features.1", "model.py:13"))
    mp = b.op("max_pool2d", cl, kernel=(2, 2), stride=(1, 1), pad=(0, 1, 0, 1), name="pool")
    dw_q = QuantSpec.per_tensor(0.03, 0, qmin=-127, qmax=127)
    dw = b.constant(rng.integers(-127, 128, (8, 2, 2, 1)).astype(np.int8), dw_q, name="dw")
    d = b.op("conv2d", mp, dw, None, groups=8, dilation=(2, 2), name="dwconv")
    d8 = b.op("rescale", d, out=QuantSpec.per_tensor(0.2, 0), name="dw_rq")
    flat = b.op("reshape", d8, shape=(1, 8), name="flat")
    fw = b.constant(rng.integers(-127, 128, (5, 8)).astype(np.int8), dw_q, name="fc_w")
    fc = b.op("fully_connected", flat, fw, None, name="fc")
    out = b.op("rescale", fc, out=QuantSpec.per_tensor(0.25, 1), rounding="double", name="logits")
    return verify_graph(b.build([out, mp]))


def movement_graph() -> Graph:
    """Two inputs rescaled and concatenated (variadic), table, transpose, pad, gather, slices, avg_pool,
    reductions (sum, max, min, argmax, argmin), min/max, comparisons, logical ops, select, int32
    add/sub/mul/intdiv, matmul, uint8 codes, casts, an interpolated int16 table."""
    rng = np.random.default_rng(11)
    b = GraphBuilder("movement")
    q = QuantSpec.per_tensor(0.1, 0)
    x = b.input("x", TensorType((1, 4, 4, 8), DType.INT8, QuantSpec.per_tensor(0.05, 3)))
    y = b.input("y", TensorType((1, 4, 4, 8), DType.INT8, QuantSpec.per_tensor(0.08, -1)))
    a = b.op("rescale", x, out=q, name="a_1")
    c = b.op("rescale", y, out=q, name="a")
    d = b.op("rescale", c, out=q, name="a")
    cat = b.op("concat", (a, d), axis=3, name="cat")
    t = b.op("table", cat, table=np.arange(-128, 128, dtype=np.int8)[::-1].copy(), offset=128,
             out=q, name="lut", origin=Origin("act", "blocks.0.act", "model.py:30"))
    tr = b.op("transpose", t, perm=(0, 3, 1, 2), name="nchw")
    p = b.op("pad", tr, pads=(0, 0, 0, 0, 1, 1, 2, 0), value=-5, name="padded")
    order = b.constant(rng.permutation(16).astype(np.int32), QuantSpec(INT32, (1.0,), (0,), 0, 15), name="order")
    g = b.op("gather", p, order, axis=1, name="reordered")
    s1 = b.op("slice", g, start=(0, 0, 0, 0), stop=(1, 16, 6, 6), step=(1, 2, 1, 3), name="strided")
    s2 = b.op("slice", p, start=(0, 1, 1, 1), stop=(1, 9, 5, 5), name="window")
    nhwc = b.op("transpose", s2, perm=(0, 2, 3, 1), name="nhwc")
    ap = b.op("avg_pool2d", nhwc, kernel=(2, 2), stride=(2, 2), pad=(0, 0, 0, 0), name="avg")
    rm = b.op("reduce_max", ap, axis=3, name="rmax")
    # unused results (the outputs stay as they are): they cover reduce_min / argmax / argmin in files and plans
    rmin = b.op("reduce_min", ap, axis=2, name="rmin")
    b.op("argmax", rmin, axis=1, name="first_max")
    b.op("argmin", ap, axis=3, name="first_min")
    # one-domain picks, comparisons, bool logic and select (unused results too)
    lo, hi = b.op("minimum", a, d, name="lo"), b.op("maximum", a, d, name="hi")
    gt, ge, eq = (b.op(k, a, d, name=k) for k in ("greater", "greater_equal", "equal"))
    mixed = b.op("logical_xor", b.op("logical_or", b.op("logical_and", gt, ge, name="both"), eq, name="either"), gt,
                 name="odd")
    b.op("select", b.op("logical_not", mixed, name="even"), lo, hi, name="pick")
    r32 = b.op("rescale", ap, out=_per_tensor32(0.01), name="wide")
    k = b.constant(np.full((1, 1, 1, 8), 3, np.int32), _per_tensor32(0.01), name="k")
    ad = b.op("add", r32, k, name="plus")
    sb = b.op("sub", ad, k, name="minus")
    k5 = b.constant(np.full((1, 1, 1, 1), 5, np.int32), _per_tensor32(0.5), name="k5")
    mu = b.op("mul", sb, k5, shift=1, name="times")
    k7 = b.constant(np.array([[[[7]]]], np.int32), _per_tensor32(0.25), name="k7")
    dv = b.op("intdiv", mu, k7, name="div")
    rs = b.op("reduce_sum", dv, axis=2, name="rsum")
    out8 = b.op("rescale", rs, out=QuantSpec.per_tensor(0.3, 128, DType.UINT8), name="u8")
    mm_a = b.op("reshape", s1, shape=(4, 6, 4), name="mm_a")
    mm_b = b.constant(rng.integers(-127, 128, (4, 4, 3)).astype(np.int8),
                      QuantSpec.per_tensor(0.02, 0), name="mm_b")
    mm = b.op("matmul", mm_a, mm_b, name="mm")
    # TOSA's interpolated int16 table (Ethos-U's form of an int16 lookup), result unused
    wide16 = b.op("rescale", ap, out=QuantSpec.per_tensor(0.001, 0, DType.INT16), name="wide16")
    b.op("table_interp", wide16, table=np.arange(-256, 257, dtype=np.int16), out=_per_tensor32(0.001 / 128),
         name="interp")
    as_float = b.op("cast", rm, dtype=DType.FLOAT32, name="rmax_f")
    back = b.op("cast", as_float, dtype=INT32, out=_per_tensor32(0.1), name="rmax_i")
    return verify_graph(b.build([out8, mm, back]))


def dynamic_graph() -> Graph:
    """Dynamic per-row quantization into a per-channel fully_connected, float ops, static
    quantize (int16), a float clamp to +inf, a -0.0 pad value, a boolean constant output and a
    two-result float fallback (``aten.max.dim``)."""
    rng = np.random.default_rng(12)
    b = GraphBuilder("dynamic")
    x = b.input("x", TensorType((2, 6), DType.FLOAT32), Origin("x", "", "model.py:5"))
    codes, scale = b.op("dynamic_quantize", x, granularity="per_row", dtype=DType.INT8, qmax=127, name="xq")
    wq = QuantSpec.per_channel([0.01, 0.02, 0.015, 0.03], axis=0, qmin=-127, qmax=127)
    w = b.constant(rng.integers(-127, 128, (4, 6)).astype(np.int8), wq, name="w")
    acc = b.op("fully_connected", codes, w, None, name="fc")
    deq = b.op("dequantize", acc, scale, name="fc_f")
    codes_t, scale_t = b.op("dynamic_quantize", deq, name="tq")
    deq_t = b.op("dequantize", codes_t, scale_t, name="tq_f")
    sg = b.op("sigmoid", deq_t, name="sig")
    th = b.op("tanh", deq, name="th")
    ex = b.op("exp", sg, name="ex")
    er = b.op("erf", th, name="er")
    rc = b.op("reciprocal", ex, name="rc")
    sm = b.op("softmax", rc, axis=1, name="sm")
    pr = b.op("mul", sm, er, name="prod")
    ad = b.op("add", pr, sg, name="sum")
    sb = b.op("sub", ad, th, name="diff")
    cl = b.op("clamp", sb, min=-1.5, max=float("inf"), name="floor")
    pd = b.op("pad", cl, pads=(0, 0, 1, 0), value=-0.0, name="padded")
    q16 = b.op("quantize", pd, out=QuantSpec.per_tensor(1 / 4096, 7, DType.INT16), name="q16")
    dq16 = b.op("dequantize", q16, None, name="dq16")
    flags = b.constant(np.array([True, False, True]), name="flags")
    # a float fallback with two results (values and int64 indices, held as plain int32)
    top, where = b.op("aten", (dq16,), target="aten.max.dim", args=encode_call([Operand(0), 1, True], {}),
                      in_dtypes=("float32",), out_dtypes=("float32", "int64"), name="top",
                      out_types=(TensorType((2, 1), DType.FLOAT32),
                                 TensorType((2, 1), INT32, QuantSpec.plain_integer(INT32))))
    return verify_graph(b.build([dq16, flags, top, where]))


class BlobBackend(Backend):
    """Takes a fixed set of op kinds; its payload's main blob is the subgraph as a program file."""

    name = "blob"
    targets = (BLOB_TARGET,)
    kinds = frozenset({"rescale", "concat", "conv2d", "clamp", "max_pool2d", "transpose", "pad", "slice",
                       "add", "sub", "mul", "fully_connected", "reshape"})

    def supports(self, op, target: str) -> Verdict:
        return Verdict.yes() if op.kind in self.kinds else Verdict.no(f"the blob backend does not take {op.kind}")

    def lower(self, subgraph: Graph, target: str, trace: bool = False) -> Payload:
        from qlower.program.fileformat import program_to_bytes

        blob = program_to_bytes(Program("reference", subgraph, subgraph))
        ins = tuple(v.type for v in subgraph.inputs)
        outs = tuple(v.type for v in subgraph.outputs)
        kinds = sorted({op.kind for op in subgraph.ops})
        return Payload(self.name, target, {"graph.qlower": blob, "notes.txt": f"{len(blob)} bytes".encode(),
                                           "empty.bin": b""}, ins, outs,
                       tensor_map={f"{subgraph.name}/{v.name}": v.name for v in subgraph.outputs},
                       meta={"ops": len(subgraph.ops), "kinds": kinds, "estimate": {"cycles": 1234.5}})

    def check_loaded(self, subgraph: Graph, payload: Payload) -> str | None:
        return None if payload == self.lower(subgraph, payload.target) else "not the blob backend's lowering"

    def execute(self, payload: Payload, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        from qlower.program.fileformat import program_from_bytes
        from qlower.reference import run_graph

        return run_graph(program_from_bytes(payload.blobs["graph.qlower"], "blob payload").graph, inputs)

    def execute_traced(self, payload: Payload, inputs: Sequence[np.ndarray],
                       tensors: Sequence[str]) -> dict[str, np.ndarray]:
        return {}   # a blob is opaque: nothing inside it to show


def partitioned_program(graph: Graph) -> Program:
    """``graph`` partitioned for BLOB_TARGET, as ``qlower.api.lower_graph`` would (without the registry)."""
    result = partition(graph, BlobBackend(), BLOB_TARGET)
    meta = {"threads": None, "lower_seconds": 0.5, "quant": "static", "not_json": object()}
    return Program(BLOB_TARGET, result.host, graph, result.partitions, result.decisions, meta)


def sample_programs() -> dict[str, Program]:
    return {
        "conv": Program("reference", conv_graph(), conv_graph(), meta={"threads": 2, "quant": "static"}),
        "movement": (lambda g: Program("reference", g, g))(movement_graph()),
        "dynamic": (lambda g: Program("reference", g, g, meta={"quant": "dynamic"}))(dynamic_graph()),
        "partitioned": partitioned_program(movement_graph()),
        "partitioned_conv": partitioned_program(conv_graph()),
    }
