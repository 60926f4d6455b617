"""Fixtures of the tileops-cuda tests: a registry holding only this package's kernels."""

from __future__ import annotations

import pytest

import tileops_cuda
from tileops.backend import register_kernel_type
from tileops.registry import REGISTRY
from tileops.testing import isolated_registry


@pytest.fixture
def cuda_kernels_only():
    """The three ops served by tileops-cuda's keys alone (other backends withdrawn inside)."""
    with isolated_registry():
        for op, keys in tileops_cuda.KERNELS.items():
            REGISTRY.withdraw_kernel_types(op)
            for key, cls in keys.items():
                register_kernel_type(op, key, cls)
        yield


@pytest.fixture(scope="session")
def tilelang_cache(tmp_path_factory) -> str:
    """One TileLang disk cache for the whole session, set before tilelang is imported."""
    import os

    path = str(tmp_path_factory.mktemp("tilelang-cache"))
    previous = os.environ.get("TILELANG_CACHE_DIR")
    os.environ["TILELANG_CACHE_DIR"] = path
    yield path
    if previous is None:
        os.environ.pop("TILELANG_CACHE_DIR")
    else:
        os.environ["TILELANG_CACHE_DIR"] = previous
