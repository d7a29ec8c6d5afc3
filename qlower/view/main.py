"""The Model Explorer adapter for qlower program files (``.qlp``).

Model Explorer imports ``<extension>.main`` for each extension module it is given; this is
``qlower.view``'s. The adapter loads the file with ``qlower.load`` (every check a load makes)
and returns the program's graph (``qlower/view/graph.py``).
"""

from __future__ import annotations

import os

from model_explorer import Adapter, AdapterMetadata, ModelExplorerGraphs

ADAPTER_ID = "qlower_program"


class QlowerProgramAdapter(Adapter):
    """A qlower program file as one graph: partitions as groups, host ops outside them."""

    metadata = AdapterMetadata(
        id=ADAPTER_ID, name="qlower program",
        description="A qlower program: partitions per backend and target, host ops and why, quantization.",
        fileExts=["qlp"])

    def convert(self, model_path: str, settings: dict) -> ModelExplorerGraphs:
        from qlower.program.fileformat import load
        from qlower.view.graph import program_graph

        return {"graphs": [program_graph(load(model_path), graph_id=graph_id_for(model_path))]}


def graph_id_for(path: str | os.PathLike) -> str:
    """The graph's id: the program file's name (node data is bound to it)."""
    return os.path.basename(os.fspath(path))
