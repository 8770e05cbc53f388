"""Tiny helpers for the test suite (kept out of tests/conftest.py so any test file can import them)."""
from __future__ import annotations

import os
import shutil


def require_tool(name: str, env: str = "LABKERNELS_REQUIRE_NVCC") -> str:
    """Path of the executable ``name``; if it is missing, skip the calling test -- or fail it when the
    environment variable ``env`` is "1" (CI sets LABKERNELS_REQUIRE_NVCC=1: there nvcc must be present)."""
    import pytest  # noqa: PLC0415 - only tests call this

    path = shutil.which(name)
    if path:
        return path
    if os.environ.get(env) == "1":
        pytest.fail(f"{name} is required ({env}=1) but not on PATH")
    pytest.skip(f"{name} not on PATH")
    raise AssertionError("unreachable")  # pragma: no cover
