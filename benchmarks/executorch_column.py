"""The ExecuTorch 1.5.1 XNNPACK column of ``latency.py``, driven from qlower's venv.

ExecuTorch runs in a venv of its own under benchmarks/results/ (gitignored), made on demand:
``executorch==1.5.1``, then ``torch==2.13.0`` (qlower's torch, the CPU build) again in case executorch
pulled another one, then ``safetensors`` (the zoo package imports it). The model is passed as its class
(``module:Class`` importable from the repository) and a state dict, the calibration batches and the input
as torch files; ``executorch_xnnpack.py`` exports, quantizes (XNNPACK's quantizer, per-channel weights) and
lowers it with the XNNPACK partitioner, and serves timed calls over a pipe, so that the caller times every
runtime in blocks taking turns.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).parent
VENV = HERE / "results" / "executorch-venv"
PTE_DIR = HERE / "results" / "executorch"
SCRIPT = HERE / "executorch_xnnpack.py"
REPO = HERE.parent
PACKAGES = ("executorch==1.5.1", "torch==2.13.0", "safetensors")
VERSION_CHECK = ("import executorch.version as v, torch; "
                 "assert v.__version__.startswith('1.5.1'), v.__version__; "
                 "assert torch.__version__.startswith('2.13.0'), torch.__version__")


def _run(cmd: list[str], what: str) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=_env())
    if r.returncode != 0:
        lines = [line for line in (r.stderr or r.stdout).splitlines()
                 if line.strip() and "Location 'file:" not in line]
        raise RuntimeError(f"{what} failed: {' | '.join(lines[-3:])[-400:]}")
    return r


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def venv_python(path: Path = VENV) -> Path:
    """The venv's python, made on demand (a few minutes); RuntimeError saying why it can't be."""
    python = path / "bin" / "python"
    check = [str(python), "-c", VERSION_CHECK + "; import safetensors"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    print(f"making a venv for ExecuTorch in {path} (a few minutes)", flush=True)
    _run([sys.executable, "-m", "venv", str(path)], "python -m venv")
    for package in PACKAGES:   # one at a time: torch after executorch, whatever torch executorch pulled
        _run([str(python), "-m", "pip", "install", "-q", package], f"pip install {package}")
    _run(check, "the version check")
    return python


def export_pte(python: Path, model: torch.nn.Module, calibration, example) -> tuple[Path, Path]:
    """The model lowered to a .pte (cached by its weights, data and the export script) and its input file."""
    cls = type(model)
    factory = f"{cls.__module__}:{cls.__qualname__}"
    PTE_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        sd, cal = Path(tmp, "state_dict.pt"), Path(tmp, "calibration.pt")
        torch.save(model.state_dict(), sd)
        torch.save([tuple(b) for b in calibration], cal)
        digest = hashlib.sha256(b"".join(p.read_bytes() for p in (sd, cal, SCRIPT))
                                + factory.encode()).hexdigest()[:16]
        pte, inputs = PTE_DIR / f"{cls.__name__}-{digest}.pte", PTE_DIR / f"{cls.__name__}-{digest}.input.pt"
        if not pte.exists():
            print(f"exporting {factory} with ExecuTorch's XNNPACK quantizer and partitioner", flush=True)
            _run([str(python), str(SCRIPT), "export", factory, str(sd), str(cal), str(pte) + ".tmp"],
                 "ExecuTorch export")
            Path(str(pte) + ".tmp").replace(pte)
    torch.save(tuple(example), inputs)
    return pte, inputs


class JsonLinesChild:
    """A child process answering one JSON line per command line on its stdin (the benchmarks' servers)."""

    what = "the child"

    def __init__(self, argv: list[str], **popen) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, **popen)
        self.hello = self._reply()

    def _reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.what} exited (code {self.proc.wait()})")
        return json.loads(line)

    def ask(self, command: str) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._reply()


class Server(JsonLinesChild):
    """One .pte in ExecuTorch's Python runtime in the side venv: thread count and timed calls on request."""

    what = "the ExecuTorch runtime"

    def __init__(self, python: Path, pte: Path, inputs: Path) -> None:
        super().__init__([str(python), str(SCRIPT), "serve", str(pte), str(inputs)], cwd=REPO, env=_env(),
                         stderr=subprocess.DEVNULL)

    def set_threads(self, n: int) -> None:
        self.ask(f"threads {n}")

    def run(self, n: int) -> list[tuple[float, float]]:
        """``n`` timed calls: (wall seconds, the server's CPU seconds, every thread's) each."""
        reply = self.ask(f"run {n}")
        return list(zip(reply["times"], reply["cpu"]))

    def output(self) -> np.ndarray:
        """The model's output on the input file."""
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp, "output.npy")
            self.ask(f"output {path}")
            return np.load(path)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=30)
