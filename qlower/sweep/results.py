"""A sweep's results: its rows in job order, as a table (rich), JSON, and an HTML page; the Pareto front."""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qlower.sweep.rows import FIELDS, comparable

# a row's quality (higher is better) and cost (lower is better), in order of preference
QUALITY = ("accuracy", "sqnr_db")
COST = ("cycles", "latency_ms")


@dataclass
class SweepResult:
    """``rows``: one dict per job, in the jobs' order, every key of ``qlower.sweep.rows.FIELDS``.
    ``seconds``: the sweep's wall time; ``executor``: what ran it."""

    rows: list[dict[str, Any]]
    seconds: float = 0.0
    executor: str = ""
    workers: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        """How many rows are ok, not exact, failed, and how many came from the cache."""
        out = {status: sum(r["status"] == status for r in self.rows) for status in ("ok", "not exact", "failed")}
        out["cached"] = sum(bool(r["cached"]) for r in self.rows)
        return out

    @property
    def ok(self) -> bool:
        """Every job compiled, and every verified one is exact."""
        return all(r["status"] == "ok" for r in self.rows)

    def comparable_rows(self) -> list[dict[str, Any]]:
        """The rows without timings and provenance (what any executor must agree on)."""
        return [comparable(r) for r in self.rows]

    def axes(self) -> tuple[str, str] | None:
        """The (cost, quality) columns a Pareto plot uses: the first of each that some ok row has."""
        usable = [r for r in self.rows if r["status"] != "failed"]
        cost = next((c for c in COST if any(r.get(c) is not None for r in usable)), None)
        quality = next((q for q in QUALITY if any(r.get(q) is not None for r in usable)), None)
        return (cost, quality) if cost and quality else None

    def pareto(self) -> list[int]:
        """Indices of the rows no other row beats on both axes (lower cost, higher quality), by cost."""
        axes = self.axes()
        if axes is None:
            return []
        cost, quality = axes
        points = [(r[cost], r[quality], i) for i, r in enumerate(self.rows)
                  if r["status"] != "failed" and r.get(cost) is not None and r.get(quality) is not None]
        front, best = [], -math.inf
        for _cost, q, i in sorted(points, key=lambda p: (p[0], -p[1])):
            if q > best:
                front.append(i)
                best = q
        return front

    def as_dict(self) -> dict[str, Any]:
        return {"executor": self.executor, "workers": self.workers, "seconds": round(self.seconds, 3),
                "counts": self.counts, "fields": list(FIELDS), "pareto": self.pareto(), "notes": self.notes,
                "rows": self.rows}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, default=repr)

    def write_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.to_json(), encoding="utf-8")
        return path

    def write_html(self, path: str | Path) -> Path:
        from qlower.sweep.html import render_html

        path = Path(path)
        path.write_text(render_html(self), encoding="utf-8")
        return path

    def table(self, width: int = 160) -> str:
        from rich.console import Console
        from rich.table import Table

        c = self.counts
        t = Table(title=f"qlower sweep — {len(self.rows)} job(s) on {self.executor} ({self.workers} worker(s)), "
                        f"{self.seconds:.1f} s: {c['ok']} ok, {c['not exact']} not exact, {c['failed']} failed, "
                        f"{c['cached']} cached")
        shown = [name for name in COLUMNS if name in ("model", "target", "status")
                 or any(r.get(name) not in (None, {}, "") for r in self.rows)]
        for name in shown:
            t.add_column(COLUMNS[name], overflow="fold",
                         justify="right" if name in NUMERIC else "left")
        pareto = set(self.pareto())
        for i, r in enumerate(self.rows):
            cells = [cell(r, name) for name in shown]
            if i in pareto:
                cells[0] = f"* {cells[0]}"
            t.add_row(*cells)
        buf = io.StringIO()
        console = Console(file=buf, width=width, force_terminal=False, color_system=None)
        console.print(t)
        if pareto:
            cost, quality = self.axes()
            console.print(f"* on the Pareto front of {COLUMNS[quality]} against {COLUMNS[cost]}")
        for note in self.notes:
            console.print(note)
        return buf.getvalue().rstrip("\n")

    __str__ = table


COLUMNS = {"model": "model", "size": "size", "target": "target", "quant": "quant", "options": "options",
           "status": "status", "partitions": "partitions", "host_ops": "host ops", "max_steps": "max steps",
           "sqnr_db": "SQNR dB", "accuracy": "top-1", "cycles": "cycles", "latency_ms": "latency ms",
           "compile_seconds": "compile s", "seconds": "job s", "cached": "cached", "error": "error"}
NUMERIC = {"size", "partitions", "host_ops", "max_steps", "sqnr_db", "accuracy", "cycles", "latency_ms",
           "compile_seconds", "seconds"}


def cell(row: dict[str, Any], name: str) -> str:
    """A row's value as table text."""
    value = row.get(name)
    if value is None or value == {}:
        return ""
    if name in ("quant", "options"):
        return " ".join(f"{k}={v}" for k, v in value.items())
    if name == "accuracy":
        return f"{100 * value:.2f}%"
    if name == "cycles":
        return f"{value:,}"
    if name == "cached":
        return "yes" if value else ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
