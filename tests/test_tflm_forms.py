"""TFLM forms for what TFLM's kernels take only in another shape: each runs on tflite-micro's
interpreter in one partition, bit-exact with the reference on the program's form."""

import numpy as np
import torch

import qlower
from qlower.reference import run_graph


class _ManySlices(torch.nn.Module):
    """25 slices concatenated: more inputs than TFLM's CONCATENATION takes (10)."""

    def forward(self, x):
        return torch.cat([x[:, :, i:i + 1] * 2 for i in range(25)][::-1], dim=2)


def test_a_concatenation_of_more_inputs_than_tflm_takes_is_a_tree_of_them():
    example = (torch.randn(1, 4, 25),)
    calibration = [(torch.randn(1, 4, 25),) for _ in range(4)]
    prog = qlower.compile(_ManySlices().eval(), example, target="tflm", calibration=calibration, progress=False)
    assert prog.graph.count_ops() == {"delegate": 1}, prog.explain()
    (part,) = prog.partitions
    assert part.payload.meta["tflite_ops"]["CONCATENATION"] == 4   # 25 -> 10 + 10 + 5 -> one
    rng = np.random.default_rng(0)
    for _ in range(3):
        x = rng.normal(size=(1, 4, 25)).astype(np.float32) * 3
        got, want = prog.run(x), run_graph(prog.source, [x])
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


class _Sums(torch.nn.Module):
    """Integer sums over channels and over a row: TFLM has no int32 SUM; its float32 one is exact here."""

    def forward(self, x):
        return x.sum(dim=1, keepdim=True) * 0.5, x.sum(dim=3)


def test_an_integer_sum_is_tflm_s_float32_sum_exact_below_2_24():
    example = (torch.randn(1, 6, 5, 40),)
    calibration = [(torch.randn(1, 6, 5, 40),) for _ in range(4)]
    prog = qlower.compile(_Sums().eval(), example, target="tflm", calibration=calibration, progress=False)
    assert prog.graph.count_ops() == {"delegate": 1}, prog.explain()
    (part,) = prog.partitions
    assert part.payload.meta["tflite_ops"]["SUM"] == 2
    rng = np.random.default_rng(1)
    for scale in (1, 3, 100):   # up to the int8 ends, where the sums reach their bounds
        x = rng.normal(size=(1, 6, 5, 40)).astype(np.float32) * scale
        got, want = prog.run(x), run_graph(prog.source, [x])
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_a_float_sum_stays_on_the_host():
    """S0's dynamic quantization sums floats: the reference adds in float64, TFLM's SUM in float32
    (the last bit differed in 8 of 10 outputs when it ran on TFLM)."""
    from qlower import zoo

    model, example, cfg, calibration = zoo.get("s0_dynamic_biasless")
    prog = qlower.compile(model, example, target="tflm", quant=cfg, calibration=calibration, progress=False)
    assert not any(p.payload.meta["tflite_ops"].get("SUM") for p in prog.partitions)
    assert "TFLM's SUM in float32" in prog.explain()
    rng = np.random.default_rng(2)
    inputs = [rng.normal(size=x.shape).astype(np.float32) for x in example]
    for g, w in zip(prog.run(*inputs), run_graph(prog.source, inputs)):
        np.testing.assert_array_equal(g, w)


class _ArgExtremes(torch.nn.Module):
    def forward(self, x):
        return torch.argmax(x, dim=1), torch.argmin(x, dim=3)


def test_argmax_and_argmin_of_int8_codes_run_on_tflm_first_index_on_ties():
    example = (torch.randn(1, 8, 4, 6),)
    calibration = [(torch.randn(1, 8, 4, 6),) for _ in range(4)]
    prog = qlower.compile(_ArgExtremes().eval(), example, target="tflm", calibration=calibration, progress=False)
    assert prog.graph.count_ops() == {"delegate": 1}, prog.explain()
    rng = np.random.default_rng(3)
    for _ in range(3):
        x = np.round(rng.normal(size=(1, 8, 4, 6))).astype(np.float32)   # few distinct codes: many ties
        got, want = prog.run(x), run_graph(prog.source, [x])
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
