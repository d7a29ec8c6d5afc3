"""Shared test set-up. Tests are not a package (tosa-tools installs one named `tests`).

Randomness is reproducible everywhere: every hypothesis suite runs under one profile, loaded
here. By default (CI, `make test`) it is derandomized and reads no example database, so a red
run fails the same way on every machine and a green one means the same examples passed. With
QLOWER_FUZZ_EXAMPLES set (`make fuzz`), examples are random from one seed: `--hypothesis-seed`,
else QLOWER_FUZZ_SEED, else a fresh one; it is printed in the header and the summary, so any
run can be repeated (also by xdist workers, which inherit it through QLOWER_FUZZ_SEED).

Tests that draw from the global RNGs (torch.randn, a torch module's initial weights,
np.random.*, random.*) get them seeded before each test from the test's own id, so that
a test sees the same numbers whatever ran before it in its process (xdist or not), and
module-level draws are seeded before each test module is imported.

OpenMP threads (torch's and the native CPU kernels', one libgomp) sleep between parallel regions
instead of spinning: with 2 xdist workers of 2 threads on 2 cores, a spinning thread burns the
core the other worker needs. Set here, before torch loads libgomp (which reads it once): under
load, the zoo's MobileNetV2 build takes 5 s with it and 80-100 s without.
"""

import os
import random
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported (below, and by the tests)
# XNNPACK's kernels (AMX or VNNI) are one choice per process, made by the first program it runs: fixed here so a
# test's kernels don't depend on which test ran first; test_litert_xnnpack_isa.py runs each family in a child
os.environ.setdefault("QLOWER_XNNPACK_AMX", "1")

# the random-graph generators of the fuzzers (hypothesis strategies: test-only, not shipped)
sys.path.insert(0, str(Path(__file__).parent / "fuzzing"))

os.environ.setdefault("TOSA_MODEL_NO_BACKTRACE", "1")

_FUZZING = bool(os.environ.get("QLOWER_FUZZ_EXAMPLES"))
settings.register_profile("qlower-ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("qlower-fuzz", derandomize=False, print_blob=True)
settings.load_profile("qlower-fuzz" if _FUZZING else "qlower-ci")


@pytest.hookimpl(tryfirst=True)  # before hypothesis's plugin reads --hypothesis-seed
def pytest_configure(config):
    if not _FUZZING:
        return
    seed = config.getoption("hypothesis_seed") or os.environ.get("QLOWER_FUZZ_SEED")
    if not seed:
        seed = str(random.SystemRandom().getrandbits(32))
    config.option.hypothesis_seed = seed
    os.environ["QLOWER_FUZZ_SEED"] = str(seed)  # the same seed in xdist workers (spawned later)


def _fuzz_seed_line(config) -> str:
    seed = config.getoption("hypothesis_seed")
    return f"hypothesis seed {seed}: repeat with QLOWER_FUZZ_SEED={seed} make fuzz"


def pytest_report_header(config):
    return _fuzz_seed_line(config) if _FUZZING else "hypothesis: derandomized (profile qlower-ci)"


def pytest_terminal_summary(terminalreporter, config):
    if _FUZZING:
        terminalreporter.write_line(_fuzz_seed_line(config))


def _seed_global_rngs(key: str) -> None:
    seed = zlib.crc32(key.encode())
    import torch  # not at the top: the OpenMP setting above comes first

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def pytest_collectstart(collector):
    if isinstance(collector, pytest.Module):  # before its module-level code runs
        _seed_global_rngs(collector.nodeid)


@pytest.fixture(autouse=True)
def _seeded_global_rngs(request):
    _seed_global_rngs(request.node.nodeid)
