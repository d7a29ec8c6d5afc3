"""Frontend: torch.export, PT2E quantization (torchao) and import into the qlower IR.

``capture_and_import(model, example_inputs, quant, calibration)`` returns the
verified IR graph together with the two PyTorch models it is checked against:
the eval-mode float model and, when quantizing, the converted fake-quant
GraphModule. The IR takes and returns float32 tensors in PyTorch layout, like
the model; inside, 4-D activations are NHWC (see ``layout.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.fx import GraphModule

from qlower.frontend.capture import capture
from qlower.frontend.config import QuantConfig
from qlower.frontend.importer import import_graph
from qlower.frontend.layout import Perm
from qlower.ir import Graph, Value

__all__ = ["FrontendResult", "QuantConfig", "capture_and_import"]



@dataclass(frozen=True)
class FrontendResult:
    """What the frontend hands to the rest of the compiler.

    ``float_graph`` is the exported float32 GraphModule (before quantization), whose
    node names match those of ``fake_quant``. ``input_layouts`` / ``output_layouts`` give, per graph input / output, the
    permutation from the PyTorch tensor to the IR value (None: same order —
    always the case for the graph boundary today). ``node_values`` maps the name
    of every fx node of ``fake_quant`` (or of the exported float graph) that has
    an IR counterpart to that IR value and its layout, for per-layer comparison:
    the IR value, dequantized and permuted back with the inverse layout, stands
    for the node's result.
    """

    graph: Graph
    float_model: nn.Module
    fake_quant: GraphModule | None
    float_graph: GraphModule
    input_layouts: tuple[Perm | None, ...]
    output_layouts: tuple[Perm | None, ...]
    node_values: dict[str, tuple[Value, Perm]]
    float_reasons: tuple[str, ...] = ()  # ops with a rule that could not make them integer, and why


def capture_and_import(model: nn.Module, example_inputs: Sequence[torch.Tensor], quant: QuantConfig | None,
                       calibration: Iterable[object] | None = None, progress: bool = True) -> FrontendResult:
    """Export ``model``, quantize it as ``quant`` says (None: stay float32) and import it to the IR.

    ``calibration`` is a sequence of input tuples run through the observers
    (required when quantizing); ``progress`` shows a progress bar over them.
    Raises UnsupportedOpError naming the op, the model's source line and module
    when a part of the model can't be imported.
    """
    captured = capture(model, example_inputs, quant, calibration, progress=progress)
    imported = import_graph(captured.graph_module, name=type(model).__name__,
                            fallback=quant.fallback if quant is not None else "float")
    graph = imported.graph
    return FrontendResult(
        graph=graph,
        float_model=captured.float_model,
        fake_quant=captured.graph_module if captured.quantized else None,
        float_graph=captured.float_graph,
        input_layouts=tuple(None for _ in graph.inputs),
        output_layouts=tuple(None for _ in graph.outputs),
        node_values=imported.node_values,
        float_reasons=imported.float_reasons,
    )
