"""Helpers shared by qlower's tests (tests/ is not a package, so they live here)."""
