"""pytest fixtures for backend authors, registered through the `pytest11` entry point.

Imports tileops only inside the fixtures, so merely having tileops installed keeps pytest fast.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def tileops_registry() -> Iterator[None]:
    """Every registration and default-target change made in the test is undone after it."""
    from tileops.testing import isolated_registry

    with isolated_registry():
        yield


@pytest.fixture
def simulated_h200() -> Iterator[Any]:
    """`cuda:0` looks like an H200 (sm_90, 132 SMs) to the dispatcher, GPU or not."""
    from tileops.testing import simulate_device

    with simulate_device(
        "cuda:0", arch=90, sm_count=132, calibration="NVIDIA H200", smem_budget=232448
    ) as simulation:
        yield simulation
