"""Targets whose detector claims a device for ops they cannot build, for `audit` and `doctor`.

A claim settles every op instance on that device on the target, and a call settled on a target
without a builder for its op raises `OpNotAvailableError` (there is no fall-back): so a target
claiming a device must build every op there. A detector that raises or answers no bool breaks
every settle on the device it is asked about, and is reported too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from ..device import DeviceFacts
from ..errors import BackendError
from ..registry import REGISTRY, Detector
from . import devices

Probed = list[tuple[torch.device, DeviceFacts | None]]
"""Devices to ask detectors about, each simulated as its facts (None: the real device)."""


@dataclass(frozen=True)
class UnservedClaim:
    target: str
    source: str
    devices: tuple[str, ...]
    ops: tuple[str, ...]

    @property
    def owner(self) -> str:
        return f"target {self.target!r} ({self.source})"

    def consequence(self) -> str:
        return (
            f"claims {', '.join(self.devices)} but has no kernel builder for "
            f"{', '.join(self.ops)}: every call of those ops there settles on it and raises "
            "OpNotAvailableError"
        )


@dataclass
class Claims:
    """What the detectors said of the probed devices."""

    unserved: list[UnservedClaim] = field(default_factory=list)
    broken: dict[str, str] = field(default_factory=dict)  # target -> its detector's error


def check(probed: Probed, ops: Iterable[str] | None = None) -> Claims:
    """Ask every detector about each probed device; report targets that claim one while lacking
    builders for some of `ops` (default: every op)."""
    selected = None if ops is None else set(ops)
    found = Claims()
    for target, detector in sorted(REGISTRY.detectors.items()):
        claimed = _claimed(detector, probed, found)
        missing = REGISTRY.ops_without_builder(target)
        missing = [o for o in missing if selected is None or o in selected]
        if claimed and missing:
            found.unserved.append(
                UnservedClaim(target, str(detector.source), tuple(claimed), tuple(missing))
            )
    return found


def _claimed(detector: Detector, probed: Probed, found: Claims) -> list[str]:
    claimed = []
    for device, facts in probed:
        with devices.simulated(device, facts):
            try:
                if detector.claims(device):
                    claimed.append(devices.label(device, facts))
            except BackendError as exc:
                found.broken.setdefault(detector.target, str(exc))
    return claimed
