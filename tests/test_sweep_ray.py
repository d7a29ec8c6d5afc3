"""qlower.sweep on Ray: a local Ray cluster started in this process (2 CPUs), the same rows as the local
pool, a lost worker retried by Ray and then reported, a crash that does not end the sweep."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray", reason="the test extra installs ray (pip install -e '.[test]')")

from qlower.sweep import Job, LocalExecutor, RayExecutor, sweep  # noqa: E402

FACTORIES = '''
import os, signal
import torch
from torch import nn

def small():
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(64, 5)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / 3)
    return model, (torch.randn(1, 3, 6, 6, generator=torch.Generator().manual_seed(1)),)

def _calls(name):
    """How often this factory ran before (a file beside this one counts its calls)."""
    with open(os.path.join(os.path.dirname(__file__), name), "a+") as f:
        f.seek(0)
        count = len(f.read())
        f.write("x")
    return count

def killed():
    _calls("killed")
    os.kill(os.getpid(), signal.SIGKILL)

def flaky():
    if _calls("flaky") == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    return small()

def raises():
    raise RuntimeError("this factory is broken on purpose")
'''


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.slow
def test_ray_rows_equal_the_local_pools_and_lost_workers_are_retried(cluster, tmp_path):
    """One test, so that the slow start of the cluster and of its workers is paid once."""
    path = tmp_path / "factories.py"
    path.write_text(FACTORIES)
    jobs = [Job(f"{path}:small", "cpu", quant={"per_channel": False}, measures=("verify", "accuracy")),
            Job(f"{path}:raises", "cpu")]
    on_ray = sweep(jobs, executor=RayExecutor(), cache=False, progress=False)
    local = sweep(jobs, executor=LocalExecutor(workers=2), cache=False, progress=False)
    assert on_ray.executor == "ray" and on_ray.workers == 2
    assert [r["status"] for r in on_ray.rows] == ["ok", "failed"]
    assert on_ray.comparable_rows() == local.comparable_rows()
    assert on_ray.rows[0]["sqnr_db"] is not None and on_ray.rows[0]["exact"] is True

    jobs = [Job(f"{path}:killed", "reference", measures=("compile",)),
            Job(f"{path}:flaky", "reference", measures=("compile",))]
    killed, flaky = sweep(jobs, executor=RayExecutor(retries=1), cache=False, progress=False).rows
    # killed every time: run once and retried once by Ray, then a failed row saying so; the sweep went on
    assert (tmp_path / "killed").read_text() == "xx"
    assert killed["status"] == "failed" and "died" in killed["error"] and killed["attempts"] == 2
    # killed the first time only: Ray's retry succeeds
    assert (tmp_path / "flaky").read_text() == "xx"
    assert flaky["status"] == "ok" and flaky["partitions"] == 0
