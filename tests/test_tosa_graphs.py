"""TOSA backend on whole quantized graphs: a MobileNetV2-shaped int8 network and random small
graphs (hypothesis), each lowered, validated, run on the TOSA reference model and compared
bit-exactly with the reference interpreter, per layer through the trace payload.

Graphs are built like post-training quantization would build them: every requantization's
output scale comes from the values the reference interpreter computes on the test input (an
observer), so codes spread over the int8 range instead of saturating.
"""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qlower.backends.tosa import TosaBackend
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.reference import run_graph, run_op

BACKEND = TosaBackend()
INT, FP = "tosa-1.0+int", "tosa-1.0+int+fp"
FUZZ_EXAMPLES = int(os.environ.get("QLOWER_FUZZ_EXAMPLES", "25"))


class QBuilder:
    """A GraphBuilder that evaluates every op on a sample input as it is added (calibration)."""

    def __init__(self, rng, shape, scale=0.02, zp=-7):
        self.rng = rng
        self.b = GraphBuilder()
        self.x = self.b.input("x", TensorType(shape, DType.INT8, QuantSpec.per_tensor(scale, zp)))
        self.sample = rng.integers(-128, 128, shape).astype(np.int8)
        self.env = {self.x: self.sample}

    def _track(self, v):
        run_op(self.b.build([v]).ops[-1], self.env)
        return v

    def op(self, kind, *operands, **attrs):
        return self._track(self.b.op(kind, *operands, **attrs))

    def const(self, data, quant):
        return self._track(self.b.constant(data, quant))

    def real(self, v):
        q = v.quant
        return (self.env[v].astype(np.int64) - q.zero_point_array(v.type.rank)) * q.scale_array(v.type.rank)

    def domain(self, lo, hi, qmin=-128):
        """An observer's asymmetric int8 spec covering [lo, hi] (and 0)."""
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        scale = max(hi - lo, 1e-3) / (127 - qmin)
        zp = int(np.clip(round(qmin - lo / scale), qmin, 127))
        return QuantSpec.per_tensor(scale, zp, qmin=qmin)

    def requant(self, acc, relu=False, below=0.0, qmin=-128, relu_op=False):
        """rescale to a calibrated int8 domain. ``relu``: clamp at real 0, folded into the
        rescale's qmin, or as an explicit clamp op; ``below`` widens the domain below 0 (as when a
        later concat owns it), so that relu's zero point is above qmin and a clamp is needed."""
        r = self.real(acc)
        hi = float(r.max())
        lo = -below * max(hi, 1e-3) if relu else float(r.min())
        spec = self.domain(lo, hi, qmin)
        zp = spec.zero_point[0]
        if relu and not relu_op:
            spec = QuantSpec.per_tensor(spec.scale[0], zp, qmin=zp)
        y = self.op("rescale", acc, out=spec)
        return self.op("clamp", y, min=zp, max=127) if relu and relu_op else y

    def conv(self, x, cout, k=3, stride=1, groups=1, bias=True, per_channel=True, w_zp=0, pad=None):
        cin = x.shape[3]
        ci = cin // groups
        w = self.rng.integers(-127, 128, (cout, k, k, ci)).astype(np.int8)
        base = 1.0 / (64 * np.sqrt(k * k * ci))
        if per_channel:
            wq = QuantSpec.per_channel(self.rng.uniform(0.5, 1.5, cout) * base, (w_zp,) * cout)
        else:
            wq = QuantSpec.per_tensor(base, w_zp)
        wv = self.const(w, wq)
        bv = None
        if bias:
            acc = QuantSpec.accumulator(x.quant, wq, 0 if len(wq.scale) > 1 else None)
            bv = self.const(self.rng.integers(-4000, 4000, cout).astype(np.int32), acc)
        p = k // 2 if pad is None else pad
        return self.op("conv2d", x, wv, bv, stride=(stride, stride), pad=(p, p, p, p), groups=groups)

    def fc(self, x, n):
        k = x.shape[-1]
        w = self.const(self.rng.integers(-127, 128, (n, k)).astype(np.int8),
                       QuantSpec.per_channel(self.rng.uniform(0.5, 1.5, n) / (64 * np.sqrt(k))))
        return self.op("fully_connected", x, w, None)

    def to_int32(self, x, scale):
        return self.op("rescale", x, out=QuantSpec.per_tensor(scale, 0, DType.INT32))

    def add(self, a, b):
        """Residual add: both operands rescaled to one int32 scale, added, requantized."""
        common = max(a.quant.scale[0], b.quant.scale[0]) / 2**16
        return self.requant(self.op("add", self.to_int32(a, common), self.to_int32(b, common)))

    def concat(self, xs, axis=3):
        """Concat of differently quantized inputs: each rescaled to one domain covering them all."""
        reals = [self.real(x) for x in xs]
        spec = self.domain(min(float(r.min()) for r in reals), max(float(r.max()) for r in reals))
        return self.op("concat", tuple(self.op("rescale", x, out=spec) for x in xs), axis=axis)

    def build(self, outputs):
        return verify_graph(self.b.build(outputs))


def assert_lowering_exact(graph, inputs, target=INT):
    """Lower with trace, compare outputs and every mapped intermediate with the reference."""
    payload = BACKEND.lower(graph, target, trace=True)
    want, env = run_graph(graph, inputs, keep_all=True)
    got = BACKEND.execute(payload, inputs)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
    by_name = {v.name: a for v, a in env.items()}
    traced = BACKEND.execute_traced(payload, inputs, list(payload.tensor_map))
    assert set(traced) >= set(payload.meta["trace_outputs"])
    for tensor, array in traced.items():
        np.testing.assert_array_equal(array, by_name[payload.tensor_map[tensor]], err_msg=tensor)
    return payload


# -- MobileNetV2 -----------------------------------------------------------------------------

MOBILENET_V2 = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1)]  # (expansion, channels, blocks, first stride)


def mobilenet_v2(size=32, classes=1000, seed=0):
    """An int8 MobileNetV2-shaped IR graph (PyTorch-style padding) and a calibrated sample input."""
    qb = QBuilder(np.random.default_rng(seed), (1, size, size, 3))
    x = qb.requant(qb.conv(qb.x, 32, 3, 2), relu=True)
    c = 32
    for t, cout, n, s in MOBILENET_V2:
        for i in range(n):
            stride = s if i == 0 else 1
            h = x
            if t != 1:
                h = qb.requant(qb.conv(h, c * t, 1, bias=False), relu=True)
            h = qb.requant(qb.conv(h, c * t, 3, stride, groups=c * t), relu=True)
            h = qb.requant(qb.conv(h, cout, 1))
            if stride == 1 and c == cout:
                h = qb.add(x, h)
            x, c = h, cout
    x = qb.requant(qb.conv(x, 1280, 1), relu=True)
    x = qb.op("avg_pool2d", x, kernel=x.shape[1:3], stride=(1, 1))
    y = qb.requant(qb.fc(qb.op("reshape", x, shape=(1, 1280)), classes))
    return qb.build([y]), qb.sample


@pytest.mark.slow
def test_mobilenet_v2_int8_is_bit_exact_per_layer():
    graph, sample = mobilenet_v2(32)
    payload = assert_lowering_exact(graph, [sample])
    ops = payload.meta["tosa_ops"]
    # 17 inverted residual blocks, 16 of them with an expansion conv, 10 with a residual add.
    assert ops["CONV2D"] == 1 + 16 + 17 + 1 + 1          # stem, expand, project, last, classifier
    assert ops["DEPTHWISE_CONV2D"] == 17
    assert ops["ADD"] == 10
    assert ops["RESCALE"] == 1 + 16 + 17 + 17 + 1 + 1 + 3 * 10
    assert ops["AVG_POOL2D"] == 1
    assert payload.meta["extensions"] == []
    assert len(np.unique(BACKEND.execute(payload, [sample])[0])) > 20  # calibrated: not saturated


def test_execute_traced_without_a_trace_graph_returns_inputs_and_outputs_only():
    qb = QBuilder(np.random.default_rng(3), (1, 6, 6, 2))
    y = qb.requant(qb.conv(qb.x, 3), relu=True)
    graph = qb.build([y])
    payload = BACKEND.lower(graph, INT)
    assert "trace.tosa" not in payload.blobs
    got = BACKEND.execute_traced(payload, [qb.sample], list(payload.tensor_map))
    names = {payload.tensor_map[t] for t in got}
    assert names == {qb.x.name, y.name}
    np.testing.assert_array_equal(got[payload.meta["output_tensors"][0]], run_graph(graph, [qb.sample])[0])


# -- random graphs (hypothesis) --------------------------------------------------------------

LAYERS = ["conv", "depthwise", "pointwise_nobias", "concat", "add_const", "mul_const", "residual", "layout",
          "max_pool", "avg_pool"]


def _layer(qb, x, kind, draw):
    c = x.shape[3]
    relu = draw(st.booleans())
    below = draw(st.sampled_from([0.0, 0.0, 0.2, 0.6]))
    requant = dict(relu=relu, below=below, qmin=draw(st.sampled_from([-128, -127])),
                   relu_op=draw(st.booleans()))
    if kind == "conv":
        k = draw(st.sampled_from([1, 2, 3]))
        acc = qb.conv(x, draw(st.integers(1, 6)), k, draw(st.integers(1, 2)), bias=draw(st.booleans()),
                      per_channel=draw(st.booleans()), w_zp=draw(st.sampled_from([0, 0, 3, -5])),
                      pad=draw(st.integers(0, k - 1)))
        return qb.requant(acc, **requant)
    if kind == "depthwise":
        m = draw(st.integers(1, 2))
        return qb.requant(qb.conv(x, c * m, 3, draw(st.integers(1, 2)), groups=c, bias=draw(st.booleans())),
                          **requant)
    if kind == "pointwise_nobias":
        return qb.requant(qb.conv(x, draw(st.integers(1, 6)), 1, bias=False), **requant)
    if kind == "concat":
        other = qb.requant(qb.conv(x, draw(st.integers(1, 4)), 1), relu=True, below=0.5)
        return qb.concat([x, other] if draw(st.booleans()) else [other, x, other])
    if kind in ("add_const", "mul_const"):
        scale = x.quant.scale[0] / 2**8
        x32 = qb.to_int32(x, scale)
        vals = qb.rng.integers(-300, 300, (1, 1, 1, c)).astype(np.int32)
        if kind == "add_const":
            y = qb.op("add", x32, qb.const(vals, x32.quant))
        else:
            per = QuantSpec.per_channel(qb.rng.uniform(0.001, 0.01, c), axis=3, dtype=DType.INT32)
            y = qb.op("mul", x32, qb.const(vals, per), shift=draw(st.integers(0, 4)))
        return qb.requant(y, **requant)
    if kind == "residual":
        return qb.add(x, qb.requant(qb.conv(x, c, 3), **requant))
    if kind == "layout":
        n, h, w, _ = x.shape
        t = qb.op("transpose", x, perm=(0, 2, 1, 3))
        r = qb.op("reshape", t, shape=(n, w * h, c))
        r = qb.op("reshape", r, shape=(n, w, h, c))
        return qb.op("transpose", r, perm=(0, 2, 1, 3))
    k = draw(st.integers(2, 3))
    pad = draw(st.integers(0, k - 1))
    return qb.op("max_pool2d" if kind == "max_pool" else "avg_pool2d", x, kernel=(k, k),
                 stride=(draw(st.integers(1, 2)),) * 2, pad=(pad, draw(st.integers(0, k - 1)), pad, 0))


@pytest.mark.fuzz
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_quantized_graphs_are_bit_exact(data):
    draw = data.draw
    h, w = draw(st.integers(5, 10)), draw(st.integers(5, 10))
    qb = QBuilder(np.random.default_rng(draw(st.integers(0, 2**32 - 1))), (1, h, w, draw(st.integers(1, 5))),
                  draw(st.floats(0.005, 0.2)), draw(st.integers(-128, 127)))
    x = qb.x
    for _ in range(draw(st.integers(1, 4))):
        if min(x.shape[1:3]) < 3:
            break
        x = _layer(qb, x, draw(st.sampled_from(LAYERS)), draw)
    assert_lowering_exact(qb.build([x]), [qb.sample], draw(st.sampled_from([INT, FP])))
