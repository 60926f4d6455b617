"""Test-suite wide settings: GPU tests run only where CUDA is present."""

from __future__ import annotations

import pytest
import torch

# Backends installed only for their own test process (noxfile.py): not part of this suite.
collect_ignore = ["fixtures"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
