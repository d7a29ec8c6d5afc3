"""Program load time with every Ethos-U / VGF compiler byte derived again (issue 30), against the
load without that check, for MobileNetV2 on ethos-u55-128 and vgf+int.

Run: .venv/bin/python benchmarks/load_time.py   (prints a table, writes benchmarks/results/load_time.json)
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import qlower
from qlower import zoo
from qlower.backends.ethosu import backend as ethosu_backend
from qlower.backends.ethosu.vela import COMPILED
from qlower.backends.vgf import backend as vgf_backend
from qlower.backends.vgf.converter import CONVERSIONS

TARGETS = ("ethos-u55-128", "vgf+int")


def _timed(path: Path) -> float:
    t = time.perf_counter()
    qlower.load(path)
    return time.perf_counter() - t


def main() -> None:
    model, example, quant, calibration = zoo.get("mobilenet_v2")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for target in TARGETS:
            path = Path(tmp) / f"{target}.qlp"
            qlower.compile(model, example, target=target, quant=quant, calibration=calibration,
                           progress=False).save(path)
            after_compile = _timed(path)            # the compile's derivation is in the cache
            COMPILED.clear()
            CONVERSIONS.clear()
            cold = _timed(path)                     # derived again (Vela / model converter run)
            warm = _timed(path)                     # second load: found by digest
            saved = ethosu_backend.derived_problem, vgf_backend.derived_problem
            ethosu_backend.derived_problem = vgf_backend.derived_problem = lambda payload: None
            try:
                unchecked = _timed(path)            # as before issue 30: compiler bytes not checked
            finally:
                ethosu_backend.derived_problem, vgf_backend.derived_problem = saved
            rows.append({"target": target, "model": "mobilenet_v2", "unchecked_s": round(unchecked, 3),
                         "checked_cold_s": round(cold, 3), "checked_warm_s": round(warm, 3),
                         "checked_after_compile_s": round(after_compile, 3)})
    print(f"{'target':16s} {'before (unchecked)':>19s} {'cold':>8s} {'2nd load':>9s} {'after compile':>14s}")
    for r in rows:
        print(f"{r['target']:16s} {r['unchecked_s']:>18.3f}s {r['checked_cold_s']:>7.3f}s {r['checked_warm_s']:>8.3f}s "
              f"{r['checked_after_compile_s']:>13.3f}s")
    out = Path(__file__).parent / "results" / "load_time.json"
    out.write_text(json.dumps(rows, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
