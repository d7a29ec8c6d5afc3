"""The HTML verification report: tables, a per-layer error plot, per-layer cycles where a backend estimates them
and a picture of the partitioning.

Pictures are PNGs drawn with matplotlib (Agg, no display needed) and embedded
as data URIs, so the report is one self-contained file.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from qlower.contract import DEVICE_MEMORY
from qlower.ir.rewrite import bound_text
from qlower.verification.report import VerificationReport

_HOST_COLOR = "#b0b0b0"
_PART_COLORS = ["#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b"]


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return buf.getvalue()


def error_plot(report: VerificationReport) -> bytes:
    """Per layer: steps reference↔fake-quant in isolation (bars) and end to end (dotted), SQNR vs fp32
    (line), target↔reference steps (red crosses)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report.layers
    xs = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.18 * len(rows) + 3), 3.6))
    isolated = [r.isolated_vs_fake_quant.max_steps if r.isolated_vs_fake_quant else 0.0 for r in rows]
    drift = [r.ref_vs_fake_quant.max_steps if r.ref_vs_fake_quant else float("nan") for r in rows]
    colors = [_PART_COLORS[0] if r.inside_partition else _HOST_COLOR for r in rows]
    ax.bar(xs, isolated, color=colors, label="reference ↔ fake-quant, layer alone (max steps)")
    ax.plot(xs, drift, color="#999999", lw=1, ls=":", label="end to end (accumulated drift)")
    tgt = [(i, r.target_vs_ref.max_steps) for i, r in enumerate(rows) if r.target_vs_ref and r.target_vs_ref.max_steps > 0]
    if tgt:
        ax.scatter([i for i, _ in tgt], [s for _, s in tgt], color="red", zorder=3, marker="x", s=60,
                   label=f"{report.target} ↔ reference (steps)")
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xlabel("layer (graph order)")
    ax.set_ylabel("max difference (quantization steps)")
    ax.set_yscale("symlog", linthresh=2)
    ax2 = ax.twinx()
    sq = [r.ref_vs_fake_quant.sqnr_db if r.ref_vs_fake_quant and r.ref_vs_fake_quant.sqnr_db is not None else float("nan")
          for r in rows]
    ax2.plot(xs, [min(s, 80.0) for s in sq], color="#d62728", lw=1.2, label="SQNR vs fp32 (dB)")
    ax2.set_ylabel("SQNR vs fp32 (dB, capped at 80)")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=8)
    ax.set_title(f"per-layer error — target {report.target}")
    return _png(fig)


def cycles_chart(report: VerificationReport) -> bytes:
    """Per operator of the partitions with a cost report, in execution order: the cycles the device spends on it
    (light) and their compute part (dark), labelled with the IR value it computes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report.cycles
    ys = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.16 * len(rows) + 1.2)))
    ax.barh(ys, [r.get("op_cycles", 0) for r in rows], color="#9ecae1", label="cycles (compute + waiting on memory)")
    ax.barh(ys, [r.get("npu_cycles", 0) for r in rows], color=_PART_COLORS[0], height=0.5, label="compute cycles")
    ax.set_yticks(ys)
    ax.set_yticklabels([f"{r.get('operator', '')} %{r.get('value') or r.get('tensor', '')}" for r in rows], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel(f"cycles ({report.cost_estimator or 'the backend'}'s estimate)")
    total = sum(r.get("op_cycles", 0) for r in rows)
    ax.set_title(f"cycles per operator — target {report.target}, {total:,} in all")
    ax.legend(loc="lower right", fontsize=8)
    return _png(fig)


def partition_picture(report: VerificationReport) -> bytes:
    """One cell per op of the optimised graph, coloured by where it runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.patches as mpatches
    import matplotlib.pyplot as plt

    placement = report.placement or []
    names = sorted({p for _, p in placement if p != "host"})
    color = {n: _PART_COLORS[i % len(_PART_COLORS)] for i, n in enumerate(names)}
    color["host"] = _HOST_COLOR
    per_row = 40
    n_rows = max(1, (len(placement) + per_row - 1) // per_row)
    fig, ax = plt.subplots(figsize=(12, 0.55 * n_rows + 1.2))
    for i, (kind, where) in enumerate(placement):
        r, c = divmod(i, per_row)
        ax.add_patch(mpatches.Rectangle((c, -r), 0.95, 0.9, color=color[where]))
        ax.text(c + 0.47, -r + 0.45, kind[:4], ha="center", va="center", fontsize=5, rotation=90)
    ax.set_xlim(0, per_row)
    ax.set_ylim(-n_rows + 0.9, 1)
    ax.axis("off")
    ax.legend(handles=[mpatches.Patch(color=color[n], label="host (CPU)" if n == "host" else n)
                       for n in ["host", *names]],
              loc="upper center", bbox_to_anchor=(0.5, 0), ncol=min(6, len(names) + 1), fontsize=8)
    ax.set_title(f"where each op runs — target {report.target}")
    return _png(fig)


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _fmt(x, spec="{:.4g}") -> str:
    return "—" if x is None else html.escape(spec.format(x))


def render_html(report: VerificationReport) -> str:
    verdict = "OK" if report.ok else "FAILED"
    layer_rows = "".join(
        f"<tr class='{'inside' if r.inside_partition else 'host'}'><td>{html.escape(r.module or r.op)}</td>"
        f"<td>{html.escape(r.source)}</td><td>{html.escape(r.type)}</td>"
        f"<td>{_fmt(r.isolated_vs_fake_quant and r.isolated_vs_fake_quant.max_steps)}</td>"
        f"<td>{_fmt(r.ref_vs_fake_quant and r.ref_vs_fake_quant.max_steps)}</td>"
        f"<td>{_fmt(r.ref_vs_fake_quant and 100 * r.ref_vs_fake_quant.exact_share, '{:.1f}')}</td>"
        f"<td>{_fmt(r.ref_vs_fake_quant and r.ref_vs_fake_quant.sqnr_db, '{:.1f}')}</td>"
        f"<td>{_fmt(r.target_vs_ref and r.target_vs_ref.max_steps)}</td>{_form_cells(report, r)}</tr>"
        for r in report.layers)
    part_rows = "".join(
        f"<tr><td>{html.escape(p['name'])}</td><td>{html.escape(p['backend'])} ({html.escape(p['target'])})</td>"
        f"<td>{p['ops']}</td><td>{html.escape(', '.join(p['inputs']))}</td>"
        f"<td>{html.escape(', '.join(p['outputs']))}</td></tr>" for p in report.partitions)
    partitions = (
        f"<table id='partitions'><tr><th>partition</th><th>backend</th><th>ops</th><th>reads</th><th>writes</th></tr>"
        f"{part_rows}</table>" if report.partitions else
        "<p id='partitions'>No delegated partitions: every op runs in the host's CPU plan.</p>")
    problems = "".join(f"<li>{html.escape(p)}</li>" for p in report.problems)
    fallback_rows = "".join(
        f"<tr><td>%{html.escape(f['value'])}</td><td>{html.escape(f['op'])}</td><td>{html.escape(f['source'])}</td>"
        f"<td>{html.escape(f['reason'])}</td></tr>" for f in report.float_fallbacks)
    fallbacks = (
        "<h2>Float on the host</h2><table id='fallbacks'><tr><th>value</th><th>op</th><th>source</th>"
        f"<th>reason</th></tr>{fallback_rows}</table>" if report.float_fallbacks else "")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>qlower verify — {html.escape(report.target)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }} table {{ border-collapse: collapse; font-size: 13px; }}
td, th {{ border: 1px solid #ccc; padding: 2px 6px; }} tr.inside td:first-child {{ padding-left: 1.5em; }}
.ok {{ color: #2a7; }} .failed {{ color: #c22; }} img {{ max-width: 100%; }}
</style></head><body>
<h1>qlower verify — target {html.escape(report.target)}</h1>
<p id="verdict" class="{verdict.lower()}">verdict: <b>{verdict}</b></p><ul id="problems">{problems}</ul>
<h2>Per-layer error</h2>{_img(error_plot(report), "per-layer error plot")}
{f'<h2>Cycles per layer</h2>{_img(cycles_chart(report), "cycles per layer")}' if report.cycles else ""}
<h2>Partitioning</h2>{_img(partition_picture(report), "partitioning")}
{partitions}
{_memory_section(report)}
{fallbacks}
<h2>Layers</h2>
<table id="layers"><tr><th>layer</th><th>source</th><th>type</th><th>isolated steps</th>
<th>end-to-end steps</th><th>exact %</th>
<th>SQNR dB</th><th>{html.escape(report.target)}↔ref steps</th>{_form_head(report)}</tr>{layer_rows}</table>
{_form_section(report)}
</body></html>
"""


def _memory_section(report: VerificationReport) -> str:
    """What the device must hold, per partition and in total (the backends' cost reports)."""
    if not report.memory:
        return ""
    kinds = [k for k in DEVICE_MEMORY if any(k in row for row in report.memory)]
    head = "".join(f"<th title='{html.escape(DEVICE_MEMORY[k])}'>{k} bytes</th>" for k in kinds)
    rows = [(row["partition"], row["estimator"], row) for row in report.memory]
    if len(report.memory) > 1:
        rows.append(("total", "", report.memory_total))
    body = "".join(f"<tr><td>{html.escape(name)}</td><td>{html.escape(by)}</td>"
                   + "".join(f"<td>{_fmt(row.get(k), '{:,}')}</td>" for k in kinds) + "</tr>"
                   for name, by, row in rows)
    return (f"<h2>Device memory</h2><table id='memory'><tr><th>partition</th><th>according to</th>{head}</tr>"
            f"{body}</table>")


def _form_head(report: VerificationReport) -> str:
    if not report.rewritten:
        return ""
    return "<th>form↔canonical alone (bound)</th><th>form↔canonical end to end</th><th>rewrite</th>"


def _form_cells(report: VerificationReport, r) -> str:
    if not report.rewritten:
        return ""
    bound = f" (≤{r.form_bound})" if r.form_bound else ""
    return (f"<td>{_fmt(r.form_alone_steps)}{bound}</td>"
            f"<td>{_fmt(r.form_vs_canonical and r.form_vs_canonical.max_steps)}</td><td>{html.escape(r.rewrite)}</td>")


def _form_section(report: VerificationReport) -> str:
    """Which reference the target was compared with, the rewrites between it and the canonical
    program, and each output's end-to-end distance from the canonical program."""
    if not report.rewritten:
        return ("<p id='reference'>The target's program is the canonical program (no backend rewrite): "
                "↔ref compares it with the reference target's numbers.</p>")
    rewrites = "".join(f"<tr><td>{html.escape(rw['name'])}</td><td>{html.escape(bound_text(rw['steps']))}</td>"
                       f"<td>{len(rw['values'])}</td><td>{html.escape(rw['what'])}</td></tr>" for rw in report.rewrites)
    outputs = "".join(
        f"<tr><td>output {o.index}</td><td>{_fmt(o.form_vs_canonical and o.form_vs_canonical.max_steps)}</td>"
        f"<td>{html.escape(o.rewrite)}</td></tr>" for o in report.outputs)
    return f"""<h2>Which reference</h2>
<p id='reference'>{html.escape(report.target)}↔ref compares the target with the reference interpreter on the
target's own form of the program (must be 0 steps). A backend rewrote the canonical program (the
<code>reference</code> target's) into that form; form↔canonical compares the two: each op alone, its
inputs forced to the canonical codes (within the bound each rewrite declares, else exact), and end to
end (may drift further along the network).</p>
<table id="rewrites"><tr><th>rewrite</th><th>declared</th><th>ops</th><th>what</th></tr>{rewrites}</table>
<table id="form-outputs"><tr><th>output</th><th>form↔canonical steps, end to end</th><th>rewrite</th></tr>
{outputs}</table>"""


def write_html(report: VerificationReport, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(render_html(report), encoding="utf-8")
    return path
