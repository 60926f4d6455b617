"""pytest fixtures for backend authors, registered through the `pytest11` entry point.

Imports tileops only inside the fixtures, so merely having tileops installed keeps pytest fast.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

BACKENDS_OPTION = "tileops_backends"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        BACKENDS_OPTION,
        type="args",
        default=[],
        help="tileops_registry isolates each test to these backends (entry point or "
        "distribution names): other installed backends' registrations are withdrawn for it",
    )


@pytest.fixture
def tileops_registry(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every registration and default-target change made in the test is undone after it.
    With the ini option `tileops_backends = acme` (your entry point), the test also sees only
    that backend's registrations (and the ops' own kernels), whatever else is installed."""
    from tileops.testing import isolated_registry

    backends = request.config.getini(BACKENDS_OPTION) or None
    with isolated_registry(backends=backends):
        yield


@pytest.fixture
def simulated_h200() -> Iterator[Any]:
    """`cuda:0` looks like an H200 (sm_90, 132 SMs) to the dispatcher, GPU or not."""
    from tileops.testing import simulate_device

    with simulate_device(
        "cuda:0", arch=90, sm_count=132, calibration="NVIDIA H200", smem_budget=232448
    ) as simulation:
        yield simulation
