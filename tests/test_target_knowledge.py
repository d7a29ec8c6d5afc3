"""Target knowledge lives in backends/ (issue 26): the modules every backend plugs into name no
backend, no target and no target's tool; a backend declares what they need (execution kinds,
metadata checks, exporters, a cost report) through the contract."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import qlower
from qlower.backends.registry import _NPU_TARGETS

PACKAGE = Path(qlower.__file__).parent
BACKEND_NAMES = {module.rsplit(".", 1)[1] for module, _ in _NPU_TARGETS.values()} | {"ethos-u"}
TOOLS = {"vela", "ethos", "xnnpack", "lavapipe"}


def target_words(text: str) -> set[str]:
    """The backend names, target names and target tools ``text`` mentions (as words)."""
    words = BACKEND_NAMES | TOOLS | set(_NPU_TARGETS)
    return {w for w in words if re.search(rf"(?<![\w-]){re.escape(w)}(?![\w-])", text.lower())}


def test_the_probe_sees_target_names():
    assert target_words('if payload.backend == "tosa": ...  # Vela\'s estimate') == {"tosa", "vela"}
    assert target_words("ethos-u55-128") >= {"ethos-u55-128"} and target_words("tosa_meta") == set()


@pytest.mark.parametrize("module", ["contract.py"])
def test_shared_modules_hold_no_target_knowledge(module):
    assert target_words((PACKAGE / module).read_text()) == set()
