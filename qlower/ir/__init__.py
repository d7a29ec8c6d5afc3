"""The qlower IR: a typed SSA graph where quantization is part of every value's type."""

from qlower.ir.builder import GraphBuilder, rebuild
from qlower.ir.dtypes import DType
from qlower.ir.graph import Graph, Op, Origin, TensorType, Value
from qlower.ir.opdefs import OPS, op_def
from qlower.ir.printer import print_graph, print_op
from qlower.ir.quant import QuantSpec
from qlower.ir.verifier import RULES, verify

__all__ = [
    "DType", "Graph", "GraphBuilder", "OPS", "Op", "Origin", "QuantSpec", "RULES", "TensorType", "Value",
    "op_def", "print_graph", "print_op", "rebuild", "verify",
]
