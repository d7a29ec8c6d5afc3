"""Ethos-U backend: TOSA-1.0+INT partitions compiled by Arm Vela (ethos-u55-*, ethos-u65-*, ethos-u85-*)."""

from qlower.backends.ethosu.backend import EthosUBackend
from qlower.backends.ethosu.header import c_header

__all__ = ["EthosUBackend", "c_header"]
