"""XNNPACK's two x86 GEMM kernel families (qlower/backends/litert/xnnpack_isa.py): AMX tiles and AVX-512 VNNI.

XNNPACK picks one per process when it starts, so each family runs in a child process of its own
(``QLOWER_XNNPACK_AMX`` forces it): the zoo's MobileNetV2 compiled for ``litert`` with ``kernels="xnnpack"``
(saved once, loaded by each child) must be bit-exact with the reference at 1 and 2 threads under both. The child started
without tiles also shows that only XNNPACK was refused them (the process can still take them), and a
third child shows the per-program choice: the first program's cost model decides, and a later program
preferring the other family gets one warning. The cost model itself is checked on GEMMs whose padding is
worked out by hand below.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import qlower
from qlower import zoo
from qlower.backends.litert import xnnpack_isa
from qlower.errors import ConfigError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.reference import run_graph

ROOT = Path(__file__).resolve().parents[1]


def _conv_graph(hw: int, cin: int, cout: int, depthwise: bool = False):
    """x -> one 1x1 (or 3x3 depthwise) int8 conv -> rescale to int8 (float32 scales, as TFLite stores them)."""
    b = GraphBuilder("isa")
    x = b.input("x", TensorType((1, hw, hw, cin), DType.INT8, QuantSpec.per_tensor(float(np.float32(0.05)), 0)))
    rng = np.random.default_rng(7)
    k, ci, groups = (3, 1, cin) if depthwise else (1, cin, 1)
    out_c = cin if depthwise else cout
    w = b.constant(rng.integers(-127, 128, (out_c, k, k, ci)).astype(np.int8),
                   QuantSpec.per_channel(np.full(out_c, np.float32(0.01), np.float64), axis=0, qmin=-127, qmax=127))
    bias = b.constant(rng.integers(-500, 500, out_c).astype(np.int32), QuantSpec.accumulator(x.quant, w.quant, axis=0))
    acc = b.op("conv2d", x, w, bias, groups=groups, pad=(1, 1, 1, 1) if depthwise else (0, 0, 0, 0))
    y = b.op("rescale", acc, out=QuantSpec.per_tensor(float(np.float32(0.1)), 3), rounding="single")
    return verify_graph(b.build([y]))


def test_cost_model_prefers_vnni_for_narrow_gemms_and_amx_for_wide_ones():
    # 56x56x24 -> 16: M=3136, N=16, K=24. AMX pads N and K to 64: 3136*64*64 = 12.8M tile MACs, at 1/1.6 of
    # the cost 8.0M; VNNI pads K to 24 (a multiple of 8) and nothing else: 3136*16*24 = 1.2M -> VNNI
    assert xnnpack_isa.gemm_shapes(_conv_graph(56, 24, 16)) == [(3136, 16, 24)]
    assert xnnpack_isa.prefers_amx(_conv_graph(56, 24, 16)) is False
    # 14x14x256 -> 256: M=196 (AMX: 208), N=K=256. AMX 208*256*256/1.6 = 8.5M; VNNI 196*256*256 = 12.8M -> AMX
    assert xnnpack_isa.prefers_amx(_conv_graph(14, 256, 256)) is True
    # a depthwise conv runs on XNNPACK's dwconv kernels: no GEMM, XNNPACK's own default
    dw = _conv_graph(14, 32, 32, depthwise=True)
    assert xnnpack_isa.gemm_shapes(dw) == [] and xnnpack_isa.prefers_amx(dw) is True


def test_a_bad_override_is_a_config_error(monkeypatch):
    monkeypatch.setenv(xnnpack_isa.ENV, "yes")
    with pytest.raises(ConfigError, match="QLOWER_XNNPACK_AMX='yes'"):
        xnnpack_isa.start(lambda: None, True)


CHILD = textwrap.dedent("""
    import ctypes, json, sys
    import numpy as np
    import qlower
    from qlower.backends.litert import xnnpack_isa
    from qlower.backends.litert.backend import with_threads

    program, inputs, out = sys.argv[1:4]
    prog = qlower.load(program)
    arrays = {}
    with np.load(inputs) as z:
        for k in z.files:
            for threads in (1, 2):
                arrays[f"{k}_{threads}"] = with_threads(prog, threads).run(z[k])[0]
    has = xnnpack_isa.cpu_has_amx()
    print(json.dumps({"state": xnnpack_isa.state(), "has_amx": has, "process_may_take_tiles": bool(
        xnnpack_isa.tiles_permitted() or (has and ctypes.CDLL(None).syscall(158, 0x1023, 18) == 0))}))
    np.savez(out, **arrays)
""")


def _child(tmp_path: Path, amx: str, program: Path, inputs: Path) -> tuple[dict, dict]:
    env = {k: v for k, v in os.environ.items() if k != xnnpack_isa.ENV}
    env[xnnpack_isa.ENV] = amx
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    out = tmp_path / f"out{amx}.npz"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(program), str(inputs), str(out)], env=env,
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(out) as z:
        return json.loads(proc.stdout.strip().splitlines()[-1]), {k: z[k] for k in z.files}


@pytest.mark.slow
def test_both_kernel_families_are_bit_exact_and_agree(tmp_path):
    """MobileNetV2 (32x32) compiled once here; each child loads the file and runs it under one family."""
    model, example, cfg, calibration = zoo.get("mobilenet_v2", size=32)
    prog = qlower.compile(model, example, target="litert", quant=cfg, calibration=calibration, progress=False,
                          backend_options={"kernels": "xnnpack"})
    prog.save(tmp_path / "mnv2.qlower")
    gen = torch.Generator().manual_seed(11)
    inputs = {"example": example[0].numpy(), "random": torch.randn(tuple(example[0].shape), generator=gen).numpy()}
    np.savez(tmp_path / "inputs.npz", **inputs)
    runs = {amx: _child(tmp_path, amx, tmp_path / "mnv2.qlower", tmp_path / "inputs.npz") for amx in ("0", "1")}
    (vnni, vnni_out), (amx, amx_out) = runs["0"], runs["1"]
    assert vnni["state"] == {"started": True, "amx_tiles": False,
                             "why": "QLOWER_XNNPACK_AMX=0" if vnni["has_amx"] else "this CPU has no AMX"}
    assert amx["state"]["amx_tiles"] is amx["has_amx"]
    if vnni["has_amx"]:   # refused to XNNPACK only: the rest of the process may still take the tiles
        assert vnni["process_may_take_tiles"]
    assert sorted(vnni_out) == sorted(amx_out) == sorted(f"{k}_{t}" for k in inputs for t in (1, 2))
    for k, x in inputs.items():
        want = run_graph(prog.source, [x])[0]
        for t in (1, 2):   # GEMMs (1x1 convs, the 3x3 stem's IGEMM, the classifier), depthwise, ADD, MEAN
            np.testing.assert_array_equal(vnni_out[f"{k}_{t}"], want, err_msg=f"VNNI {k} {t} threads")
            np.testing.assert_array_equal(amx_out[f"{k}_{t}"], want, err_msg=f"AMX {k} {t} threads")


def _ir_program_child(tmp_path: Path) -> dict:
    """Without the override: a narrow GEMM program first (its cost model prefers VNNI), then a wide one."""
    code = textwrap.dedent("""
        import json, sys, warnings
        import numpy as np
        sys.path.insert(0, sys.argv[1])
        from test_litert_xnnpack_isa import _conv_graph
        from qlower.api import lower_graph
        from qlower.backends.litert import xnnpack_isa
        from qlower.reference import run_graph
        exact, caught_all = [], []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for hw, cin, cout in ((56, 24, 16), (14, 256, 256), (14, 256, 256)):
                g = _conv_graph(hw, cin, cout)
                x = np.random.default_rng(hw).integers(-128, 128, (1, hw, hw, cin)).astype(np.int8)
                prog = lower_graph(g, "litert", backend_options={"kernels": "xnnpack", "threads": 1})
                exact.append(bool(np.array_equal(prog.run(x)[0], run_graph(prog.source, [x])[0])))
        print(json.dumps({"exact": exact, "state": xnnpack_isa.state(), "has_amx": xnnpack_isa.cpu_has_amx(),
                          "warnings": [str(w.message) for w in caught if "XNNPACK started" in str(w.message)]}))
    """)
    env = {k: v for k, v in os.environ.items() if k != xnnpack_isa.ENV}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], env=env, capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_first_programs_cost_model_decides_and_a_disagreeing_one_warns_once(tmp_path):
    r = _ir_program_child(tmp_path)
    assert r["exact"] == [True, True, True]
    if not r["has_amx"]:
        assert r["state"]["amx_tiles"] is False and r["warnings"] == []
        return
    assert r["state"] == {"started": True, "amx_tiles": False, "why": "the program's cost model"}
    assert len(r["warnings"]) == 1 and "started in this process on its AVX-512 VNNI kernels" in r["warnings"][0]
