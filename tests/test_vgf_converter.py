"""TOSA -> VGF with the ML SDK model converter: the file has the VGF library's header, its IO
tensors (decoded with the VGF library's own Python decoder) have the partition's shapes and
element types in the TOSA graph's order, and failures are CompileErrors that say why."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import vgfpy  # (ai-ml-sdk-vgf-library, a dependency: a missing one must fail, not skip)

from qlower.backends.tosa import TosaBackend
from qlower.backends.vgf import converter
from qlower.backends.vgf.container import read_vgf
from qlower.backends.vgf.converter import tosa_to_vgf
from qlower.errors import CompileError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph

# VkFormat enum values from the Vulkan specification, per IR dtype
VK_FORMAT = {DType.INT8: 14, DType.INT16: 75, DType.INT32: 99, DType.FLOAT32: 100}
TENSOR_ARM = 1000460000  # VK_DESCRIPTOR_TYPE_TENSOR_ARM


def q8(scale=0.05, zp=0):
    return QuantSpec.per_tensor(scale, zp)


def conv_graph():
    """int8 conv (per-channel weights, bias) + rescale: the converter's bread and butter."""
    rng = np.random.default_rng(0)
    b = GraphBuilder("conv")
    x = b.input("x", TensorType((1, 8, 8, 4), DType.INT8, q8(0.05, 3)))
    wq = QuantSpec.per_channel(rng.uniform(0.004, 0.01, 8), axis=0)
    w = b.constant(rng.integers(-127, 128, (8, 3, 3, 4)).astype(np.int8), wq)
    bias = b.constant(rng.integers(-3000, 3000, 8).astype(np.int32), QuantSpec.accumulator(x.quant, wq, axis=0))
    acc = b.op("conv2d", x, w, bias, pad=(1, 1, 1, 1))
    return verify_graph(b.build([b.op("rescale", acc, out=q8(0.1, -2))]))


def mixed_io_graph():
    """Two inputs of different shapes and dtypes; outputs int32, int8, int16 in that order."""
    b = GraphBuilder("mixed")
    x = b.input("x", TensorType((2, 3, 5), DType.INT8, q8()))
    y = b.input("y", TensorType((4, 6), DType.INT16, QuantSpec.per_tensor(0.001, 0, DType.INT16)))
    acc = b.op("rescale", x, out=QuantSpec.per_tensor(0.05 / 256, 0, DType.INT32))
    y8 = b.op("rescale", y, out=q8(0.02, 1))
    x16 = b.op("rescale", x, out=QuantSpec.per_tensor(0.001, 0, DType.INT16))
    return verify_graph(b.build([acc, y8, x16]))


def to_vgf(graph, profile="tosa-1.0+int") -> bytes:
    return tosa_to_vgf(TosaBackend().lower(graph, profile).blobs["graph.tosa"]).vgf


def decode_io(data: bytes):
    """(inputs, outputs) as (shape, VkFormat, descriptor type) lists, read with vgfpy alone."""
    header = vgfpy.CreateHeaderDecoder(data, vgfpy.HeaderSize(), len(data))
    assert header is not None and header.IsValid() and header.CheckVersion()
    seq_off, seq_size = header.GetModelSequenceTableOffset(), header.GetModelSequenceTableSize()
    res_off, res_size = header.GetModelResourceTableOffset(), header.GetModelResourceTableSize()
    seq_bytes, res_bytes = data[seq_off:seq_off + seq_size], data[res_off:res_off + res_size]
    seq = vgfpy.CreateModelSequenceTableDecoder(seq_bytes, seq_size)
    res = vgfpy.CreateModelResourceTableDecoder(res_bytes, res_size)

    def tensors(slots):
        out = []
        for i in range(seq.getBindingsSize(slots)):
            m = seq.getBindingSlotMrtIndex(slots, i)
            out.append((tuple(res.getTensorShape(m)), res.getVkFormat(m), res.getDescriptorType(m)))
        return out

    return (tensors(seq.getModelSequenceInputBindingSlotsHandle()),
            tensors(seq.getModelSequenceOutputBindingSlotsHandle()))


def expected_io(graph):
    def one(v):
        return (v.shape, VK_FORMAT[v.dtype], TENSOR_ARM)
    return [one(v) for v in graph.inputs], [one(v) for v in graph.outputs]


def test_converter_writes_the_vgf_librarys_header():
    data = to_vgf(conv_graph())
    magic = vgfpy.HEADER_MAGIC_VALUE
    assert data[vgfpy.HEADER_MAGIC_OFFSET:vgfpy.HEADER_MAGIC_OFFSET + 4] == (magic.a + magic.b + magic.c + magic.d).encode()
    header = vgfpy.CreateHeaderDecoder(data, vgfpy.HeaderSize(), len(data))
    assert header.IsValid() and header.CheckVersion()
    assert (header.GetMajor(), header.GetMinor()) == (vgfpy.HEADER_MAJOR_VERSION_VALUE, vgfpy.HEADER_MINOR_VERSION_VALUE)
    # every section lies inside the file, after the header
    for offset, size in ((header.GetModuleTableOffset(), header.GetModuleTableSize()),
                         (header.GetModelSequenceTableOffset(), header.GetModelSequenceTableSize()),
                         (header.GetModelResourceTableOffset(), header.GetModelResourceTableSize()),
                         (header.GetConstantsOffset(), header.GetConstantsSize())):
        assert vgfpy.HEADER_HEADER_SIZE_VALUE <= offset and offset + size <= len(data)


@pytest.mark.parametrize("graph", [conv_graph(), mixed_io_graph()], ids=["conv", "mixed_io"])
def test_io_tensors_are_the_partitions_in_tosa_order(graph):
    data = to_vgf(graph)
    assert decode_io(data) == expected_io(graph)
    model = read_vgf(data)
    assert [(t.shape, t.dtype) for t in model.inputs] == [(v.shape, v.dtype) for v in graph.inputs]
    assert [(t.shape, t.dtype) for t in model.outputs] == [(v.shape, v.dtype) for v in graph.outputs]
    bindings = [t.binding for t in model.inputs + model.outputs]
    assert len(set(bindings)) == len(bindings)
    assert model.segments == ("GRAPH",)


def test_float_graph_in_the_int_fp_profile():
    b = GraphBuilder("fp")
    x = b.input("x", TensorType((1, 4, 4, 8), DType.INT8, q8(0.05, 3)))
    s = b.op("sigmoid", b.op("dequantize", x, None))
    g = verify_graph(b.build([s, b.op("quantize", s, out=QuantSpec.per_tensor(1 / 256, -128))]))
    assert decode_io(to_vgf(g, "tosa-1.0+int+fp")) == expected_io(g)


def test_invalid_tosa_is_a_compile_error_with_the_converters_message():
    tosa = TosaBackend().lower(conv_graph(), "tosa-1.0+int").blobs["graph.tosa"]
    with pytest.raises(CompileError, match="(?s)could not convert partition 'p7' to VGF.*TOSA graph failed flatbuffer verification"):
        tosa_to_vgf(tosa[:100], "partition 'p7'")


def test_missing_converter_says_what_to_install(monkeypatch):
    monkeypatch.setattr(converter, "packaged_binary", lambda *a: None)
    with pytest.raises(CompileError, match="model converter .* not installed: pip install ai-ml-sdk-model-converter"):
        tosa_to_vgf(b"")


def test_corrupt_vgf_files_are_compile_errors():
    data = to_vgf(conv_graph())
    with pytest.raises(CompileError, match="shorter than the 128-byte header"):
        read_vgf(data[:64])
    with pytest.raises(CompileError, match="magic b'XGF1'"):
        read_vgf(b"X" + data[1:])
    seq_offset = struct.unpack_from("<Q", data, 32)[0]  # header: (offset, size) pairs from byte 16
    with pytest.raises(CompileError, match="model_sequence section .* outside"):
        read_vgf(data[:seq_offset + 8])
    huge = bytearray(data)
    struct.pack_into("<Q", huge, 16 + 16 * 2 + 8, 1 << 40)  # model-resource section size
    with pytest.raises(CompileError, match="model_resource section"):
        read_vgf(bytes(huge))
