"""Verification: every stage on the same inputs, compared per layer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from qlower.verify.report import LayerRow, OutputRow, VerificationReport
from qlower.verify.stages import run_stages

__all__ = ["LayerRow", "OutputRow", "VerificationReport", "run_stages", "verify_program"]


def verify_program(program, inputs: Sequence[Sequence[Any]]) -> VerificationReport:
    """Verify on the first input tuple of ``inputs`` (per-layer), raising nothing: read ``report.ok``."""
    return run_stages(program, inputs[0])
