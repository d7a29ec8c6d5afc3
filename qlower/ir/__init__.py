"""The qlower IR: a typed SSA graph where quantization is part of every value's type."""

from qlower.ir.builder import GraphBuilder, copy_ops, rebuild
from qlower.ir.dtypes import DType
from qlower.ir.graph import Graph, Op, Origin, TensorType, Value
from qlower.ir.opdefs import OPS, op_def
from qlower.ir.printer import print_graph, print_op
from qlower.ir.quant import QuantSpec
from qlower.ir.verifier import RULES, verify_graph

__all__ = [
    "DType", "Graph", "GraphBuilder", "OPS", "Op", "Origin", "QuantSpec", "RULES", "TensorType", "Value",
    "copy_ops", "op_def", "print_graph", "print_op", "rebuild", "verify_graph",
]


def __getattr__(name: str):
    # ``qlower.ir.verify`` was the verifier's first name; ``qlower.verify`` verifies a model
    if name == "verify":
        import warnings

        warnings.warn("qlower.ir.verify is now qlower.ir.verify_graph", DeprecationWarning, stacklevel=2)
        return verify_graph
    raise AttributeError(f"module 'qlower.ir' has no attribute {name!r}")
