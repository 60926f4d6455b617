"""What the attention ops share: their constructor params (causal, scale, window), the checks
of head counts and dims, the resolved softmax scale, the output contract every attention
kernel keeps, and their behaviour under autocast (that of `F.scaled_dot_product_attention`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ...errors import BackendError, OpConfigError, OpInputError, add_note
from ...table import remember
from .._common import _as_int, _is_real, bool_param
from .._common import describe as _describe
from .._common import dtype_name as _name
from .._common import fits as _fits
from ._math import compute_dtype

PARAM_TYPES = {"causal": "bool", "scale": "float?", "window": "int?"}
"""The attention ops' params, as torch.library schema types."""

_AUTOCAST: dict[tuple[str, torch.dtype], torch.dtype] = {}


def scale_param(op: str, scale: Any) -> float | None:
    if scale is None:
        return None
    if not (_is_real(scale) and math.isfinite(scale)):
        raise OpConfigError(
            f"{op}: parameter 'scale' must be a finite number or None, got {scale!r}"
        )
    return float(scale)


def window_param(op: str, window: Any, causal: bool) -> int | None:
    if window is None:
        return None
    size = _as_int(window)
    if size is None or size < 1:
        raise OpConfigError(
            f"{op}: parameter 'window' must be an int >= 1 (the keys each query sees: its own "
            f"and the window - 1 before it) or None, got {window!r}"
        )
    if not causal:
        raise OpConfigError(
            f"{op}: parameter 'window' needs causal=True (a sliding window looks back from each "
            f"query's own position), got window={size} with causal=False"
        )
    return size


class AttentionParams:
    """Mixin (not an Op, so it is no registered op) holding the attention ops' params.

    `causal`: the bottom-right aligned causal mask (see `_math`); `scale`: the factor on the
    scores, None for 1 / sqrt(head_dim) as `F.scaled_dot_product_attention`; `window`: a
    sliding window of that many keys (causal only), None for none.
    """

    def __init__(
        self,
        causal: bool = False,
        scale: float | None = None,
        window: int | None = None,
        *,
        target: str | None = None,
    ) -> None:
        op = type(self).__name__
        self.causal = bool_param(op, "causal", causal)
        self.scale = scale_param(op, scale)
        self.window = window_param(op, window, self.causal)
        self._specs: dict[tuple, Any] = {}
        super().__init__(target=target)

    def scale_for(self, head_dim: int) -> float:
        """The scale the scores are multiplied by, `scale` or 1 / sqrt(head_dim)."""
        return 1.0 / math.sqrt(head_dim) if self.scale is None else self.scale

    def call_fields(self, q: torch.Tensor, v: torch.Tensor) -> dict[str, Any]:
        """The call-spec fields every (batch, heads, seq, dim) attention call has, from q and
        v (or v's cache)."""
        batch, heads, q_len, head_dim = q.shape
        return {
            "device": q.device,
            "batch": batch,
            "heads": heads,
            "kv_heads": v.shape[1],
            "q_len": q_len,
            "head_dim": head_dim,
            "v_dim": v.shape[-1],
            "causal": self.causal_for(q_len),
            "scale": self.scale_for(head_dim),
            "dtype": q.dtype,
            "window": self.window,
        }

    def call_facts(self, q: torch.Tensor, v: torch.Tensor) -> tuple:
        """What `call_fields` reads of q and v: with a call's length facts, the key its call
        spec is remembered under."""
        return q.shape, v.shape[1], v.shape[-1], q.dtype, q.device

    def remembered(self, key: tuple, make: Callable[[], Any]) -> Any:
        """The call spec `make` builds, remembered under `key` (the facts it follows from, a
        cache's length as bucketed): a decode step's new key length mostly repeats its
        bucket's. Bounded, as prefill calls come at ever-new lengths."""
        spec = self._specs.get(key)
        if spec is None:
            spec = make()
            remember(self._specs, key, spec, 256)
        return spec

    def causal_for(self, q_len: int) -> bool:
        """Whether the causal mask changes anything: not for one query row (the last position
        sees every key) unless a window looks back from it."""
        return self.causal and (q_len > 1 or self.window is not None)

    def autocast_dtype(self, device_type: str, tensors: tuple) -> torch.dtype | None:
        """What autocast does to `F.scaled_dot_product_attention` (lower precision on CUDA and
        CPU alike), probed once per autocast state."""
        if not any(
            isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
            for t in tensors
        ):
            return None
        key = (device_type, torch.get_autocast_dtype(device_type))
        if key not in _AUTOCAST:
            probe = torch.zeros((1, 1, 1, 8), device=device_type)
            with torch.no_grad():
                _AUTOCAST[key] = F.scaled_dot_product_attention(probe, probe, probe).dtype
        found = _AUTOCAST[key]
        return None if found == torch.float32 else found


def check_heads(op: str, heads: int, kv_heads: int, head_dim: int, keys: str = "k") -> None:
    """Query heads must come in groups per kv head (of argument `keys`), and head_dim must be at
    least 1."""
    if kv_heads == 0 or heads % kv_heads:
        raise OpInputError(
            f"{op}(): argument {keys!r} has {kv_heads} heads, which must divide the {heads} "
            "heads of argument 'q' (grouped-query attention: each kv head serves heads // "
            "kv_heads query heads)"
        )
    if head_dim == 0:
        raise OpInputError(f"{op}(): argument 'q' has head_dim 0; expected at least 1")


def check_saved(op: str, out: torch.Tensor | None, lse: torch.Tensor | None) -> None:
    """A backward op takes the forward's out and lse together, or neither."""
    if (out is None) != (lse is None):
        given, missing = ("out", "lse") if lse is None else ("lse", "out")
        raise OpInputError(
            f"{op}(): argument {given!r} is given without {missing!r}; pass the forward's out "
            "and lse together, or neither"
        )


def no_keys(q: torch.Tensor, v_dim: int, lse_shape: tuple[int, ...]) -> tuple:
    """The result where no query sees any key: zeros and a log-sum-exp of -inf."""
    out = q.new_zeros((*q.shape[:-1], v_dim))
    return out, torch.full(lse_shape, float("-inf"), dtype=compute_dtype(q.dtype), device=q.device)


def call_kernel(op: Any, interface: str, call: Any, out_shape: tuple, *args: Any) -> tuple:
    """Run the kernel serving `call` on `args` and check the layout contract of every attention
    interface: it returns (out, lse), out contiguous of `out_shape` in the call's dtype, lse
    contiguous of out_shape[:-1] in float32 (float64 for float64), both on the call's device.
    A kernel's own exception keeps its type and message and gains a note naming the key."""
    kernel = op.kernel_for(interface, call)
    try:
        result = kernel(*args)
    except Exception as exc:
        add_note(exc, f"raised by {op._table.serving(interface, call)}")
        raise
    dtype = call.dtype
    wanted = ((out_shape, dtype), (out_shape[:-1], compute_dtype(dtype)))
    if isinstance(result, tuple) and len(result) == 2:
        if all(_fits(t, s, d, call.device) for t, (s, d) in zip(result, wanted, strict=True)):
            return result
    got = [_describe(t) for t in result] if isinstance(result, tuple) else _describe(result)
    raise BackendError(
        f"Output of {op._table.serving(interface, call)} is wrong: it returned {got}, but the "
        f"interface's layout contract expects (out, lse): contiguous tensors of shape "
        f"{list(out_shape)} in {_name(dtype)} and {list(out_shape[:-1])} in "
        f"{_name(compute_dtype(dtype))} on {call.device}. Fix the kernel, or refuse such calls "
        "in its refusal()."
    )
