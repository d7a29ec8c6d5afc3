"""qlower.sensitivity with its per-layer measurements fanned out through a sweep executor: the same
report as measured in series, number for number."""

from __future__ import annotations

import qlower
from qlower import zoo
from qlower.sweep import LocalExecutor, use_executor


def test_sensitivity_through_the_local_pool_equals_the_serial_one():
    model, example, quant, calibration = zoo.get("tiny_cnn", size=8)
    serial = qlower.sensitivity(model, example, quant, calibration[:2], progress=False)
    with use_executor(LocalExecutor(workers=2)):
        pooled = qlower.sensitivity(model, example, quant, calibration[:2], progress=False)
    assert len(serial.layers) > 2
    assert pooled.layers == serial.layers   # names, ops, sources and the float SQNRs, bit for bit
    assert pooled.int8_sqnr_db == serial.int8_sqnr_db
