"""A QAT-trained zoo model (4-bit per-tensor weights, qlower.prepare_qat) compiled with its learned scales is
bit-exact with the reference on the reference, TOSA, Ethos-U55 and LiteRT targets (issue 28 §4)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import qlower
from qlower import zoo
from qlower.verification import verify_program

W4 = qlower.QuantConfig(per_channel=False, weight_qmin=-7, weight_qmax=7)


@pytest.mark.slow
def test_qat_digits_cnn_with_4bit_weights_is_bit_exact_on_every_target_family():
    model, example, _, calibration = zoo.get("digits_cnn")  # trained, conv -> batch norm twice, 8x8 input
    x_train, y_train, _, _ = zoo.digits.dataset()
    qat = qlower.prepare_qat(model, example, W4, calibration=calibration)
    opt = torch.optim.Adam(qat.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in qat.parameters()]
    qat.train()
    for step in range(4):  # a few steps of QAT: the scales and weights move off the PTQ ones
        opt.zero_grad()
        F.cross_entropy(qat(x_train[step * 32:(step + 1) * 32]), y_train[step * 32:(step + 1) * 32]).backward()
        opt.step()
    qat.eval()
    assert not all(torch.equal(a, b) for a, b in zip(before, qat.parameters()))
    (x,), _ = zoo.held_out("digits_cnn", "digits-hard")
    for target in ("reference", "tosa-1.0+int", "ethos-u55-128", "litert"):
        prog = qlower.compile(qat, example, target=target, progress=False, trace=True)
        report = verify_program(prog, [(x[i:i + 1],) for i in range(3)])
        # every target bit-exact with the reference, layer by layer and at the output, and the reference
        # within verify's bound of the fake-quant model (which adds the int32 biases deployment adds)
        assert report.target_compared == (target != "reference")
        assert report.ok and not report.problems, report.table()
        assert all(r.target_vs_ref is None or r.target_vs_ref.max_steps == 0 for r in report.layers)
        # the weights compiled are the learned 4-bit ones: one scale per tensor, codes within [-7, 7]
        graph = prog.canonical
        weights = [op.operands[1] for op in graph.ops if op.kind in ("conv2d", "fully_connected")]
        assert len(weights) == 4 and all(len(w.quant.scale) == 1 for w in weights)
        codes = np.concatenate([graph.constant_data(w).ravel() for w in weights])
        assert codes.min() >= -7 and codes.max() <= 7 and len(np.unique(codes)) == 15
