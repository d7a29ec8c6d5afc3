"""qlower: PyTorch → int8 programs for CPUs and Arm NPUs, verified stage by stage."""

__version__ = "0.1.0"
