"""Real models from the ecosystem (issue 25) on every target: Hugging Face transformers from tiny configs,
and timm backbones at the reduced sizes of qlower.testing.real_models.CI_MODELS,
randomly initialised (nothing is downloaded).

Per model: compiled once (static int8), then lowered for each of TARGETS; every output equals the reference
interpreter's on the target's form (computed once per form: the targets without rewrites share it), the
program runs no float op on the host (boundary quantize / dequantize aside: LayerNorm, GELU, softmax under
an attention mask are integer), and the reference's layers are within one step of PyTorch's fake-quant
model. benchmarks/real_models.py measures the larger
set (REAL_MODELS) with compile times and partitions.

VGF runs on Vulkan (lavapipe) for every model but the five of VGF_SIMULATED, whose Vulkan runs cost 12-25 s
each (lavapipe compiles a shader per operator, ~20 ms each): for those the same VGF lowering is run by the
TOSA reference model, and the test asserts which execution each one got.
"""

import numpy as np
import pytest
import transformers  # noqa: F401  (the test extra installs it: a missing one fails here, never skips)

import qlower
from qlower.api import lower_graph
from qlower.reference import run_graph
from qlower.testing.coverage import on_host
from qlower.testing.frontend import FLOAT_BOUNDARY, fake_quant_agreement
from qlower.testing.real_models import CI_MODELS

# every backend: the other Ethos-U MAC configurations lower through the same code with another Vela
# configuration, and TOSA/VGF's +fp profiles add float operators, which these integer programs only use at
# their boundary
TARGETS = ("reference", "cpu", "tosa-1.0+int", "ethos-u55-128", "ethos-u85-256", "vgf+int", "litert", "tflm")

# the slowest first (measured), so that the two workers finish together
MODELS = ("edgenext_xx_small", "convnext_atto", "regnetx_002", "wav2vec2", "yolos", "bert", "resnest14d", "vit",
          "mobilenetv3_small", "vit_tiny", "efficientnet_b0", "distilbert", "mobilebert", "ghostnet", "resnet18",
          "repvgg_a0")


# the largest graphs: their VGF lowering is checked, its Vulkan execution is left to the other eleven models
VGF_SIMULATED = {"edgenext_xx_small", "convnext_atto", "regnetx_002", "wav2vec2", "resnest14d"}


def _host_float(prog) -> list[str]:
    return [str(op.attrs.get("target", op.kind)) for op in prog.source.ops
            if op.kind not in FLOAT_BOUNDARY and on_host(prog, op)
            and any(r.dtype.is_float and r.quant is None for r in op.results)]


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_every_target_exact_and_integer(name):
    entry = CI_MODELS[name]
    model, example = entry.build()
    compiled = qlower.compile(model, example, target="reference", calibration=entry.calibration(), progress=False)
    inputs = entry.make_inputs(7)
    cmp = fake_quant_agreement(compiled.frontend, [inputs])
    assert cmp.layers.total > 0 and cmp.layers.max_step <= 1, cmp
    meanings: dict[int, tuple] = {}  # form, its outputs, by the form's identity: targets without rewrites share it
    for target in TARGETS:
        options = None
        if target.startswith("vgf"):
            options = {"execution": "simulate" if name in VGF_SIMULATED else "vulkan"}
        prog = compiled if target == "reference" else lower_graph(compiled.source, target, backend_options=options)
        if options:
            kinds = {p.payload.execution.kind for p in prog.partitions}
            assert kinds == ({"simulated"} if name in VGF_SIMULATED else {"vulkan"}), (target, kinds)
        assert _host_float(prog) == [], target
        if id(prog.source) not in meanings:
            meanings[id(prog.source)] = prog.source, run_graph(prog.source, [t.numpy() for t in inputs])
        for got, want in zip(prog.run(*inputs), meanings[id(prog.source)][1], strict=True):
            assert got.dtype == want.dtype and got.shape == want.shape, target
            np.testing.assert_array_equal(got, want, err_msg=f"{name} on {target}")
