"""The verification report: per-layer and per-output rows, a verdict, a table and JSON."""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

from qlower.contract import DEVICE_MEMORY
from qlower.ir.rewrite import bound_text
from qlower.verification.metrics import Comparison

# Dynamic quantization's float outputs may differ from the reference by float rounding only.
DYNAMIC_RTOL = 1e-5


@dataclass(frozen=True)
class LayerRow:
    value: str
    op: str
    module: str
    source: str
    type: str
    ref_vs_fake_quant: Comparison | None
    target_vs_ref: Comparison | None
    inside_partition: bool = False
    # the layer alone, fed with fake-quant's inputs (see qlower/verification/isolated.py)
    isolated_vs_fake_quant: Comparison | None = None
    # a rewritten target form against the canonical program (the ``reference`` target's), when they
    # differ: end to end; op by op with inputs forced to the canonical codes, and the bound declared
    # for it (0 where no rewrite names it); the rewrites (of it or upstream) behind a difference
    form_vs_canonical: Comparison | None = None
    form_alone_steps: float | None = None
    form_bound: int | None = None
    rewrite: str = ""

    def as_dict(self) -> dict:
        return {"value": self.value, "op": self.op, "module": self.module, "source": self.source,
                "type": self.type, "inside_partition": self.inside_partition,
                "ref_vs_fake_quant": self.ref_vs_fake_quant and self.ref_vs_fake_quant.as_dict(),
                "isolated_vs_fake_quant": self.isolated_vs_fake_quant and self.isolated_vs_fake_quant.as_dict(),
                "target_vs_ref": self.target_vs_ref and self.target_vs_ref.as_dict(),
                "form_vs_canonical": self.form_vs_canonical and self.form_vs_canonical.as_dict(),
                "form_alone_steps": self.form_alone_steps, "form_bound": self.form_bound, "rewrite": self.rewrite}


@dataclass(frozen=True)
class OutputRow:
    index: int
    ref_vs_fp32: Comparison | None
    ref_vs_fake_quant: Comparison | None
    target_vs_ref: Comparison | None   # None: the target is the reference interpreter itself
    ref_max_abs: float = 0.0  # magnitude of the reference output, for relative bounds
    # end to end, the target's form against the canonical program (when rewritten), and the rewrites behind it
    form_vs_canonical: Comparison | None = None
    rewrite: str = ""

    def as_dict(self) -> dict:
        return {"index": self.index, "ref_max_abs": self.ref_max_abs, "rewrite": self.rewrite,
                **{k: (getattr(self, k) and getattr(self, k).as_dict())
                   for k in ("ref_vs_fp32", "ref_vs_fake_quant", "target_vs_ref", "form_vs_canonical")}}


@dataclass
class VerificationReport:
    target: str
    layers: list[LayerRow]
    outputs: list[OutputRow]
    dynamic: bool = False
    partitions: list[dict] = field(default_factory=list)   # name, backend, target, ops, inputs, outputs
    placement: list[tuple[str, str]] = field(default_factory=list)  # (op kind, partition name or "host")
    # ops without an integer rule, run in float on the host: value, op (aten name), source, reason
    float_fallbacks: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    inputs: int = 1   # how many input tuples the rows are the worst case of
    # per-operator cycle estimates (the backends' cost reports) in execution order: partition, operator,
    # value, source, tensor, op_cycles (what the device spends on it) and npu_cycles (its compute part)
    cycles: list[dict] = field(default_factory=list)
    # the backend rewrites between the canonical program and the target's form (name, steps, what, values),
    # and the values further from the canonical program, op by op, than declared (value, steps, bound, rewrites)
    rewrites: list[dict] = field(default_factory=list)
    form_violations: list[dict] = field(default_factory=list)
    cost_estimator: str = ""   # who estimated ``cycles`` (the backends' cost reports name it)
    # what the device must hold, per partition (the backends' cost reports): partition, estimator and
    # bytes of each contract.DEVICE_MEMORY kind it states (arena, flash, sram)
    memory: list[dict] = field(default_factory=list)
    # the verified program (not saved with the report): what ``view()`` draws the rows on
    program: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def worst_of(cls, reports: list[VerificationReport]) -> VerificationReport:
        """One report over several input tuples: every comparison is the worst each metric
        reached on any of them (see ``Comparison.worst``)."""
        first = reports[0]
        layers = [replace(rows[0], **{k: Comparison.worst([getattr(r, k) for r in rows])
                                      for k in ("ref_vs_fake_quant", "target_vs_ref", "isolated_vs_fake_quant",
                                                "form_vs_canonical")},
                          form_alone_steps=_worst_steps([r.form_alone_steps for r in rows]),
                          rewrite=_joined([r.rewrite for r in rows]))
                  for rows in zip(*(r.layers for r in reports), strict=True)]
        outputs = [replace(rows[0], ref_max_abs=max(r.ref_max_abs for r in rows),
                           rewrite=_joined([r.rewrite for r in rows]),
                           **{k: Comparison.worst([getattr(r, k) for r in rows])
                              for k in ("ref_vs_fp32", "ref_vs_fake_quant", "target_vs_ref", "form_vs_canonical")})
                   for rows in zip(*(r.outputs for r in reports), strict=True)]
        violations: dict[str, dict] = {}
        for r in reports:
            for v in r.form_violations:
                if v["value"] not in violations or v["steps"] > violations[v["value"]]["steps"]:
                    violations[v["value"]] = v
        return cls(first.target, layers, outputs, first.dynamic, first.partitions, first.placement,
                   first.float_fallbacks, inputs=sum(r.inputs for r in reports), cycles=first.cycles,
                   cost_estimator=first.cost_estimator, memory=first.memory,
                   rewrites=first.rewrites, form_violations=list(violations.values()))

    def __post_init__(self) -> None:
        self.problems = self._find_problems()

    def _find_problems(self) -> list[str]:
        problems = []
        first_target = next((r for r in self.layers if r.target_vs_ref and r.target_vs_ref.max_steps > 0), None)
        if first_target is not None and not self.dynamic:
            problems.append(f"{self.target} first diverges from the reference at %{first_target.value} "
                            f"({first_target.op}, {first_target.source}): {first_target.target_vs_ref.max_steps:g} steps")
        for o in self.outputs:
            t = o.target_vs_ref
            if t is None:
                continue
            if self.dynamic:
                if t.max_abs > DYNAMIC_RTOL * o.ref_max_abs:
                    problems.append(f"output {o.index}: {self.target} differs from the reference by {t.max_abs:.3g}, "
                                    f"more than {DYNAMIC_RTOL:g} of the output's magnitude {o.ref_max_abs:.3g}")
            elif t.max_abs > 0:
                problems.append(f"output {o.index}: {self.target} is not bit-exact with the reference "
                                f"(max difference {t.max_abs:.3g})")
        for v in self.form_violations:
            declared = (f"declared {v['bound']} by {', '.join(v['rewrites'])}" if v["rewrites"]
                        else "no rewrite declares a change")
            problems.append(f"%{v['value']}: the {self.target} form is {v['steps']:g} steps from the canonical "
                            f"program with its inputs forced to the canonical codes ({declared})")
        for r in self.layers:
            iso = r.isolated_vs_fake_quant
            if iso is not None and not self.dynamic and iso.max_steps > 1:
                problems.append(f"layer %{r.value} ({r.op}, {r.source}): the reference is {iso.max_steps:g} steps "
                                "from fake-quant on the same inputs (max 1)")
        return problems

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def rewritten(self) -> bool:
        """Whether the target's form differs from the canonical program (backend rewrites applied)."""
        return bool(self.rewrites)

    @property
    def target_compared(self) -> bool:
        """False for target ``reference``, which runs the reference interpreter: no stage to compare."""
        return any(o.target_vs_ref is not None for o in self.outputs)

    def as_dict(self) -> dict:
        return {"target": self.target, "ok": self.ok, "problems": self.problems, "inputs": self.inputs,
                "target_compared": self.target_compared,
                "partitions": self.partitions, "placement": self.placement, "float_fallbacks": self.float_fallbacks,
                "cycles": self.cycles, "cost_estimator": self.cost_estimator,
                "memory": self.memory, "memory_total": self.memory_total, "rewrites": self.rewrites, "form_violations": self.form_violations,
                "layers": [r.as_dict() for r in self.layers], "outputs": [o.as_dict() for o in self.outputs]}

    @property
    def memory_total(self) -> dict[str, int]:
        """Bytes of each memory kind over the partitions that state it (each partition's own memory)."""
        total: dict[str, int] = {}
        for row in self.memory:
            for kind in DEVICE_MEMORY:
                if kind in row:
                    total[kind] = total.get(kind, 0) + row[kind]
        return total

    def memory_lines(self) -> list[str]:
        """The device memory as text: one line per partition, and the total over several."""
        if not self.memory:
            return []
        lines = ["device memory (bytes; " + "; ".join(f"{k}: {v}" for k, v in DEVICE_MEMORY.items()) + "):"]
        for row in self.memory:
            lines.append(f"  {row['partition']} ({row['estimator']}): "
                         + ", ".join(f"{k} {row[k]:,}" for k in DEVICE_MEMORY if k in row))
        if len(self.memory) > 1:
            lines.append("  total: " + ", ".join(f"{k} {n:,}" for k, n in self.memory_total.items()))
        return lines

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, default=_json_default)

    def table(self, width: int = 140) -> str:
        from rich.console import Console
        from rich.table import Table

        over = f", worst of {self.inputs} inputs" if self.inputs > 1 else ""
        t = Table(title=f"qlower verify — target {self.target}{over}", show_lines=False)
        columns = ["layer", "source", "isolated steps", "end-to-end steps", "exact %", "SQNR dB",
                   f"{self.target}↔ref steps"]
        if self.rewritten:   # the form against the canonical program: alone (bound) / end to end, and by what
            columns += ["form↔canonical alone/e2e", "rewrite"]
        for col in columns:
            t.add_column(col, overflow="fold")
        for r in self.layers:
            fq, tg = r.ref_vs_fake_quant, r.target_vs_ref
            name = ("  ⤷ " if r.inside_partition else "") + f"{r.module or r.op}"
            iso = r.isolated_vs_fake_quant
            cells = [name, r.source.rsplit("/", 1)[-1], _fmt(iso and iso.max_steps),
                     _fmt(fq and fq.max_steps), _fmt(fq and 100 * fq.exact_share, "{:.1f}"),
                     _fmt(fq and fq.sqnr_db, "{:.1f}"), _fmt(tg and tg.max_steps)]
            if self.rewritten:
                alone = _fmt(r.form_alone_steps) + (f" (≤{r.form_bound})" if r.form_bound else "")
                cells += [f"{alone} / {_fmt(r.form_vs_canonical and r.form_vs_canonical.max_steps)}", r.rewrite]
            t.add_row(*cells)
        for o in self.outputs:
            fq, tg, fp = o.ref_vs_fake_quant, o.target_vs_ref, o.ref_vs_fp32
            cells = [f"[bold]output {o.index}", "", "", _fmt(fq and fq.max_steps),
                     _fmt(fq and 100 * fq.exact_share, "{:.1f}"), _fmt(fp and fp.sqnr_db, "{:.1f}"),
                     _fmt(tg and (tg.max_abs if self.dynamic else tg.max_steps), "{:.3g}")]
            if self.rewritten:
                fc = o.form_vs_canonical
                cells += [f"— / {_fmt(fc and (fc.max_abs if self.dynamic else fc.max_steps), '{:.3g}')}", o.rewrite]
            t.add_row(*cells)
        buf = io.StringIO()
        console = Console(file=buf, width=width, force_terminal=False, color_system=None)
        console.print(t)
        if self.float_fallbacks:
            console.print(f"{len(self.float_fallbacks)} op(s) run in float on the host:")
            for f in self.float_fallbacks:
                console.print(f"  %{f['value']} = {f['op']}  at {f['source'] or '<no source>'}: {f['reason']}")
        if self.rewritten:
            console.print(f"{self.target}↔ref compares the target with the reference interpreter on its own form "
                          "(must be 0); form↔canonical compares that form with the canonical program (the "
                          "reference target's): each op alone, inputs forced to the canonical codes (must be within "
                          "the bound declared in parentheses, else 0), and end to end (may drift). Rewrites:")
            for rw in self.rewrites:
                console.print(f"  {rw['name']}: {bound_text(rw['steps'])}, {len(rw['values'])} op(s): {rw['what']}")
        for line in self.memory_lines():
            console.print(line)
        if not self.target_compared:
            console.print("target reference runs the reference interpreter itself: there is no other stage to "
                          "compare it with (—); the verdict is about the reference against fake-quant")
        console.print("verdict: " + ("OK" if self.ok else "FAILED\n  " + "\n  ".join(self.problems)))
        return buf.getvalue()

    def write_html(self, path):
        from qlower.verification.html import write_html

        return write_html(self, path)

    def view(self, port: int | None = None, open_browser: bool = True) -> None:
        """Open the verified program's graph in Model Explorer with this report's per-node overlays
        (steps, SQNR, exact share; per-layer cycles): ``qlower view prog.qlp --report r.json`` from
        Python. Blocks until Ctrl-C; needs the ``qlower[view]`` extra (qlower/view/, a later stage:
        reached through qlower.late)."""
        from qlower.late import late

        late("view_report")(self, port=port, open_browser=open_browser)

    def __str__(self) -> str:
        return self.table()


def _worst_steps(steps: list[float | None]) -> float | None:
    made = [x for x in steps if x is not None]
    return max(made) if made else None


def _joined(names: list[str]) -> str:
    return ", ".join(dict.fromkeys(n for text in names if text for n in text.split(", ")))


def _fmt(x, spec: str = "{:.4g}") -> str:
    """``x`` formatted; "—" for no value, or a step count of a float without a step (NaN)."""
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else spec.format(x)


def _json_default(x):
    if isinstance(x, float):
        return None
    raise TypeError(type(x))
