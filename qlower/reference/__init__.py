"""The reference interpreter (``run_graph``): exact semantics of every IR op."""

from qlower.reference.interpreter import check_inputs, run_graph, run_op
from qlower.reference.registry import KERNELS

__all__ = ["KERNELS", "check_inputs", "run_graph", "run_op"]
