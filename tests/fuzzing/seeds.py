"""Seeds of the suites that build random graphs from numbered seeds rather than hypothesis.

CI (`make test`) runs a fixed, small set: seeds 0..n-1, the same on every machine. `make fuzz`
(QLOWER_FUZZ_EXAMPLES set) runs QLOWER_FUZZ_EXAMPLES seeds starting from a point derived from
the run's printed QLOWER_FUZZ_SEED, so each fuzz run explores new graphs and any can be repeated.
"""

from __future__ import annotations

import os
import zlib


def suite_seeds(ci_count: int, suite: str) -> list[int]:
    examples = os.environ.get("QLOWER_FUZZ_EXAMPLES")
    if not examples:
        return list(range(ci_count))
    start = zlib.crc32(f"{suite}:{os.environ.get('QLOWER_FUZZ_SEED', '0')}".encode()) % 10**6 * 1000
    return list(range(start, start + int(examples)))


def blocks(seeds: list[int], size: int) -> list[list[int]]:
    """``seeds`` in test-sized blocks."""
    return [seeds[i:i + size] for i in range(0, len(seeds), size)]
