"""What tests and backend authors need: an isolated registry and simulated devices."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .backend.plugins import LOADER
from .backend.registry import REGISTRY
from .device import DeviceFacts, Simulation, pop_simulation, push_simulation

__all__ = ["Simulation", "isolated_registry", "simulate_device"]


@contextlib.contextmanager
def isolated_registry() -> Iterator[None]:
    """Undo, on exit, every registration and default-target change made inside."""
    LOADER.ensure_loaded()
    with REGISTRY.transaction(always_undo=True):
        yield


@contextlib.contextmanager
def simulate_device(
    device: torch.device | str,
    *,
    arch: int | None,
    sm_count: int,
    calibration: str | None = None,
    smem_budget: int = 0,
) -> Iterator[Simulation]:
    """Make the facts of `device` these values inside the block, GPU or not.

    The yielded object's `.reads` counts how often the dispatcher read them.
    """
    facts = DeviceFacts(arch=arch, sm_count=sm_count, calibration=calibration, smem_budget=smem_budget)
    simulation = Simulation(torch.device(device), facts)
    previous = push_simulation(simulation)
    try:
        yield simulation
    finally:
        pop_simulation(simulation, previous)
