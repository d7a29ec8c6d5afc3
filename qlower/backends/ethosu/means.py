"""A mean over H and W on an Ethos-U: one AVG_POOL2D, or a sum and a multiply, whichever Vela says costs less.

The frontend writes a global average as an average pool over the whole plane on int16-widened
codes (``rescale`` int8→int16, ``avg_pool2d``, ``rescale`` to the output): on ethos-u85 with
many channels that is many times cheaper than a sum over H and W, which Vela runs as a
transpose and a reduction (MobileNetV2: 1.9 M cycles less). On small maps and on ethos-u55 the
sum is cheaper (DS-CNN on U85: 46 k against 54 k cycles). Both forms are within a step of
fake-quant; they differ in where they round, so this is a rewrite of the program's form
(``MeanForms``, declared within one step of the pool per rewritten mean, and applied only
where ``within_a_step`` proves that): the NPU stays bit-exact with the chosen form, which
may be a step from the canonical program (the ``reference`` target's). The choice compiles both forms of each mean, alone, with Vela for the
target's configuration (cached per shape and configuration).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from qlower.backends.ethosu.vela import VelaConfig
from qlower.backends.global_means import GlobalMean, global_means
from qlower.ir import DType, Graph, GraphBuilder, Op, QuantSpec, TensorType, Value, rebuild
from qlower.ir.rewrite import Rewrite, Rewritten


def sum_form(b: GraphBuilder, x: Value, count: int) -> Value:
    """``mean`` as the frontend writes a reduction: codes to int32 (zero point removed), a sum over
    H then W, times an int32 constant holding ``1/count`` exactly in its scale."""
    acc = b.op("rescale", x, out=QuantSpec.per_tensor(x.quant.scale[0], 0, DType.INT32))
    total = b.op("reduce_sum", b.op("reduce_sum", acc, axis=1), axis=2)
    ones = b.constant(np.ones((1, 1, 1, 1), np.int32), QuantSpec.per_tensor(1.0 / count, 0, DType.INT32))
    return b.op("mul", total, ones)


def _alone(x_type: TensorType, wide: QuantSpec, out: QuantSpec, pooled: bool) -> Graph:
    """One mean of an int8 map requantized to ``out``, in either form (``wide``: the pool's
    widened codes, as the frontend chose them)."""
    b = GraphBuilder("mean")
    x = b.input("x", x_type)
    n, h, w, c = x_type.shape
    if pooled:
        v = b.op("avg_pool2d", b.op("rescale", x, out=wide), kernel=(h, w), stride=(h, w))
    else:
        v = sum_form(b, x, h * w)
    return b.build([b.op("rescale", v, out=out)])


@functools.lru_cache(maxsize=256)
def _cycles(x_type: TensorType, wide: QuantSpec, out: QuantSpec, pooled: bool, config: VelaConfig) -> int | None:
    from qlower.backends.ethosu.backend import graph_cycles

    return graph_cycles(_alone(x_type, wide, out, pooled), config)


def pool_is_cheaper(mean: GlobalMean, config: VelaConfig) -> bool:
    """Whether Vela estimates ``mean`` cheaper as its pool than as a sum."""
    x_type, wide, out = mean.widen.operands[0].type, mean.widen.attrs["out"], mean.final.attrs["out"]
    pooled, summed = (_cycles(x_type, wide, out, form, config) for form in (True, False))
    return summed is None or (pooled is not None and pooled <= summed)


def cheapest_means(graph: Graph, config: VelaConfig) -> Graph:
    """``graph`` with each global average in the form Vela runs fastest for ``config``."""
    return MeanForms(lambda m: not pool_is_cheaper(m, config)).apply(graph).graph


def within_a_step(mean: GlobalMean) -> bool:
    """Whether the sum form is proven within one step of the pool form. Against the exact mean
    (in output steps) the sum rounds once (half a step); the pool rounds the average of the
    widened codes (half a widened step, ``s_wide / s_out`` output steps) and then to the output
    (half a step). Two integers less than 2 apart differ by at most 1, so it holds when
    ``s_wide <= s_out`` (the frontend's widened codes are 128 times finer than the input's)."""
    return mean.widen.attrs["out"].scale[0] <= mean.final.attrs["out"].scale[0]


class MeanForms(Rewrite):
    """The rewrite of global averages (the frontend's pool form) into the sum form where ``choose``
    says so (Vela costs it lower) and ``within_a_step`` proves the declaration."""

    name = "ethosu.mean_form"
    steps = 1
    what = ("a mean over H and W as an exact int32 sum and one rounding instead of an average pool of "
            "widened codes, where Vela costs the sum lower")

    def __init__(self, choose: Callable[[GlobalMean], bool]):
        self.choose = choose

    def apply(self, graph: Graph) -> Rewritten:
        swap: dict[Op, GlobalMean] = {}
        for m in global_means(graph):
            if within_a_step(m) and self.choose(m):
                swap[m.widen] = m
        if not swap:
            return Rewritten(graph)
        pools = {m.pool for m in swap.values()}
        summed: dict[Op, Value] = {}   # pool -> the sum that replaces it

        def rewrite(b: GraphBuilder, op: Op, operands) -> tuple[Value, ...] | None:
            if op in swap:   # the sum stands in for the widened codes, read by the pool only
                n, h, w, c = op.result.shape
                summed[swap[op].pool] = sum_form(b, operands[0], h * w)
                return (summed[swap[op].pool],)
            if op in pools:  # the pool's reader (a rescale) takes the sum's scale as its input's
                return (summed[op],)
            return None

        return Rewritten(rebuild(graph, rewrite), tuple(m.final.result.name for m in swap.values()))


MAX_POOL_SIDE = 256   # Vela's AVG_POOL2D takes unpadded windows up to 256 a side


def fits_vela(mean: GlobalMean) -> bool:
    return all(k <= MAX_POOL_SIDE for k in mean.pool.attrs["kernel"])


class PoolLimit(MeanForms):
    """The means Vela can't take as one average pool (a side beyond 256) as the sum form, whatever
    it costs: the same form and proof as ``MeanForms`` (where the proof fails the pool stays, and
    stays on the host)."""

    name = "ethosu.pool_limit"
    what = ("a mean over H and W wider than Vela's average pool (256 a side) as an exact int32 sum and one "
            "rounding instead of an average pool of widened codes")

    def __init__(self) -> None:
        super().__init__(lambda m: not fits_vela(m))
