"""The CPU backend: exact int8 NHWC kernels, static and dynamic quantization (DESIGN.md).

``prepare(graph)`` compiles a whole IR graph (target "cpu", or the host part of a
partitioned program) into a ``CpuPlan``; ``plan.run(inputs)`` runs it.
"""

from qlower.backends.cpu.backend import CpuBackend
from qlower.backends.cpu.plan import CpuPlan, prepare

__all__ = ["CpuBackend", "CpuPlan", "prepare"]
