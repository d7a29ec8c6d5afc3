"""TOSA 1.0 backend (profiles TOSA-1.0+INT and TOSA-1.0+INT+FP), see ``backend.TosaBackend``."""

from qlower.backends.tosa.backend import TosaBackend
from qlower.backends.tosa.support import PROFILES, Profile

__all__ = ["PROFILES", "Profile", "TosaBackend"]
