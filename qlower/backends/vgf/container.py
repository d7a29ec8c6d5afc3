"""Reading a VGF file: its header and the tensors the model reads and writes.

A VGF file (ML SDK for Vulkan) starts with a 128-byte header: the magic
``VGF1``, the Vulkan headers version (uint32 at byte 4), the format version
(major, minor, patch bytes at byte 8), then four (offset, size) uint64 pairs
for the module, model-sequence, model-resource and constant sections. The
header is checked here in plain Python (magic, version, every section inside
the file) before the official decoder (``vgfpy``, from ai-ml-sdk-vgf-library)
reads the sections, so a truncated or foreign file is a clear error rather
than a read out of bounds.

``read_vgf`` returns the model's inputs and outputs in model-sequence order
(the order the model converter gives the TOSA graph's inputs and outputs):
binding number, shape and Vulkan format, and the qlower dtype of that format.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from qlower.errors import CompileError
from qlower.ir import DType

MAGIC = b"VGF1"
HEADER_SIZE = 128
SECTIONS = ("module", "model_sequence", "model_resource", "constant")
# Vulkan formats of VGF tensors (VkFormat values) and the qlower dtype each holds.
FORMATS: dict[int, tuple[str, DType | None]] = {
    13: ("VK_FORMAT_R8_UINT", DType.UINT8),
    14: ("VK_FORMAT_R8_SINT", DType.INT8),
    74: ("VK_FORMAT_R16_UINT", None),
    75: ("VK_FORMAT_R16_SINT", DType.INT16),
    76: ("VK_FORMAT_R16_SFLOAT", None),
    98: ("VK_FORMAT_R32_UINT", None),
    99: ("VK_FORMAT_R32_SINT", DType.INT32),
    100: ("VK_FORMAT_R32_SFLOAT", DType.FLOAT32),
    111: ("VK_FORMAT_R64_SINT", None),
}
FORMAT_OF_DTYPE: dict[DType, str] = {d: name for name, d in FORMATS.values() if d is not None}
_TENSOR_DESCRIPTOR = 1000460000  # VK_DESCRIPTOR_TYPE_TENSOR_ARM


@dataclass(frozen=True)
class VgfTensor:
    """One model input or output as the VGF describes it."""

    name: str
    binding: int
    shape: tuple[int, ...]
    vk_format: str
    dtype: DType | None   # None: a format qlower has no dtype for

    def as_meta(self) -> dict:
        return {"name": self.name, "binding": self.binding, "shape": list(self.shape), "format": self.vk_format}


@dataclass(frozen=True)
class VgfModel:
    version: tuple[int, int, int]
    inputs: tuple[VgfTensor, ...]
    outputs: tuple[VgfTensor, ...]
    segments: tuple[str, ...]        # segment types in dispatch order ("GRAPH" / "COMPUTE")
    constants: int


def check_header(data: bytes) -> dict[str, tuple[int, int]]:
    """The (offset, size) of each section; CompileError when ``data`` is not a well-formed VGF."""
    if len(data) < HEADER_SIZE:
        raise CompileError(f"not a VGF file: {len(data)} bytes, shorter than the {HEADER_SIZE}-byte header")
    if data[:4] != MAGIC:
        raise CompileError(f"not a VGF file: magic {data[:4]!r}, expected {MAGIC!r}")
    sections = {}
    for i, name in enumerate(SECTIONS):
        offset, size = struct.unpack_from("<QQ", data, 16 + 16 * i)
        if offset < HEADER_SIZE or offset + size > len(data):
            raise CompileError(f"corrupt VGF file: its {name} section ({size} bytes at {offset}) lies outside "
                               f"the {len(data)}-byte file")
        sections[name] = (offset, size)
    return sections


def version(data: bytes) -> tuple[int, int, int]:
    return data[8], data[9], data[10]


def _vgfpy():
    try:
        import vgfpy
    except ImportError as e:
        raise CompileError(f"can't read VGF files: the VGF library's Python module is missing ({e}); "
                           "pip install ai-ml-sdk-vgf-library (scripts/setup_vulkan.sh does)") from None
    return vgfpy


def read_vgf(data: bytes) -> VgfModel:
    """Decode the header, IO tensors and segments of a VGF file (CompileError if malformed)."""
    sections = check_header(data)
    vgf = _vgfpy()
    header = vgf.CreateHeaderDecoder(data, HEADER_SIZE, len(data))
    if header is None or not header.IsValid():
        raise CompileError("not a VGF file: the VGF library rejects its header")
    if not header.CheckVersion():
        raise CompileError(f"VGF format version {'.'.join(map(str, version(data)))} is not one the installed "
                           "VGF library reads")
    # the section buffers stay referenced while their decoders are used
    seq_off, seq_size = sections["model_sequence"]
    res_off, res_size = sections["model_resource"]
    seq_bytes, res_bytes = data[seq_off:seq_off + seq_size], data[res_off:res_off + res_size]
    seq = vgf.CreateModelSequenceTableDecoder(seq_bytes, seq_size)
    res = vgf.CreateModelResourceTableDecoder(res_bytes, res_size)
    if seq is None or res is None:
        raise CompileError("corrupt VGF file: the VGF library can't decode its model tables")

    def tensors(slots, names, category) -> tuple[VgfTensor, ...]:
        out = []
        n_names = seq.getNamesSize(names)
        for i in range(seq.getBindingsSize(slots)):
            mrt = seq.getBindingSlotMrtIndex(slots, i)
            if mrt >= res.size() or res.getCategory(mrt) != category:
                raise CompileError(f"corrupt VGF file: model {category.name.lower()} {i} points at resource "
                                   f"{mrt}, which is not a {category.name.lower()}")
            if res.getDescriptorType(mrt) != _TENSOR_DESCRIPTOR:
                raise CompileError(f"VGF model {category.name.lower()} {i} is not a tensor "
                                   f"(descriptor type {res.getDescriptorType(mrt)})")
            code = res.getVkFormat(mrt)
            fmt, dtype = FORMATS.get(code, (f"VkFormat {code}", None))
            shape = res.getTensorShape(mrt)
            out.append(VgfTensor(seq.getName(names, i) if n_names > i else f"{category.name.lower()}_{i}",
                                 seq.getBindingSlotBinding(slots, i),
                                 tuple(int(d) for d in (shape if shape is not None else ())), fmt, dtype))
        return tuple(out)

    cat = vgf.ResourceCategory
    inputs = tensors(seq.getModelSequenceInputBindingSlotsHandle(), seq.getModelSequenceInputNamesHandle(),
                     cat.Input)
    outputs = tensors(seq.getModelSequenceOutputBindingSlotsHandle(), seq.getModelSequenceOutputNamesHandle(),
                      cat.Output)
    segments = tuple(seq.getSegmentType(i).name.upper() for i in range(seq.modelSequenceTableSize()))
    const_off, const_size = sections["constant"]
    const_bytes = data[const_off:const_off + const_size]
    consts = vgf.CreateConstantDecoder(const_bytes, const_size) if const_size else None
    return VgfModel(version(data), inputs, outputs, segments, consts.size() if consts is not None else 0)
