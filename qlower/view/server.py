"""``qlower view``: Model Explorer's local server with the qlower adapter and the overlays."""

from __future__ import annotations

import os
import sys
from typing import Any

from qlower.errors import QlowerError


class ViewError(QlowerError):
    """The graph view can't start (Model Explorer missing, a port taken)."""


def view_config(program_path: str | os.PathLike, report: Any = None):
    """The Model Explorer config that opens ``program_path`` with qlower's adapter and every overlay
    (``report``: a VerificationReport, its JSON dict, or a path to its JSON)."""
    from model_explorer import config

    from qlower.program.fileformat import load
    from qlower.view.main import ADAPTER_ID, graph_id_for
    from qlower.view.overlays import overlays_for

    path = os.path.abspath(os.fspath(program_path))
    program = load(path)    # refuses a corrupt file here, before a browser opens
    cfg = config().add_model_from_path(path, adapterId=ADAPTER_ID)
    graph_id = graph_id_for(path)
    for overlay in overlays_for(program, _report_data(report)):
        cfg.add_node_data(overlay.name, overlay.node_data(graph_id), model_name=graph_id)
    return cfg


def serve(program_path: str | os.PathLike, report: Any = None, host: str = "localhost", port: int | None = None,
          open_browser: bool = True) -> None:
    """Start Model Explorer on ``program_path`` (blocks until Ctrl-C); prints the page's URL."""
    try:
        from model_explorer import server
    except ImportError as e:
        raise ViewError("the graph view needs Model Explorer: pip install 'qlower[view]' "
                        "(ai-edge-model-explorer)") from e
    cfg = view_config(program_path, report)
    # no look-up on the internet for a newer release: the answer "none newer" (the page asks too)
    server._check_new_version = lambda print_msg=True: {"version": "", "runningVersion": "", "releaseUrl": "",
                                                        "desktopAppUrl": ""}
    chosen = 8080 if port is None else int(port)
    if port is not None and server._is_port_in_use(host, chosen):
        raise ViewError(f"port {chosen} on {host} is in use: choose another with --port")
    if hasattr(sys.stdout, "reconfigure"):   # the URL line reaches a pipe (a script, a test) at once
        sys.stdout.reconfigure(line_buffering=True)
    server.start(host=host, port=chosen, config=cfg, no_open_in_browser=not open_browser,
                 extensions=["qlower.view"])


def view_report(report: Any, port: int | None = None, open_browser: bool = True) -> None:
    """``report.view()``: the report's program, saved to a temporary file, served with the report."""
    import tempfile

    if getattr(report, "program", None) is None:
        raise ViewError("this report has no program to show (a report read back from JSON): "
                        "run qlower view PROGRAM.qlp --report REPORT.json")
    with tempfile.TemporaryDirectory(prefix="qlower-view-") as folder:
        path = os.path.join(folder, f"{report.target}.qlp")
        report.program.save(path)
        serve(path, report=report, port=port, open_browser=open_browser)


def _report_data(report: Any):
    if report is None or not isinstance(report, (str, os.PathLike)):
        return report
    import json

    try:
        with open(report, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ViewError(f"can't read the verification report {os.fspath(report)!r}: {e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("layers"), list):
        raise ViewError(f"{os.fspath(report)!r} is not a qlower verification report (no 'layers' list): "
                        "write one with qlower verify --json")
    return data
