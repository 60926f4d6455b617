"""What autocast does to an op: whatever it does to the op's torch counterpart.

Autocast's casting lists differ by device type and torch version (CUDA runs layer_norm and
softmax in float32, the CPU leaves them alone, both run matmuls in the lower precision). Rather
than copy those lists, each op asks torch once per autocast state: it runs its torch definition
under the current autocast on stand-ins of one floating dtype and reads the result's dtype.

Autocast casts floating inputs other than float64 (never those, as torch), and never the ones
the op writes. The op's checks run before any probe, on the inputs as they are; only where the
castable inputs' dtypes disagree, which autocast may settle (`torch.mm` of bfloat16 and float32
under autocast multiplies two bfloat16 tensors), is that judged after the cast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .op import Op
    from .signature import Input

_policies: dict[tuple, torch.dtype | None] = {}
_UNSEEN = object()


def castable(t: Any, spec: Input) -> bool:
    """Whether autocast may cast `t`: a floating tensor, not float64, that the op does not write."""
    return (
        isinstance(t, torch.Tensor)
        and t.is_floating_point()
        and t.dtype != torch.float64
        and not spec.written
    )


def agreeing(op: Op, tensors: tuple) -> tuple | None:
    """`tensors` with the castable ones of another dtype than the first castable one replaced
    by stand-ins of its dtype (same shape and device, no memory): the call as the checks see it
    once autocast settled the agreement. None when they agree already."""
    specs = op.signature.inputs
    first = next((t.dtype for t, s in zip(tensors, specs, strict=True) if castable(t, s)), None)
    agreed = tuple(
        _stand_in(t, first) if castable(t, spec) and t.dtype != first else t
        for t, spec in zip(tensors, specs, strict=True)
    )
    return None if all(a is t for a, t in zip(agreed, tensors, strict=True)) else agreed


def autocast_policy(
    op: Op, device_type: str, tensors: tuple[torch.Tensor | None, ...]
) -> torch.dtype | None:
    """The dtype to cast the op's castable inputs to, or None to leave them as they are. The
    inputs' dtypes decide which are castable, so with the autocast state they key the answer."""
    lower = torch.get_autocast_dtype(device_type)
    key = (type(op), device_type, lower, tuple([None if t is None else t.dtype for t in tensors]))
    found = _policies.get(key, _UNSEEN)
    if found is _UNSEEN:
        specs = op.signature.inputs
        dtypes = {t.dtype for t, spec in zip(tensors, specs, strict=True) if castable(t, spec)}
        found = _policies[key] = _policy(op, tensors, lower, dtypes) if dtypes else None
    return found


def _policy(
    op: Op, tensors: tuple, lower: torch.dtype, dtypes: set[torch.dtype]
) -> torch.dtype | None:
    """Lower precision if float32 stand-ins come out in `lower` (matmuls); float32 if `lower`
    ones come out in float32 (CUDA's norms and softmax); else autocast leaves the op alone."""
    if _probe(op, tensors, torch.float32) == lower:
        return lower
    if dtypes == {torch.float32}:
        return None  # nothing but a cast to `lower` changes float32 inputs
    return torch.float32 if _probe(op, tensors, lower) == torch.float32 else None


def _probe(op: Op, tensors: tuple, dtype: torch.dtype) -> torch.dtype:
    """The dtype of the op's torch definition on stand-ins whose floating inputs are all `dtype`
    (fresh copies where the op writes them: the caller's tensors are never touched)."""
    specs = op.signature.inputs
    stand_ins = [_probed(t, dtype, spec.written) for t, spec in zip(tensors, specs, strict=True)]
    with torch.no_grad():
        out = op.reference_forward(*stand_ins)
    return (out[0] if isinstance(out, tuple) else out).dtype


def _probed(t: torch.Tensor | None, dtype: torch.dtype, written: bool) -> torch.Tensor | None:
    if t is None:
        return None
    if t.is_floating_point():
        return _stand_in(t, dtype, written)
    return t.clone() if written else t


def _stand_in(t: torch.Tensor, dtype: torch.dtype, writable: bool = False) -> torch.Tensor:
    if writable:
        return torch.zeros(t.shape, dtype=dtype, device=t.device)
    return torch.zeros((), dtype=dtype, device=t.device).expand(t.shape)
