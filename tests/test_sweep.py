"""qlower.sweep on the local process pool: rows, crashes, cache, resume, specs, the command line.

The models are tiny factories written to a file per test (a sweep's jobs import them in their own
processes); expected numbers are computed here from the same model with qlower.compile in this process."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import qlower
from qlower.cli import main
from qlower.errors import ConfigError
from qlower.sweep import Job, LocalExecutor, ResultCache, grid, load_spec, sweep
from qlower.sweep.executors import job_resources
from qlower.sweep.rows import FIELDS

FACTORIES = '''
import os, signal
import torch
from torch import nn

SEED = {seed}

def small():
    g = torch.Generator().manual_seed(SEED)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(64, 5)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / 3)
    x = torch.randn(1, 3, 6, 6, generator=torch.Generator().manual_seed(1))
    return model, (x,)

def _second_call():
    """True from a job's second build on (its first is the sweep's fingerprint of the model)."""
    with open(os.path.join(os.path.dirname(__file__), "calls_" + os.environ.get("QLOWER_TEST_TAG", "")), "a+") as f:
        f.write("x")
        f.seek(0)
        return len(f.read()) >= 2

def segfault():
    if _second_call():
        os.kill(os.getpid(), signal.SIGSEGV)
    return small()

def exits():
    os._exit(3)

def raises():
    raise RuntimeError("this factory is broken on purpose")
'''


def write_factories(folder: Path, seed: int = 0) -> Path:
    path = folder / "factories.py"
    path.write_text(FACTORIES.format(seed=seed))
    return path


def expected(path: Path, target: str) -> dict:
    """What the job's row must say, computed in this process."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("sweep_factories_here", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, example = module.small()
    prog = qlower.compile(model, example, target, progress=False, trace=True)
    report = qlower.verify_program(prog, [example])
    with torch.no_grad():
        fp32 = model(*example).numpy().astype(np.float64)
    ours = prog.run(example[0].numpy())[0].astype(np.float64)
    sqnr = 10 * np.log10(np.sum(fp32 ** 2) / np.sum((fp32 - ours) ** 2))
    return {"exact": report.ok, "partitions": len(prog.partitions), "sqnr_db": round(float(sqnr), 4)}


def test_rows_failures_and_crashes_go_on(tmp_path, monkeypatch):
    monkeypatch.setenv("QLOWER_TEST_TAG", "a")
    path = write_factories(tmp_path)
    jobs = [Job(f"{path}:small", "cpu", measures=("verify", "accuracy")),
            Job(f"{path}:segfault", "cpu"), Job(f"{path}:exits", "cpu"), Job(f"{path}:raises", "cpu"),
            Job(f"{path}:small", "reference", quant={"observer": "no-such-observer"})]
    result = sweep(jobs, executor=LocalExecutor(workers=2), cache=tmp_path / "cache", progress=False)
    rows = result.rows
    assert [r["target"] for r in rows] == ["cpu", "cpu", "cpu", "cpu", "reference"]
    assert all(set(r) == set(FIELDS) for r in rows)
    want = expected(path, "cpu")
    assert rows[0]["status"] == "ok" and rows[0]["exact"] is want["exact"] is True
    assert rows[0]["max_steps"] == 0 and rows[0]["partitions"] == want["partitions"]
    assert rows[0]["sqnr_db"] == pytest.approx(want["sqnr_db"], abs=1e-3)
    # a native crash in the job (after the model built fine), an exit while building, an exception
    assert rows[1]["status"] == "failed" and "SIGSEGV" in rows[1]["error"], rows[1]
    assert rows[2]["status"] == "failed" and "building the model failed" in rows[2]["error"]
    assert "exited with code 3" in rows[2]["error"]
    assert rows[3]["status"] == "failed" and "this factory is broken on purpose" in rows[3]["error"]
    assert rows[4]["status"] == "failed" and "observer" in rows[4]["error"]
    assert result.counts == {"ok": 1, "not exact": 0, "failed": 4, "cached": 0}
    assert not result.ok
    # the outputs: table, JSON, HTML with the same rows
    text = result.table()
    assert "SIGSEGV" in text and "reference" in text
    data = json.loads(result.to_json())
    assert data["rows"] == json.loads(json.dumps(rows))
    page = result.write_html(tmp_path / "sweep.html").read_text()
    assert page.count("<tr class='failed") == 4 and "sortable" in page


def test_cache_hit_on_rerun_and_recompute_on_change(tmp_path, monkeypatch):
    monkeypatch.setenv("QLOWER_TEST_TAG", "b")
    path = write_factories(tmp_path)
    jobs = grid([f"{path}:small"], ["reference"], quant={"per_channel": [True, False]}, measures=["accuracy"])
    assert len(jobs) == 2
    cache = ResultCache(tmp_path / "cache")
    first = sweep(jobs, workers=2, cache=cache, progress=False)
    assert first.counts["ok"] == 2 and first.counts["cached"] == 0
    again = sweep(jobs, workers=2, cache=cache, progress=False)
    assert again.counts["cached"] == 2
    assert again.comparable_rows() == first.comparable_rows()
    # other weights: a new fingerprint, every job recomputed, other numbers
    write_factories(tmp_path, seed=5)
    changed = sweep(jobs, workers=2, cache=cache, progress=False)
    assert changed.counts["cached"] == 0 and changed.counts["ok"] == 2
    assert {r["key"] for r in changed.rows}.isdisjoint({r["key"] for r in first.rows})
    assert changed.rows[0]["sqnr_db"] == pytest.approx(expected(path, "reference")["sqnr_db"], abs=1e-3)
    assert changed.rows[0]["sqnr_db"] != first.rows[0]["sqnr_db"]
    # bounded: pruning keeps the most recently used rows
    small = ResultCache(tmp_path / "cache", max_entries=2)
    assert small.prune() == 2
    assert all(small.get(r["key"]) is not None for r in changed.rows)


class InterruptedAfter(LocalExecutor):
    """A Ctrl-C after the first finished job of the run phase."""

    def map(self, fn, items):
        for outcome in super().map(fn, items):
            yield outcome
            if fn.__name__ == "run_job":
                raise KeyboardInterrupt


def test_an_interrupted_sweep_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("QLOWER_TEST_TAG", "c")
    path = write_factories(tmp_path)
    jobs = grid([f"{path}:small"], ["reference", "cpu"], measures=["verify"])
    with pytest.raises(KeyboardInterrupt):
        sweep(jobs, executor=InterruptedAfter(workers=1), cache=tmp_path / "cache", progress=False)
    resumed = sweep(jobs, workers=2, cache=tmp_path / "cache", progress=False)
    assert resumed.counts["cached"] == 1 and resumed.counts["ok"] == 2
    assert [r["exact"] for r in resumed.rows] == [True, True]


def test_spec_file_and_command_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("QLOWER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("QLOWER_TEST_TAG", "d")
    write_factories(tmp_path)
    spec = tmp_path / "spec.toml"
    spec.write_text(textwrap.dedent("""
        measures = ["verify", "cycles"]
        [grid]
        models = ["factories.py:small"]
        targets = ["reference", "ethos-u55-128"]
        options = { memory_mode = ["Shared_Sram", "Sram_Only"] }
        [[job]]
        model = "factories.py:small"
        target = "reference"
        quant = { per_channel = false }
        measures = ["compile"]
        resources = { num_cpus = 2 }
    """))
    jobs = load_spec(spec)
    assert [(j.target, j.options.get("memory_mode")) for j in jobs] == [
        ("reference", None), ("ethos-u55-128", "Shared_Sram"), ("ethos-u55-128", "Sram_Only"), ("reference", None)]
    assert jobs[3].quant == {"per_channel": False} and jobs[3].measures == ("compile",)
    assert jobs[0].model == f"{tmp_path}/factories.py:small"
    out = tmp_path / "rows.json"
    assert main(["sweep", str(spec), "--workers", "2", "--json", str(out), "--html", str(tmp_path / "s.html")]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["status"] for r in rows] == ["ok"] * 4
    u55 = [r for r in rows if r["target"] == "ethos-u55-128"]
    # Vela's estimate: the job's own compile, here (Sram_Only: another memory mode, another estimate)
    model = load_model_here(tmp_path / "factories.py")
    prog = qlower.compile(*model, "ethos-u55-128", progress=False, backend_options={"memory_mode": "Shared_Sram"})
    assert u55[0]["cycles"] == sum(p.payload.meta["perf"]["total_cycles"] for p in prog.partitions) > 0
    assert u55[1]["cycles"] > 0 and u55[1]["cycles"] != u55[0]["cycles"]
    assert rows[0]["cycles"] is None   # the reference interpreter has no cycle estimator
    printed = capsys.readouterr().out
    assert "4 ok, 0 not exact, 0 failed" in printed
    assert job_resources((jobs[3], "key")) == {"num_cpus": 2}   # a Ray task's hints
    # the grid from flags: the same jobs, from the cache now
    assert main(["sweep", "--models", f"{tmp_path}/factories.py:small", "--targets", "reference,ethos-u55-128",
                 "--option", "memory_mode=Shared_Sram,Sram_Only", "--measure", "verify,cycles"]) == 0
    assert "3 cached" in capsys.readouterr().out


def load_model_here(path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("sweep_factories_cli", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.small()


def test_bad_jobs_and_specs_are_config_errors(tmp_path):
    path = write_factories(tmp_path)
    with pytest.raises(ConfigError, match="unknown measure"):
        Job(f"{path}:small", "cpu", measures=("speed",))
    with pytest.raises(ConfigError, match="unknown QuantConfig field"):
        Job(f"{path}:small", "cpu", quant={"bits": 4})
    with pytest.raises(ConfigError, match="unknown zoo model"):
        Job("zoo:nope", "cpu")
    with pytest.raises(ConfigError, match="no file"):
        Job(f"{tmp_path}/missing.py:small", "cpu")
    with pytest.raises(ConfigError, match="lambda"):
        Job(lambda: None, "cpu")
    with pytest.raises(ConfigError, match="taken by none"):
        grid([f"{path}:small"], ["cpu"], options={"memory_mode": "Shared_Sram"})
    with pytest.raises(qlower.errors.UnknownTargetError):
        grid([f"{path}:small"], ["npu9000"])
    bad = tmp_path / "bad.toml"
    bad.write_text("[grid]\nmodels = ['zoo:tiny_cnn']\n")
    with pytest.raises(ConfigError, match="targets"):
        load_spec(bad)
    bad.write_text("[grid\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_spec(bad)
    with pytest.raises(ConfigError, match="workers"):
        LocalExecutor(workers=0)
    assert main(["sweep", "--models", "zoo:tiny_cnn"]) == 2
