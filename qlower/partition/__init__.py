"""Partitioning a graph between a backend and the host."""

from qlower.partition.partitioner import (
    HostDecision,
    Partition,
    PartitionResult,
    convert_type,
    float_fallbacks,
    partition,
)

__all__ = ["HostDecision", "Partition", "PartitionResult", "convert_type", "float_fallbacks", "partition"]
