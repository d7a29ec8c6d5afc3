"""Shared test set-up. Tests are not a package (tosa-tools installs one named `tests`)."""

import os

os.environ.setdefault("TOSA_MODEL_NO_BACKTRACE", "1")
