"""A sweep's HTML page: its rows as a sortable table and a Pareto plot of quality against cost.

Made as the verification report's page is (qlower/verification/html.py): one self-contained file,
pictures drawn with matplotlib (Agg) and embedded as PNG data URIs; sorting is a few lines of script
on the page (click a column's head; again for the other order).
"""

from __future__ import annotations

import html

from qlower.sweep.results import COLUMNS, NUMERIC, SweepResult, cell
from qlower.verification.html import _img, _png

_COLORS = ["#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f"]

_SORT_SCRIPT = """
document.querySelectorAll('table.sortable th').forEach((th, col) => th.addEventListener('click', () => {
  const body = th.closest('table').tBodies[0];
  const up = th.dataset.order !== 'asc'; th.dataset.order = up ? 'asc' : 'desc';
  const key = tr => { const c = tr.cells[col]; return c.dataset.v !== undefined ? c.dataset.v : c.textContent; };
  const rows = Array.from(body.rows).sort((a, b) => {
    const x = key(a), y = key(b), nx = parseFloat(x), ny = parseFloat(y);
    const r = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : String(x).localeCompare(String(y));
    return up ? r : -r; });
  rows.forEach(tr => body.appendChild(tr)); }));
"""


def pareto_plot(result: SweepResult) -> bytes:
    """Each row with both a cost and a quality as a point (colour: target), the Pareto front as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cost, quality = result.axes()
    rows = [r for r in result.rows if r["status"] != "failed" and r.get(cost) is not None
            and r.get(quality) is not None]
    targets = sorted({r["target"] for r in rows})
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for k, target in enumerate(targets):
        mine = [r for r in rows if r["target"] == target]
        ax.scatter([r[cost] for r in mine], [r[quality] for r in mine], color=_COLORS[k % len(_COLORS)],
                   label=target, s=28, zorder=3)
    front = [result.rows[i] for i in result.pareto()]
    ax.step([r[cost] for r in front], [r[quality] for r in front], where="post", color="black", lw=1,
            ls="--", label="Pareto front", zorder=2)
    for r in front:
        ax.annotate(r["model"].removeprefix("zoo:"), (r[cost], r[quality]), fontsize=6, xytext=(3, 3),
                    textcoords="offset points")
    if cost == "cycles":
        ax.set_xscale("log")
    ax.set_xlabel(f"{COLUMNS[cost]} (lower is better)")
    ax.set_ylabel(f"{COLUMNS[quality]} (higher is better)")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"{COLUMNS[quality]} against {COLUMNS[cost]}", fontsize=9)
    return _png(fig)


def render_html(result: SweepResult) -> str:
    shown = [name for name in COLUMNS if name in ("model", "target", "status")
             or any(r.get(name) not in (None, {}, "") for r in result.rows)]
    head = "".join(f"<th>{html.escape(COLUMNS[n])}</th>" for n in shown)
    pareto = set(result.pareto())
    body = []
    for i, r in enumerate(result.rows):
        cells = []
        for n in shown:
            sort_value = f" data-v='{r[n]}'" if n in NUMERIC and r.get(n) is not None else ""
            cells.append(f"<td{sort_value}>{html.escape(cell(r, n))}</td>")
        classes = " ".join(c for c in (r["status"].replace(" ", "-"), "pareto" if i in pareto else "") if c)
        body.append(f"<tr class='{classes}'>{''.join(cells)}</tr>")
    c = result.counts
    plot = ""
    if result.axes() is not None:
        plot = f"<h2>Pareto front</h2>{_img(pareto_plot(result), 'Pareto plot')}"
    notes = "".join(f"<p>{html.escape(n)}</p>" for n in result.notes)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>qlower sweep — {len(result.rows)} jobs</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }} table {{ border-collapse: collapse; font-size: 13px; }}
td, th {{ border: 1px solid #ccc; padding: 2px 6px; }} th {{ cursor: pointer; background: #f3f3f3; }}
tr.failed td {{ color: #c22; }} tr.not-exact td {{ color: #b60; }} tr.pareto td:first-child {{ font-weight: bold; }}
img {{ max-width: 100%; }}
</style></head><body>
<h1>qlower sweep — {len(result.rows)} job(s)</h1>
<p id="summary">{html.escape(result.executor)} ({result.workers} worker(s)), {result.seconds:.1f} s:
{c['ok']} ok, {c['not exact']} not exact, {c['failed']} failed, {c['cached']} from the cache.
Bold: on the Pareto front. Click a column to sort.</p>
{plot}
<h2>Jobs</h2>
<table id="rows" class="sortable"><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>
{notes}
<script>{_SORT_SCRIPT}</script>
</body></html>
"""
