"""The numerics audit: every installed key of every op, run on this machine's device over the
op's sample calls and every dtype, against the op's torch definition computed in float64.

Each key is pinned in turn (`tileops.pinned`), so what runs is exactly that kernel; calls it
does not serve are counted, not compared. Errors are norm-wise, |out - ref| / |ref|, against a
tolerance per dtype. On a machine without a GPU the audit runs what runs on the CPU (the
reference kernels, CPU backends, Triton under TRITON_INTERPRET=1).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from .control import pinned
from .errors import NoImplementationError
from .op import Op
from .samples import Case
from .signature import FLOAT_DTYPES
from .table import table_for

TOLERANCE = {
    torch.float64: 1e-10,
    torch.float32: 1e-4,
    torch.float16: 5e-3,
    torch.bfloat16: 2e-2,
}
"""Norm-wise relative error allowed per input dtype: 16-bit results carry one rounding of the
output (about 2^-8 for bfloat16), float32 a few ulps of accumulated rounding."""


@dataclass
class KeyNumerics:
    """What one key did over the audit's calls."""

    op: str
    interface: str
    key: str
    source: str
    checked: int = 0
    not_served: int = 0
    worst: float = 0.0
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def audit_numerics(ops: Iterable[type[Op]], device: torch.device) -> list[KeyNumerics]:
    """Every key of `ops` (except backward ones) checked on `device`; see the module doc."""
    results = []
    for op_cls in ops:
        table = table_for(op_cls)
        for interface, candidates in table.candidates.items():
            if interface == "backward":
                continue
            for cand in candidates:
                if device.type in cand.cls.devices:
                    found = KeyNumerics(op_cls.op_name, interface, cand.key, cand.source)
                    _check_key(op_cls, interface, found, device)
                    results.append(found)
    return results


def _check_key(op_cls: type[Op], interface: str, found: KeyNumerics, device: torch.device) -> None:
    try:
        cases = list(op_cls.sample_cases())
    except NotImplementedError:
        cases = []  # an op without sample calls: nothing to run, and `checked` stays 0
    for case in cases:
        op = op_cls(**case.params)
        if _interface_of(op) not in (interface, None):
            continue
        for dtype in _dtypes(op):
            inputs = _inputs(op, case, dtype, device)
            try:
                with pinned(op_cls, interface, found.key):
                    got = op(*[_copy(t) for t in inputs])
            except NoImplementationError:
                found.not_served += 1
                continue
            want = op.reference_forward(*[_copy(t, torch.float64, "cpu") for t in inputs])
            error = max(map(_relative_error, _outputs(got), _outputs(want)))
            found.checked += 1
            found.worst = max(found.worst, error)
            if not error <= TOLERANCE[dtype]:
                dtype_name = str(dtype).removeprefix("torch.")
                found.violations.append(
                    f"{case.describe()} {dtype_name}: error {error:.2e} > {TOLERANCE[dtype]:.0e}"
                )


def _interface_of(op: Op) -> str | None:
    """The forward interface an instance calls, where its params decide it (BatchNorm)."""
    return getattr(op, "_interface", None)


def _dtypes(op: Op) -> list[torch.dtype]:
    return [d for d in op.signature.inputs[0].dtypes if d in FLOAT_DTYPES]


def _inputs(
    op: Op, case: Case, dtype: torch.dtype, device: torch.device
) -> list[torch.Tensor | None]:
    """The case's inputs on `device`, floating ones in `dtype` (integer ones, such as sequence
    lengths, as they are), padded with None to the signature's length."""
    given = [None if t is None else t.to(device, _recast(t, dtype)) for t in case.inputs]
    return given + [None] * (len(op.signature.inputs) - len(given))


def _copy(t: torch.Tensor | None, dtype: torch.dtype | None = None, device: str | None = None):
    """A fresh copy (ops may write inputs: BatchNorm's running stats), floating ones optionally
    recast."""
    if t is None:
        return None
    return t.to(device=device or t.device, dtype=_recast(t, dtype or t.dtype), copy=True)


def _recast(t: torch.Tensor, dtype: torch.dtype) -> torch.dtype:
    return dtype if t.is_floating_point() else t.dtype


def _outputs(result: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Every output of a call (attention returns its output and log-sum-exp)."""
    return result if isinstance(result, tuple) else (result,)


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().cpu().double(), want.detach().double()
    if got.shape != want.shape:
        return float("inf")
    finite = torch.isfinite(want)
    if not torch.equal(torch.isfinite(got), finite):
        return float("inf")
    scale = want[finite].norm().item() or 1.0
    return (got[finite] - want[finite]).norm().item() / scale


def report(results: list[KeyNumerics], device: torch.device) -> str:
    """A table: one row per key, worst error and verdict, then every violation."""
    lines = [
        f"numerics on {device}: every key against the op's torch definition in float64",
        f"{'op.interface':<34} {'key':<22} {'checked':>7} {'skipped':>7} {'worst':>9}  verdict",
    ]
    for r in results:
        verdict = "ok" if r.ok else f"{len(r.violations)} over tolerance"
        lines.append(
            f"{r.op + '.' + r.interface:<34} {r.key:<22} {r.checked:>7} {r.not_served:>7} "
            f"{r.worst:>9.2e}  {verdict}"
        )
    for r in results:
        lines += [f"  {r.key} [{r.source}] {v}" for v in r.violations]
    return "\n".join(lines)
