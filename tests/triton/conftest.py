"""Fixtures of the Triton backend's tests: registries with Triton alone or beside tileops-cuda.

The process may have tileops-cuda installed or not; each fixture withdraws every backend kernel
of the four ops inside an isolated registry and registers exactly what it names.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from triton_kit import TRITON, register_stand_ins

from tileops.backend import register_kernel_type
from tileops.registry import REGISTRY
from tileops.testing import isolated_registry


@pytest.fixture
def triton_alone() -> Iterator[None]:
    with isolated_registry():
        for op, (key, cls) in TRITON.items():
            REGISTRY.withdraw_kernel_types(op)
            register_kernel_type(op, key, cls)
        yield


@pytest.fixture
def with_cuda_stand_ins(triton_alone: None) -> None:
    register_stand_ins()
