"""Fixtures for the core tests: simulated CUDA devices and an isolated registry."""

from __future__ import annotations

import pytest

from tileops.testing import isolated_registry, simulate_device


@pytest.fixture
def sm80():
    """cuda:0 simulated as an sm_80 board."""
    with simulate_device("cuda:0", arch=80, sm_count=108, calibration="A100") as sim:
        yield sim


@pytest.fixture
def sm90():
    """cuda:1 simulated as an sm_90 board."""
    with simulate_device("cuda:1", arch=90, sm_count=132, calibration="H100") as sim:
        yield sim


@pytest.fixture
def isolated():
    with isolated_registry():
        yield


@pytest.fixture
def rows_op():
    """cli_kit's RowsOp, known to the registry, in an isolated registry: plant its kernels."""
    from cli_kit import rows_op_known

    with isolated_registry(), rows_op_known() as op:
        yield op


@pytest.fixture
def shared_ops():
    """tileops.nn's shared ops made anew, of the current registry (an op keeps its table)."""
    from tileops.nn import _ops

    _ops._shared_op.cache_clear()
    yield
    _ops._shared_op.cache_clear()
