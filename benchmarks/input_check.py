"""Cost of the run-time range check of integer input codes (``qlower.contract.check_codes``, run by
``Program.run`` on every target) on a MobileNetV2 @224 input, 1x3x224x224:

- float32 (what the compiled MobileNetV2 takes; the program quantizes it): no look at the data;
- int8 codes whose type spans all of int8 ([-128, 127]): no look at the data either;
- int8 codes with a narrower range ([-127, 127], symmetric activations, e.g. a .tflite with an
  int8 interface): one min and one max over the 150,528 codes;
- int16 codes in [-32767, 32767] (A16W8): the same over 301 KB.

Run: .venv/bin/python benchmarks/input_check.py   (prints a table, writes benchmarks/results/input_check.json)
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import timeit
from pathlib import Path

import numpy as np

from qlower.contract import check_codes
from qlower.ir import DType, QuantSpec, TensorType

SHAPE = (1, 3, 224, 224)
RESULTS = Path(__file__).parent / "results" / "input_check.json"


def _cases(rng: np.random.Generator):
    f32 = TensorType(SHAPE, DType.FLOAT32)
    yield "float32", rng.standard_normal(SHAPE).astype(np.float32), f32
    full = TensorType(SHAPE, DType.INT8, QuantSpec.per_tensor(0.02, -3))
    yield "int8 [-128, 127]", rng.integers(-128, 128, SHAPE).astype(np.int8), full
    narrow = TensorType(SHAPE, DType.INT8, QuantSpec.per_tensor(0.02, 0, qmin=-127, qmax=127))
    yield "int8 [-127, 127]", rng.integers(-127, 128, SHAPE).astype(np.int8), narrow
    a16 = TensorType(SHAPE, DType.INT16, QuantSpec.per_tensor(1e-4, 0, DType.INT16, qmin=-32767, qmax=32767))
    yield "int16 [-32767, 32767]", rng.integers(-32767, 32768, SHAPE).astype(np.int16), a16


def main(repeat: int = 31, number: int = 20) -> None:
    rng = np.random.default_rng(0)
    rows = []
    for name, x, t in _cases(rng):
        times = timeit.repeat(functools.partial(check_codes, x, t, "input 0"), repeat=repeat, number=number)
        rows.append({"input": name, "bytes": x.nbytes, "median_us": round(statistics.median(times) / number * 1e6, 2)})
    load = os.getloadavg()[0]
    print(f"check_codes on a {SHAPE} input (median of {repeat} x {number} calls; load {load:.1f})")
    print(f"{'input':<24}{'bytes':>10}{'µs':>10}")
    for r in rows:
        print(f"{r['input']:<24}{r['bytes']:>10,}{r['median_us']:>10.2f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"shape": SHAPE, "load": load, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
