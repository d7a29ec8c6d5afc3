"""The process-wide weights cache: keyed by content, "no bias" never confused with a zero or other bias."""

import threading

import numpy as np

from qlower.backends.cpu import prepare, weights_cache
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.reference import run_graph
from qlower.testing.graph_checks import random_inputs

W = np.random.default_rng(0).integers(-128, 128, (6, 3, 3, 4)).astype(np.int8)
W_Q = QuantSpec.per_channel(np.linspace(0.002, 0.004, 6))


def twin_convs(bias_data, second_bias=None, depthwise=False):
    """Two convs reading the same weight bytes; the first with ``bias_data`` (None: no bias)."""
    b = GraphBuilder("twins")
    x = b.input("x", TensorType((1, 6, 6, 4), DType.INT8, QuantSpec.per_tensor(0.05, 3)))
    acc_q = QuantSpec.accumulator(x.quant, W_Q, axis=0)
    outs = []
    for i, data in enumerate((bias_data, second_bias)):
        w = b.constant(W, W_Q, name=f"w{i}")  # separate constants, identical content
        bias = None if data is None else b.constant(np.asarray(data, np.int32), acc_q, name=f"b{i}")
        acc = b.op("conv2d", x, w, bias, pad=(1, 1, 1, 1))
        outs.append(b.op("rescale", acc, out=QuantSpec.per_tensor(0.2, -5)))
    return verify_graph(b.build(outs))


def _counts():
    stats = weights_cache.stats()
    return {k: stats[k] for k in ("hits", "misses", "entries")}


def _delta(before):
    after = weights_cache.stats()
    return {k: after[k] - before[k] for k in ("hits", "misses", "entries")}


def _assert_exact(graph, plan):
    inputs = random_inputs(graph, 1)
    for e, g in zip(run_graph(graph, inputs), plan.run(inputs)):
        np.testing.assert_array_equal(g, e)


def test_with_and_without_bias_are_two_entries_with_their_own_results():
    weights_cache.clear()
    bias = np.arange(-3000, 3000, 1000)
    graph = twin_convs(None, bias)
    plan = prepare(graph)
    assert _counts() == {"hits": 0, "misses": 2, "entries": 2}
    _assert_exact(graph, plan)
    out_nobias, out_bias = plan.run(random_inputs(graph, 1))
    assert not np.array_equal(out_nobias, out_bias)  # each op really got its own entry


def test_zero_bias_and_no_bias_are_distinct_entries():
    weights_cache.clear()
    graph = twin_convs(np.zeros(6), None)
    plan = prepare(graph)
    assert weights_cache.stats()["entries"] == 2
    _assert_exact(graph, plan)
    a, b = plan.run(random_inputs(graph, 2))
    np.testing.assert_array_equal(a, b)  # numerically the same, still two entries
    key_none = weights_cache.make_key("k", W, W_Q, None, None)
    key_zero = weights_cache.make_key("k", W, W_Q, np.zeros(6, np.int32), None)
    assert key_none != key_zero and weights_cache.NO_BIAS in key_none


def test_identical_weights_and_bias_share_one_entry():
    weights_cache.clear()
    graph = twin_convs(np.arange(6), np.arange(6))
    prepare(graph)
    assert _counts() == {"hits": 1, "misses": 1, "entries": 1}
    other = twin_convs(np.arange(6), np.arange(6) + 1)  # another bias: its own entry
    before = weights_cache.stats()
    prepare(other)
    assert _delta(before) == {"hits": 1, "misses": 1, "entries": 1}


def test_same_graph_prepared_twice_hits():
    weights_cache.clear()
    graph = twin_convs(None, np.arange(6))
    prepare(graph)
    before = weights_cache.stats()
    plan = prepare(graph)
    assert _delta(before) == {"hits": 2, "misses": 0, "entries": 0}
    _assert_exact(graph, plan)


def test_concurrent_prepares_pack_each_entry_once():
    weights_cache.clear()
    graphs = [twin_convs(None, np.arange(6)), twin_convs(np.zeros(6), np.arange(6) * 7)]
    plans, errors = [], []

    def work(i):
        try:
            plans.append((graphs[i % 2], prepare(graphs[i % 2])))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    # distinct (weights, bias-or-none): none, arange*1, zeros, arange*7 -> 4 entries packed once each
    stats = weights_cache.stats()
    assert (stats["hits"], stats["misses"], stats["entries"], stats["evictions"]) == (16 - 4, 4, 4, 0)
    for graph, plan in plans:
        _assert_exact(graph, plan)


def test_clear_resets():
    prepare(twin_convs(None, None))
    weights_cache.clear()
    assert weights_cache.stats() == {"hits": 0, "misses": 0, "entries": 0, "bytes": 0, "evictions": 0}


def _conv_program(seed: int):
    """A small cpu program whose weights are its own (seeded), as a loaded program file."""
    from qlower.program import Program
    from qlower.program.fileformat import program_from_bytes, program_to_bytes

    b = GraphBuilder(f"conv{seed}")
    x = b.input("x", TensorType((1, 4, 4, 4), DType.INT8, QuantSpec.per_tensor(0.05, 3)))
    w = b.constant(np.random.default_rng(seed).integers(-127, 128, (4, 3, 3, 4)).astype(np.int8), W_Q_4)
    acc = b.op("conv2d", x, w, None, pad=(1, 1, 1, 1))
    g = verify_graph(b.build([b.op("rescale", acc, out=QuantSpec.per_tensor(0.2, -5))]))
    return g, program_from_bytes(program_to_bytes(Program("cpu", g, g)))


W_Q_4 = QuantSpec.per_channel(np.linspace(0.002, 0.004, 4))


def test_the_cache_is_bounded_across_loaded_programs(monkeypatch):
    """400 loaded programs with distinct weights used to leave 403 entries: now the least recently
    used go, and every program stays bit-exact (a plan keeps the entries it holds)."""
    monkeypatch.setenv("QLOWER_WEIGHTS_CACHE_ENTRIES", "64")
    weights_cache.clear()
    kept = []
    for seed in range(300):
        g, prog = _conv_program(seed)
        x = random_inputs(g, seed)
        y = prog.run(*x)[0]
        stats = weights_cache.stats()
        assert stats["entries"] <= 64
        if seed % 50 == 0:
            kept.append((prog, x, run_graph(g, x)[0]))
        np.testing.assert_array_equal(y, run_graph(g, x)[0])
    assert weights_cache.stats()["evictions"] >= 300 - 64
    for prog, x, expected in kept:   # evicted long ago: their plans still hold their own weights
        np.testing.assert_array_equal(prog.run(*x)[0], expected)


def test_the_cache_is_bounded_in_bytes(monkeypatch):
    monkeypatch.setenv("QLOWER_WEIGHTS_CACHE_BYTES", "4096")
    weights_cache.clear()
    for seed in range(40):
        prepare(_conv_program(seed)[0])
    stats = weights_cache.stats()
    assert 0 < stats["bytes"] <= 4096 or stats["entries"] == 1
    assert stats["evictions"] > 0
