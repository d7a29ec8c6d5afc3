"""Shared test set-up. Tests are not a package (tosa-tools installs one named `tests`).

Randomness is reproducible everywhere: every hypothesis suite runs under one profile, loaded
here. By default (CI, `make test`) it is derandomized and reads no example database, so a red
run fails the same way on every machine and a green one means the same examples passed. With
QLOWER_FUZZ_EXAMPLES set (`make fuzz`), examples are random: the Makefile passes a
`--hypothesis-seed` and prints it, so any run can be repeated.
"""

import os

from hypothesis import settings

os.environ.setdefault("TOSA_MODEL_NO_BACKTRACE", "1")

_FUZZING = bool(os.environ.get("QLOWER_FUZZ_EXAMPLES"))
settings.register_profile("qlower-ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("qlower-fuzz", derandomize=False, print_blob=True)
settings.load_profile("qlower-fuzz" if _FUZZING else "qlower-ci")
