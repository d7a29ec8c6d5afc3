"""The in-process Vela wrapper on hand-built TOSA 1.0 graphs (no qlower lowering involved).

Expected values are derived by hand: the driver header layout Vela writes
(fourcc "COP1", a Config action, NOPs up to 16 bytes, a CmdStream action
holding the register stream's length in words), MAC counts of the graphs,
element sizes of int8/int32 tensors.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
import tosa_serializer as ts

from qlower.backends.ethosu import vela
from qlower.errors import CompileError, ConfigError

D = ts.DType
ACCS = ["ethos-u85-256", "ethos-u55-128"]


class G:
    """A few lines over TosaSerializer for TOSA 1.0.0 test graphs."""

    def __init__(self):
        self.ser = ts.TosaSerializer("", ts.ConstMode.EMBED, 1, 0, 0, False)
        self.n = 0

    def const(self, arr, dt):
        self.n += 1
        arr = np.asarray(arr)
        return self.ser.addConst(list(arr.shape), dt, arr, f"c{self.n}").name

    def inp(self, shape, dt):
        return self.ser.addPlaceholder(shape, dt, None).name

    def tmp(self, shape, dt):
        return self.ser.addIntermediate(shape, dt).name

    def out(self, shape, dt):
        return self.ser.addOutput(shape, dt).name

    def op(self, op, ins, outs, kind, *args):
        a = ts.TosaSerializerAttribute()
        getattr(a, kind + "Attribute")(*args)
        self.ser.addOperator(op, ins, outs, a)

    def zp(self, v=0, dt=D.INT8):
        return self.const(np.array([v], np.int8 if dt == D.INT8 else np.int32), dt)

    def rescale(self, x, y, mult, shift, idt, odt, izp=0, ozp=0):
        self.op(ts.Op.RESCALE, [x, self.const(np.array([mult], np.int32), D.INT32),
                                self.const(np.array([shift], np.int8), D.INT8), self.zp(izp, idt), self.zp(ozp, odt)],
                [y], "Rescale", True, ts.RoundingMode.SINGLE_ROUND, False, False, False)

    def bytes(self):
        return bytes(self.ser.serialize())


def conv_graph():
    """int8 [1,8,8,4] -> 3x3 conv, pad 1, 8 channels -> rescale -> int8: 8*8*8 * 3*3*4 = 18432 MACs."""
    g = G()
    rng = np.random.default_rng(0)
    x = g.inp([1, 8, 8, 4], D.INT8)
    acc = g.tmp([1, 8, 8, 8], D.INT32)
    g.op(ts.Op.CONV2D, [x, g.const(rng.integers(-100, 100, (8, 3, 3, 4)).astype(np.int8), D.INT8),
                        g.const(rng.integers(-1000, 1000, 8).astype(np.int32), D.INT32), g.zp(-5), g.zp()],
         [acc], "Conv2d", [1, 1, 1, 1], [1, 1], [1, 1], False, D.INT32)
    g.rescale(acc, g.out([1, 8, 8, 8], D.INT8), 1 << 30, 40, D.INT32, D.INT8, ozp=3)
    return g.bytes()


def matmul_graph():
    """[1,4,16] x [1,16,8] int8 -> int32 -> rescale int8: 4*16*8 = 512 MACs."""
    g = G()
    a, b = g.inp([1, 4, 16], D.INT8), g.inp([1, 16, 8], D.INT8)
    acc = g.tmp([1, 4, 8], D.INT32)
    g.op(ts.Op.MATMUL, [a, b, g.zp(), g.zp()], [acc], "MatMul")
    g.rescale(acc, g.out([1, 4, 8], D.INT8), 1 << 30, 38, D.INT32, D.INT8)
    return g.bytes()


def table_graph():
    g = G()
    x = g.inp([1, 8, 8, 4], D.INT8)
    table = np.clip(np.arange(-128, 128) // 2 + 10, -128, 127).astype(np.int8)
    g.op(ts.Op.TABLE, [x, g.const(table, D.INT8)], [g.out([1, 8, 8, 4], D.INT8)], "Table")
    return g.bytes()


def add_graph():
    """int8 add as TOSA spells it: rescale both to int32, ADD, rescale back."""
    g = G()
    x1, x2 = g.inp([1, 8, 8, 4], D.INT8), g.inp([1, 8, 8, 4], D.INT8)
    a1, a2, s = (g.tmp([1, 8, 8, 4], D.INT32) for _ in range(3))
    g.rescale(x1, a1, 1 << 30, 30, D.INT8, D.INT32)
    g.rescale(x2, a2, 1 << 30, 30, D.INT8, D.INT32)
    g.op(ts.Op.ADD, [a1, a2], [s], "Add")
    g.rescale(s, g.out([1, 8, 8, 4], D.INT8), 1 << 30, 31, D.INT32, D.INT8)
    return g.bytes()


def binary_int32_graph(op, kind):
    g = G()
    a, b = g.inp([1, 4, 4, 8], D.INT32), g.inp([1, 4, 4, 8], D.INT32)
    g.op(op, [a, b], [g.out([1, 4, 4, 8], D.INT32)], kind)
    return g.bytes()


def fp32_add_graph():
    g = G()
    a, b = g.inp([1, 4, 4, 4], D.FP32), g.inp([1, 4, 4, 4], D.FP32)
    g.op(ts.Op.ADD, [a, b], [g.out([1, 4, 4, 4], D.FP32)], "Add")
    return g.bytes()


GRAPHS = {"conv": conv_graph, "matmul": matmul_graph, "table": table_graph, "add": add_graph}
# graph -> [(name, shape)] of inputs then outputs, all int8
IO = {"conv": [("input-0", (1, 8, 8, 4)), ("result-0", (1, 8, 8, 8))],
      "matmul": [("input-0", (1, 4, 16)), ("input-1", (1, 16, 8)), ("result-0", (1, 4, 8))],
      "table": [("input-0", (1, 8, 8, 4)), ("result-0", (1, 8, 8, 4))],
      "add": [("input-0", (1, 8, 8, 4)), ("input-1", (1, 8, 8, 4)), ("result-0", (1, 8, 8, 4))]}
MIN_MACS = {"conv": 18432, "matmul": 512, "table": 0, "add": 0}


def check_driver_header(cs: bytes, macs_per_cycle: int) -> None:
    """Vela's driver actions: COP1, Config(rel 0, patch 1) + config word + id word, NOPs, CmdStream(len)."""
    assert cs[:4] == b"COP1"
    assert len(cs) % 4 == 0 and len(cs) > 32
    words = struct.unpack("<8I", cs[:32])
    assert words[1] == 0x01 | (1 << 4) << 16            # Config action, patch 1, rel 0
    assert words[2] & 0xF == macs_per_cycle.bit_length() - 1   # config word: log2(MACs per cycle)
    assert words[4:7] == (0x05, 0x05, 0x05)              # NOPs aligning the stream to 16 bytes
    assert words[7] & 0xFF == 0x02                        # CmdStream action
    length = (words[7] >> 16) | (((words[7] >> 8) & 0xFF) << 16)
    assert length == (len(cs) - 32) // 4                  # the rest of the blob is the register stream


@pytest.mark.parametrize("acc", ACCS)
@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_compile_small_graphs(acc, graph):
    cfg = vela.vela_config(acc)
    r = vela.compile_tosa(GRAPHS[graph](), cfg)
    check_driver_header(r.command_stream, int(acc.rsplit("-", 1)[1]))
    assert r.perf["npu_cycles"] > 0
    assert r.perf["total_cycles"] >= r.perf["npu_cycles"]
    assert r.perf["macs"] >= MIN_MACS[graph]
    clock = {"ethos-u85-256": 1e9, "ethos-u55-128": 500e6}[acc]  # core_clock of Vela's default system configs
    assert r.perf["core_clock_hz"] == clock
    assert r.perf["inference_seconds"] == pytest.approx(r.perf["total_cycles"] / clock)
    got = [(t.name, t.shape, t.dtype, t.element_size) for t in r.inputs + r.outputs]
    assert got == [(n, s, "INT8", 1) for n, s in IO[graph]]
    for t in r.inputs + r.outputs:
        assert t.size == int(np.prod(t.shape)) and t.region == 1
        assert 0 <= t.offset and t.offset + t.size <= r.scratch_size
    if graph == "conv":  # weights (8*3*3*4 bytes before encoding) and biases live in the read-only region
        assert r.perf["macs"] == 18432
        assert len(r.read_only) > 0 and r.perf["original_weight_bytes"] == 8 * 3 * 3 * 4


def test_int32_io_element_size_is_four():
    r = vela.compile_tosa(binary_int32_graph(ts.Op.ADD, "Add"), vela.vela_config("ethos-u55-128"))
    assert [(t.dtype, t.element_size, t.size) for t in r.inputs + r.outputs] == [("INT32", 4, 4 * 4 * 8 * 4)] * 3


def test_per_layer_estimate_names_the_source_operators():
    cfg = vela.vela_config("ethos-u85-256")
    r = vela.compile_tosa(conv_graph(), cfg, per_layer=True)
    assert [row["source_operator"] for row in r.per_layer] == ["Conv2D"]
    assert r.per_layer[0]["macs"] == 18432 and r.per_layer[0]["npu_cycles"] > 0
    assert vela.compile_tosa(conv_graph(), cfg).per_layer is None


def test_all_accelerators_are_vela_s_and_each_compiles():
    from ethosu.vela.architecture_features import Accelerator

    assert list(vela.ACCELERATORS) == Accelerator.member_list()
    buf = conv_graph()
    for acc in vela.ACCELERATORS:
        cfg = vela.vela_config(acc)
        assert cfg.macs * cfg.cores == int(acc.rsplit("-", 1)[1])
        check_driver_header(vela.compile_tosa(buf, cfg).command_stream, cfg.macs * cfg.cores)


def test_u55_rejects_intdiv_u85_takes_it():
    buf = binary_int32_graph(ts.Op.INTDIV, "IntDiv")
    assert vela.compile_tosa(buf, vela.vela_config("ethos-u85-256")).perf["npu_cycles"] > 0
    with pytest.raises(vela.VelaRejection) as e:
        vela.compile_tosa(buf, vela.vela_config("ethos-u55-128"))
    assert e.value.kind == "npu_support" and e.value.ops == (("Div", ()),)
    assert str(e.value) == "Vela (ethos-u55-128): Non-passthrough operation (Div) could not run on NPU"


def test_float_graph_fails_tosa_validation_with_the_op_named():
    with pytest.raises(vela.VelaRejection) as e:
        vela.compile_tosa(fp32_add_graph(), vela.vela_config("ethos-u85-256"))
    assert e.value.kind == "validation"
    assert [op for op, _ in e.value.ops] == ["Add"] and e.value.ops[0][1]
    assert str(e.value).startswith("Vela (ethos-u85-256): TOSA validation: Add: ")


@pytest.mark.parametrize("buf", [b"", b"\x00" * 16, b"\x1c\x00\x00\x00TFL3" + b"\x00" * 64])
def test_only_tosa_bytes_reach_vela(buf):
    with pytest.raises(CompileError, match="not a TOSA flatbuffer"):
        vela.compile_tosa(buf, vela.vela_config("ethos-u85-256"))


def test_detect_format():
    assert vela.detect_format(conv_graph()) == "TOSA"
    assert vela.detect_format(b"\x1c\x00\x00\x00TFL3....") == "TFLITE"
    assert vela.detect_format(b"TOSA") is None


def test_bad_configurations_are_errors():
    with pytest.raises(CompileError, match="unknown Ethos-U accelerator 'ethos-u99-1'"):
        vela.vela_config("ethos-u99-1")
    with pytest.raises(ConfigError, match="system_config='Nope' is not a system config of ethos-u85-256"):
        vela.vela_config("ethos-u85-256", system_config="Nope")
    with pytest.raises(CompileError, match="Nope"):
        vela.vela_config("ethos-u85-256", memory_mode="Nope")


def test_system_config_and_memory_mode_reach_vela():
    """Shared_Sram puts the arena in SRAM: no fast-scratch region, unlike Dedicated_Sram_384KB."""
    flash = vela.vela_config("ethos-u85-256", "Ethos_U85_SYS_Flash_High", "Shared_Sram")
    dram = vela.vela_config("ethos-u85-256")
    assert (dram.system_config, dram.memory_mode) == ("Ethos_U85_SYS_DRAM_Mid", "Dedicated_Sram_384KB")
    assert flash.arena_cache_size > dram.arena_cache_size == 384 * 1024
    r_flash, r_dram = (vela.compile_tosa(matmul_graph(), c) for c in (flash, dram))
    assert "OffChipFlash" in r_flash.perf["memories"] and "Dram" in r_dram.perf["memories"]
    assert r_flash.scratch_fast_size == 0


@pytest.mark.parametrize("text, kind, ops", [
    ("Non-passthrough operation (Gather) could not run on NPU", "npu_support", (("Gather", ()),)),
    ("Compilation failed: Validation error:\nAdd:\n - Invalid argument input1\n - Bad type\nMaximum:\n - X\n",
     "validation", (("Add", ("Invalid argument input1", "Bad type")), ("Maximum", ("X",)))),
    ("Compilation failed: TOSA FB Reader error:\n - Tosa version mismatch\n", "reader", ()),
    ("something new", "other", ()),
])
def test_parse_rejection(text, kind, ops):
    r = vela.parse_rejection("ethos-u55-64", text)
    assert (r.kind, r.ops) == (kind, ops)
    assert str(r).startswith("Vela (ethos-u55-64): ")


def test_memory_modes_are_those_of_vela_ini_the_accelerator_takes():
    from qlower.backends.ethosu.vela import memory_modes

    u55, u85 = memory_modes("ethos-u55-128"), memory_modes("ethos-u85-256")
    assert {"Sram_Only", "Shared_Sram"} <= set(u55) and not any(m.startswith("Dedicated") for m in u55)
    assert {"Sram_Only", "Shared_Sram", "Dedicated_Sram_384KB"} <= set(u85)


@pytest.mark.parametrize("accelerator", ["ethos-u55-128", "ethos-u65-256", "ethos-u85-256"])
def test_default_system_config_and_memory_mode_are_velas_own(accelerator):
    """With none given, qlower compiles for the system config and memory mode Vela's own command
    line picks for the family (ArchitectureFeatures with its "internal-default"), read from Vela."""
    from ethosu.vela import architecture_features as af

    arch, exc, _ = vela.quietly(lambda: af.ArchitectureFeatures(
        vela_config_files=None, accelerator_config=accelerator, system_config=af.ArchitectureFeatures.DEFAULT_CONFIG,
        memory_mode=af.ArchitectureFeatures.DEFAULT_CONFIG, max_blockdep=af.ArchitectureFeatures.MAX_BLOCKDEP,
        verbose_config=False, arena_cache_size=None))
    assert exc is None
    ours = vela.vela_config(accelerator)
    assert (ours.system_config, ours.memory_mode) == (arch.system_config, arch.memory_mode)


def test_compiles_from_many_threads_leave_every_file_descriptor_alone(capfd):
    """Vela compiles in worker processes: threads compile at once and get the same result, and what
    another thread writes to fd 1 meanwhile lands where it should (no process-wide fd swap)."""
    import os
    import threading

    cfg = vela.vela_config("ethos-u85-256")
    buf = GRAPHS["conv"]()
    want = vela.compile_tosa(buf, cfg).command_stream
    before = os.fstat(1).st_ino
    results, errors = [], []
    stop = threading.Event()

    def compile_some():
        try:
            results.extend(vela.compile_tosa(buf, cfg).command_stream for _ in range(5))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def chatter():
        k = 0
        while not stop.is_set() or k < 20:
            os.write(1, f"marker {k}\n".encode())
            k += 1

    talker = threading.Thread(target=chatter)
    talker.start()
    threads = [threading.Thread(target=compile_some) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    talker.join()
    assert not errors, errors[0]
    assert results == [want] * 20
    assert os.fstat(1).st_ino == before
    out = capfd.readouterr().out
    assert all(f"marker {k}\n" in out for k in range(20))
