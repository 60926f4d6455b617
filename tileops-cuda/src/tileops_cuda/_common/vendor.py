"""Vendor kernels (cuBLAS, cuDNN through torch) as candidates beside ours: where a tileops
kernel was measured faster than the vendor's on a board, the vendor kernel steps aside.

A vendor kernel is preferred over every TileLang key of its op, and refuses (`deferral`) the
calls a measured `Faster` region covers, on the board it was measured on, when the region's
tileops key serves the call. So the TileLang kernels serve only where a measurement says they
win, the vendor library everywhere else (other boards, other dtypes, shapes never measured),
and no call has two winners. The refusal names the key, the figure and its result file, which
`explain` prints.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tileops import CallSpec
from tileops.backend import key_serves

H200 = "NVIDIA H200"
"""The board every region below was measured on (`CallSpec.calibration`)."""


@dataclass(frozen=True)
class Faster:
    """Calls where the tileops kernels `keys` measured faster than the vendor's on `board`:
    `figure` says by how much, `source` the result file and commit it came from."""

    keys: tuple[str, ...]
    figure: str
    source: str
    board: str = H200

    def covers(self, call: CallSpec) -> bool:
        raise NotImplementedError


def deferral(op: type, vendor: str, regions: Iterable[Faster], call: CallSpec) -> str | None:
    """Why the vendor kernel leaves `call` to a tileops kernel, or None when it serves it."""
    for region in regions:
        if call.calibration != region.board or not region.covers(call):
            continue
        serving = [key for key in region.keys if key_serves(op, key, call)]
        if serving:
            return (
                f"{', '.join(serving)} measured faster than {vendor} here on {region.board}: "
                f"{region.figure} ({region.source}); {vendor} steps aside"
            )
    return None
