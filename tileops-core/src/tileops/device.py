"""Facts of one device that kernels select and build by, read once per device index.

Facts are read from the call's own device index, never the current device, and only on a
dispatch miss. `simulating` lets tests and `explain` pretend a device exists: in the current
thread or asyncio task only (a context variable), so a simulation never shows another thread a
board it does not have, nor ends another thread's simulation. What dispatch selected under a
simulation is kept apart from the process-wide selections (see table.ScopedHits) and dropped
when the simulation ends.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

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


Slot = tuple[str, int | None]

_cache: dict[Slot, DeviceFacts] = {}
_lock = threading.Lock()
_start_listeners: list[Callable[[Simulation], None]] = []
_end_listeners: list[Callable[[Simulation], None]] = []
NO_SIMULATIONS: Mapping[torch.device, Simulation] = MappingProxyType({})
SIMULATED: contextvars.ContextVar[Mapping[torch.device, Simulation]] = contextvars.ContextVar(
    "tileops_simulated", default=NO_SIMULATIONS
)
"""The simulations in force in this thread or task, keyed by every spelling of their device
(`cuda` and `cuda:0` alike), so that a lookup needs no normalising: usually empty. Each value
set is a new dict, never changed afterwards (a plain dict: hits in a simulation read it)."""


def on_simulation_start(listener: Callable[[Simulation], None]) -> None:
    """Call `listener(simulation)` when a simulation starts: while it lasts, hits must consult
    their context (scope.py counts it)."""
    _start_listeners.append(listener)


def on_simulation_end(listener: Callable[[Simulation], None]) -> None:
    """Call `listener(simulation)` when a simulation ends: what was selected under it (and
    only that) is stale."""
    _end_listeners.append(listener)


def device_slot(device: torch.device) -> Slot:
    """The key facts are kept under: `cuda` without an index is the default device, cuda:0."""
    if device.type == "cuda" and device.index is None:
        return ("cuda", 0)
    return (device.type, device.index)


def device_facts(device: torch.device) -> DeviceFacts:
    """The facts of `device`: simulated if a simulation of this context covers it, else read
    once and cached for the process."""
    simulation = SIMULATED.get().get(device)
    if simulation is not None:
        simulation.reads += 1
        return simulation.facts
    slot = device_slot(device)
    facts = _cache.get(slot)
    if facts is None:
        with _lock:
            facts = _cache.get(slot) or _read(slot)
            _cache[slot] = facts
    return facts


def _read(slot: Slot) -> DeviceFacts:
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


@contextlib.contextmanager
def simulating(simulation: Simulation) -> Iterator[Simulation]:
    """Inside the block, in this context only, `simulation` stands in for its device's facts
    (shadowing an outer simulation of the same device, which returns on exit)."""
    spellings = dict.fromkeys(_spellings(simulation.device), simulation)
    token = SIMULATED.set({**SIMULATED.get(), **spellings})
    try:
        for listener in _start_listeners:
            listener(simulation)
        yield simulation
    finally:
        SIMULATED.reset(token)
        for listener in _end_listeners:
            listener(simulation)


def _spellings(device: torch.device) -> list[torch.device]:
    """Every torch.device naming the same device slot: `cuda` is `cuda:0`."""
    kind, index = device_slot(device)
    if kind == "cuda" and index == 0:
        return [torch.device("cuda"), torch.device("cuda", 0)]
    return [device]
