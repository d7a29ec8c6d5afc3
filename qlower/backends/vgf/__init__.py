"""VGF backend (ML extensions for Vulkan): TOSA partitions converted by the ML SDK model
converter, run by the ML SDK scenario runner; see ``backend.VgfBackend``."""

from qlower.backends.vgf.backend import PROFILES, VgfBackend

__all__ = ["PROFILES", "VgfBackend"]
