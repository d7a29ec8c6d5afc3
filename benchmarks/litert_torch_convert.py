"""Converts an exported float model with litert-torch's int8 PT2E quantization (run by ``memory.py`` in a
venv of its own: litert-torch needs packages qlower's venv does not hold; never imports qlower).

    python litert_torch_convert.py <model.pt2> <calibration.pt> <out.tflite>

``model.pt2``: ``torch.export.save`` of the float model; ``calibration.pt``: a list of input tuples
(tensors only). Quantization: litert-torch's symmetric config, per-channel weights, static.
"""

from __future__ import annotations

import sys

import litert_torch
import torch
from litert_torch.quantize.pt2e_quantizer import PT2EQuantizer, get_symmetric_quantization_config
from litert_torch.quantize.quant_config import QuantConfig
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e


def main() -> None:
    model_path, calibration_path, out = sys.argv[1:4]
    exported = torch.export.load(model_path)
    calibration = torch.load(calibration_path, weights_only=True)
    example = tuple(calibration[0])
    quantizer = PT2EQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=False))
    prepared = prepare_pt2e(torch.export.export(exported.module(), example).module(), quantizer)
    for inputs in calibration:
        prepared(*inputs)
    quantized = convert_pt2e(prepared, fold_quantize=False)
    edge = litert_torch.convert(quantized, example, quant_config=QuantConfig(pt2e_quantizer=quantizer))
    edge.export(out)


if __name__ == "__main__":
    main()
