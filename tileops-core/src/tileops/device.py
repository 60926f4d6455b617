"""Facts of one device that kernels select and build by, read once per device index.

Facts are read from the call's own device index, never the current device, and only on a
dispatch miss. `simulate` lets tests and `explain` pretend a device exists.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DeviceFacts:
    """What the dispatcher may know about a device.

    `arch` is the compute capability as an integer (90 for sm_90) or None off CUDA;
    `calibration` names the board model that tuning tables were calibrated on;
    `smem_budget` is the shared memory one block may use, in bytes.
    """

    arch: int | None
    sm_count: int
    calibration: str | None
    smem_budget: int


_HOST_FACTS = DeviceFacts(arch=None, sm_count=0, calibration=None, smem_budget=0)


class Simulation:
    """Facts that stand in for one device, and how often the dispatcher read them."""

    def __init__(self, device: torch.device, facts: DeviceFacts) -> None:
        self.device = device
        self.facts = facts
        self.reads = 0


_cache: dict[tuple[str, int | None], DeviceFacts] = {}
_simulations: dict[tuple[str, int | None], Simulation] = {}
_lock = threading.Lock()
_simulation_listeners: list[Callable[[tuple[str, int | None]], None]] = []


def on_simulation_change(listener: Callable[[tuple[str, int | None]], None]) -> None:
    """Call `listener(slot)` whenever a simulation of the device in `slot` starts or ends:
    facts seen so far for that device may be stale."""
    _simulation_listeners.append(listener)


def device_slot(device: torch.device) -> tuple[str, int | None]:
    """The key facts are kept under: `cuda` without an index is the default device, cuda:0."""
    if device.type == "cuda" and device.index is None:
        return ("cuda", 0)
    return (device.type, device.index)


def device_facts(device: torch.device) -> DeviceFacts:
    """The facts of `device`: simulated if a simulation covers it, else read once and cached."""
    slot = device_slot(device)
    simulation = _simulations.get(slot)
    if simulation is not None:
        simulation.reads += 1
        return simulation.facts
    facts = _cache.get(slot)
    if facts is None:
        with _lock:
            facts = _cache.get(slot) or _read(slot)
            _cache[slot] = facts
    return facts


def _read(slot: tuple[str, int | None]) -> DeviceFacts:
    kind, index = slot
    if kind != "cuda":
        return _HOST_FACTS
    props = torch.cuda.get_device_properties(index)
    return DeviceFacts(
        arch=props.major * 10 + props.minor,
        sm_count=props.multi_processor_count,
        calibration=props.name,
        smem_budget=getattr(props, "shared_memory_per_block_optin", 0),
    )


def push_simulation(simulation: Simulation) -> Simulation | None:
    """Install `simulation`; returns the one it shadows so the caller can restore it."""
    slot = device_slot(simulation.device)
    with _lock:
        previous = _simulations.get(slot)
        _simulations[slot] = simulation
    _notify(slot)
    return previous


def pop_simulation(simulation: Simulation, previous: Simulation | None) -> None:
    slot = device_slot(simulation.device)
    with _lock:
        if previous is None:
            _simulations.pop(slot, None)
        else:
            _simulations[slot] = previous
    _notify(slot)


def _notify(slot: tuple[str, int | None]) -> None:
    for listener in _simulation_listeners:
        listener(slot)
