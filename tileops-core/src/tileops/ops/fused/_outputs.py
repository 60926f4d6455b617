"""What the fused ops' several outputs need: the layout check of kernels returning several
tensors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...callspec import CallSpec
from ...errors import BackendError, add_note
from .._common import describe
from .._common import dtype_name as _name
from .._common import fits as _fits


def call_kernel(
    op: Any,
    interface: str,
    call: CallSpec,
    wanted: Sequence[tuple[tuple[int, ...], torch.dtype]],
    *args: torch.Tensor | None,
) -> tuple[torch.Tensor, ...]:
    """Run the kernel serving `call` on `args`; it must return one contiguous tensor on the
    call's device per `(shape, dtype)` of `wanted`, else `BackendError` names the key. A kernel's
    own exception keeps its type and message and gains a note naming the key."""
    kernel = op.kernel_for(interface, call)
    try:
        result = kernel(*args)
    except Exception as exc:
        add_note(exc, f"raised by {op._table.serving(interface, call)}")
        raise
    if isinstance(result, tuple) and len(result) == len(wanted):
        if all(_fits(t, s, d, call.device) for t, (s, d) in zip(result, wanted, strict=True)):
            return result
    got = [describe(t) for t in result] if isinstance(result, tuple) else describe(result)
    expected = ", ".join(f"{list(s)} in {_name(d)}" for s, d in wanted)
    raise BackendError(
        f"Output of {op._table.serving(interface, call)} is wrong: it returned {got}, but the "
        f"interface's layout contract expects {len(wanted)} contiguous tensors ({expected}) on "
        f"{call.device}. Fix the kernel, or refuse such calls in its refusal()."
    )
