"""Verification: every stage on the same inputs, compared per layer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from qlower.errors import InputError
from qlower.verification.report import LayerRow, OutputRow, VerificationReport
from qlower.verification.stages import run_stages

__all__ = ["LayerRow", "OutputRow", "VerificationReport", "run_stages", "verify_program"]


def verify_program(program, inputs: Sequence[Sequence[Any]]) -> VerificationReport:
    """Verify per layer on every input tuple of ``inputs``; each row is the worst case over them.
    Raises nothing for a failed check: read ``report.ok``."""
    inputs = list(inputs)
    if not inputs:
        raise InputError("verify needs at least one input tuple in inputs")
    report = VerificationReport.worst_of([run_stages(program, x) for x in inputs])
    report.program = program    # for report.view(): the graph the rows belong to
    return report
