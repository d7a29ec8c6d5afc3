"""A graph view of a program in Google's Model Explorer (the ``qlower[view]`` extra).

``qlower view prog.qlp [--report r.json]`` and ``report.view()`` start Model Explorer with
qlower's adapter (``main.py``, for ``.qlp`` files): the program's graph with each partition as a
group (``graph.py``) and per-node overlays of the verification report and Vela's cycles
(``overlays.py``).
"""

from qlower.view.server import ViewError, serve, view_config, view_report

__all__ = ["ViewError", "serve", "view_config", "view_report"]
