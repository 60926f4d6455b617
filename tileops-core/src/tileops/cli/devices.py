"""Simulated GPUs for `explain` and `audit`: one typical board per compute capability.

A simulation needs every device fact selection reads (arch, SM count, board model, shared
memory per block). `--arch 90` alone stands for an H200; any fact given explicitly wins. An arch
without a typical board here needs `--sm-count` and `--smem-budget` given.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from ..device import DeviceFacts
from ..testing import simulate_device

PROFILES = {
    80: DeviceFacts(arch=80, sm_count=108, calibration="NVIDIA A100-SXM4-80GB", smem_budget=166912),
    86: DeviceFacts(
        arch=86, sm_count=82, calibration="NVIDIA GeForce RTX 3090", smem_budget=101376
    ),
    89: DeviceFacts(arch=89, sm_count=142, calibration="NVIDIA L40S", smem_budget=101376),
    90: DeviceFacts(arch=90, sm_count=132, calibration="NVIDIA H200", smem_budget=232448),
}
"""Facts of the board each `--arch` stands for, from the vendors' data sheets."""

AUDIT_ARCHS = (80, 86, 89, 90)


def facts_for(
    arch: int,
    sm_count: int | None = None,
    calibration: str | None = None,
    smem_budget: int | None = None,
) -> DeviceFacts:
    """The profile of `arch`, with overrides. An arch without a profile takes its facts from
    the overrides alone: another board's SM count or name would describe a device that is not."""
    _check_facts(arch, sm_count, smem_budget)
    base = PROFILES.get(arch)
    if base is None:
        if sm_count is None or smem_budget is None:
            known = ", ".join(map(str, PROFILES))
            raise ValueError(
                f"--arch {arch}: no typical board of sm_{arch} is known (known: {known}); pass "
                "--sm-count and --smem-budget (and --calibration to name a board) to simulate it"
            )
        base = DeviceFacts(arch=arch, sm_count=sm_count, calibration=None, smem_budget=0)
    return DeviceFacts(
        arch=arch,
        sm_count=base.sm_count if sm_count is None else sm_count,
        calibration=base.calibration if calibration is None else board_name(calibration),
        smem_budget=base.smem_budget if smem_budget is None else smem_budget,
    )


def _check_facts(arch: int, sm_count: int | None, smem_budget: int | None) -> None:
    if arch <= 0:
        raise ValueError(f"--arch takes a compute capability such as 90 (sm_90), got {arch}")
    if sm_count is not None and sm_count <= 0:
        raise ValueError(f"--sm-count takes a number of SMs >= 1, got {sm_count}")
    if smem_budget is not None and smem_budget < 0:
        raise ValueError(f"--smem-budget takes a number of bytes >= 0, got {smem_budget}")


def missing(device: torch.device) -> str | None:
    """'this machine has no cuda:1' when `device` is a GPU torch cannot see here, else None."""
    if device.type != "cuda":
        return None
    if not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count():
        return f"this machine has no {device}"
    return None


def board_name(text: str) -> str:
    """`h200` -> `NVIDIA H200`: a short, case-blind name of a known board, else `text`."""
    for facts in PROFILES.values():
        name = facts.calibration or ""
        if text.lower() in (name.lower(), name.lower().removeprefix("nvidia ")):
            return name
    return text


@contextlib.contextmanager
def simulated(device: torch.device, facts: DeviceFacts | None) -> Iterator[None]:
    """Make `device` have `facts` inside the block; None leaves the real device alone."""
    if facts is None:
        yield
        return
    with simulate_device(
        device,
        arch=facts.arch,
        sm_count=facts.sm_count,
        calibration=facts.calibration,
        smem_budget=facts.smem_budget,
    ):
        yield


def describe(device: torch.device, facts: DeviceFacts | None) -> str:
    """One line naming the device and, when simulated, the facts it stands for."""
    if facts is None:
        return f"{device}"
    return (
        f"{device} (simulated: sm_{facts.arch}, {facts.sm_count} SMs, "
        f"{facts.calibration or 'no board model'}, {facts.smem_budget} B shared memory per block)"
    )


def label(device: torch.device, facts: DeviceFacts | None) -> str:
    """A short name: `cpu`, or `cuda:0 sm_90` for a simulated device."""
    return f"{device} sm_{facts.arch}" if facts else str(device)
