"""What the device must hold: zoo models x ``tflm``, ``ethos-u55-128``, ``ethos-u85-256``, beside litert-torch.

Each model is compiled for each target and its program's device memory read from the backends' cost
reports (``Program.device_memory``): the tensor arena (``tflm``: the smallest TFLM's interpreter
allocates the model in; Ethos-U: Vela's scratch regions), the flash bytes (the .tflite; Vela's
read-only region and command stream) and, for Ethos-U, Vela's peak SRAM. Host ops are counted
(their memory is not in the figures). Then the same model (same weights, same calibration inputs) is
converted by litert-torch (Google's converter, int8 PT2E quantization: symmetric, per-channel
weights) and that .tflite's smallest TFLM arena is found by the same search: the goal is qlower's
``tflm`` arena at or below it on every model. litert-torch runs in a venv of its own
(``--litert-venv``, made on demand: litert-torch 0.10.0, then torch 2.13.0 again, the CPU build);
when it can't be made or a conversion fails, the column says why.

Target ``tflm/io=int8`` is ``tflm`` with its option ``io=int8``: the .tflite takes and returns the int8
codes, as litert-torch's files do (like for like); plain ``tflm`` quantizes float32 inputs inside the file.

    python benchmarks/memory.py [--models tiny_cnn ...] [--targets tflm tflm/io=int8 ...] [--size N]
                                [--no-litert-torch]

Output: benchmarks/results/memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import qlower
from qlower import zoo
from qlower.backends.tflm import runner

HERE = Path(__file__).resolve().parent
VENV = HERE / "results" / "litert-torch-venv"
LITERT_TORCH, TORCH = "litert-torch==0.10.0", "torch==2.13.0"
MODELS = ["tiny_cnn", "digits_cnn", "ds_cnn_kws", "mobilenet_v2", "resnet18"]
# what an Ethos-U row's arena is, and why the whole .tflite's TFLM arena is not beside it
WHOLE_FILE = ("Ethos-U rows: 'arena' is Vela's scratch for the NPU partitions (taken from TFLM's arena on the device), "
              "not the TFLM arena of the whole .tflite (ethos-u custom operators plus the host part): the tflite-micro "
              "wheel registers custom operators only through native registerer functions it looks up by name (dlsym), "
              "which must call MicroMutableOpResolver::AddCustom, an inline template it doesn't export, so they must be "
              "compiled against TFLM's headers at the wheel's own commit (not shipped); without one it refuses the "
              "CUSTOM operator at load. Measure that arena on the device or Arm's FVP.")
TARGETS = ["tflm", "tflm/io=int8", "ethos-u55-128", "ethos-u85-256"]


def _load(name: str, size: int | None):
    return zoo.get(name, size=(size or zoo.default_size(name)) if zoo.default_size(name) else None)


def measure(name: str, target: str, size: int | None) -> dict:
    model, example, cfg, calibration = _load(name, size)
    target_name, _, option = target.partition("/")
    options = dict([option.split("=", 1)]) if option else None
    prog = qlower.compile(model, example, target=target_name, quant=cfg, calibration=calibration, progress=False,
                          backend_options=options)
    total: dict[str, int] = {}
    for _, kinds in prog.device_memory().values():
        for kind, n in kinds.items():
            total[kind] = total.get(kind, 0) + n
    return {"model": name, "target": target, "partitions": len(prog.partitions),
            "host_ops": sum(n for k, n in prog.graph.count_ops().items() if k not in ("delegate", "constant")),
            **total}


def litert_torch_venv(path: Path) -> Path:
    """The venv's python, made on demand; RuntimeError saying why it can't be."""
    python = path / "bin" / "python"
    check = [str(python), "-c", "import litert_torch, torch; assert torch.__version__.startswith('2.13.0')"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    print(f"making a venv for litert-torch in {path} (a few minutes)", flush=True)
    steps = [[sys.executable, "-m", "venv", str(path)],
             [str(python), "-m", "pip", "install", "-q", LITERT_TORCH],
             # litert-torch pulls a CUDA torch; the CPU build of qlower's torch version exports the same graphs
             [str(python), "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", TORCH]]
    for step in steps + [check]:
        r = subprocess.run(step, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(step[-3:])} failed: {(r.stderr or r.stdout).strip()[-300:]}")
    return python


def litert_torch_arena(python: Path, name: str, size: int | None) -> dict:
    """The model converted by litert-torch: its smallest TFLM arena and its bytes, or why not."""
    model, example, _, calibration = _load(name, size)
    with tempfile.TemporaryDirectory() as tmp:
        pt2, cal, out = Path(tmp, "model.pt2"), Path(tmp, "calibration.pt"), Path(tmp, "model.tflite")
        try:
            torch.export.save(torch.export.export(model.eval(), tuple(example)), pt2)
        except Exception as e:  # noqa: BLE001 - a row of the table
            return {"error": f"torch.export: {type(e).__name__}: {str(e)[:200]}"}
        torch.save([tuple(x for x in inputs) for inputs in calibration], cal)
        r = subprocess.run([str(python), str(HERE / "litert_torch_convert.py"), str(pt2), str(cal), str(out)],
                           capture_output=True, text=True)
        if r.returncode != 0 or not out.exists():
            last = [line for line in r.stderr.splitlines() if line.strip()][-1:] or ["no output"]
            return {"error": f"litert-torch failed: {last[0][:300]}"}
        data = out.read_bytes()
    try:
        return {"arena": runner.smallest_arena(data, f"litert-torch's {name}"), "flash": len(data)}
    except Exception as e:  # noqa: BLE001 - TFLM refusing litert-torch's file is a result too
        return {"error": f"TFLM: {str(e)[:300]}"}


def _n(x) -> str:
    return "—" if x is None else f"{x:,}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=MODELS)
    ap.add_argument("--targets", nargs="*", default=TARGETS)
    ap.add_argument("--size", type=int, default=None, help="image models' size (default: each model's own)")
    ap.add_argument("--no-litert-torch", action="store_true", help="skip the litert-torch column")
    ap.add_argument("--litert-venv", type=Path, default=VENV)
    ap.add_argument("--json", type=Path, default=HERE / "results" / "memory.json")
    args = ap.parse_args()

    python, litert_note = None, "not measured (--no-litert-torch)"
    if not args.no_litert_torch:
        try:
            python, litert_note = litert_torch_venv(args.litert_venv), ""
        except Exception as e:  # noqa: BLE001 - the column says why
            litert_note = f"litert-torch column not built: {e}"
            print(litert_note, flush=True)
    rows, reference = [], {}
    print("| model | target | partitions | host ops | arena B | flash B | Vela SRAM B | litert-torch arena B | "
          "arena vs litert-torch |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models:
        if python is not None:
            reference[name] = litert_torch_arena(python, name, args.size)
        lt = reference.get(name, {"error": litert_note})
        for target in args.targets:
            try:
                row = measure(name, target, args.size)
            except Exception as e:  # noqa: BLE001 - a row of the table
                row = {"model": name, "target": target, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            if target.startswith("tflm"):
                row["litert_torch"] = lt
            rows.append(row)
            if "error" in row:
                print(f"| {name} | {target} | failed: {row['error']} |||||||", flush=True)
                continue
            versus = ""
            if target.startswith("tflm"):
                if "arena" in lt:
                    d = row["arena"] - lt["arena"]
                    versus = f"{d:+,} B ({'at or below' if d <= 0 else 'ABOVE'})"
                else:
                    versus = lt["error"]
            print(f"| {name} | {target} | {row['partitions']} | {row['host_ops']} | {_n(row.get('arena'))} | "
                  f"{_n(row.get('flash'))} | {_n(row.get('sram'))} | "
                  f"{_n(lt.get('arena')) if target.startswith('tflm') else ''} | {versus} |", flush=True)
    if any(t.startswith("ethos-u") for t in args.targets):
        print(f"\n{WHOLE_FILE}")
    args.json.parent.mkdir(exist_ok=True)
    args.json.write_text(json.dumps({"size": args.size, "litert_torch": litert_note or LITERT_TORCH,
                                     "ethos_u_arena": WHOLE_FILE,
                                     "load": os.getloadavg(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
