"""acme's RMSNorm: one more implementation of RMSNormFwdOp's "rms_norm" interface.

It codes against the interface, not the op: it receives `x` as a contiguous (rows, n) tensor
and `weight` as a contiguous (n,) tensor of x's dtype (or None), and returns a (rows, n) tensor.
The op has already flattened the caller's shape and resolved `eps`.

The kernel sums squares in blocks of 8 columns, the way a vectorised kernel would, which is
why it only serves rows whose length is a multiple of 8. Plain torch, so it runs on CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch

from tileops import Kernel
from tileops.ops import RMSNormCall, RMSNormInterface

KEY = "acme"
"""The key acme registers under; keys are per op and must not collide with the op's own."""

BLOCK = 8


class AcmeRMSNorm(Kernel, RMSNormInterface):
    # Availability: CPU only. Without this line the default would be {"cuda"}.
    devices = {"cpu"}
    # Preference: acme overlaps the op's torch reference on CPU and should win there. The
    # reference is `general`, so it already ranks below every non-general kernel; naming it
    # states the overlap explicitly, and the dispatcher reports it in `explain`.
    preferred_over = {"reference"}

    @classmethod
    def refusal(cls, call: RMSNormCall) -> str | None:
        """Applicability: None for calls acme serves, else a sentence users will read."""
        if call.dtype != torch.float32:
            return f"acme computes in the input dtype and serves float32 only, not {call.dtype}"
        if call.n % BLOCK:
            return f"acme sums rows in blocks of {BLOCK}; n={call.n} is not a multiple of {BLOCK}"
        if not call.has_weight:
            return "acme fuses the weight into its scaling pass and needs a weight"
        return None

    @classmethod
    def entry_for(cls, call: RMSNormCall) -> tuple[Hashable, Callable[[], AcmeRMSNorm]]:
        """Build identity: what the built kernel is specialised on. Calls with equal identity
        share one instance. A compiling backend would compile inside the returned function,
        never at import."""
        identity = (call.n, call.eps)
        return identity, lambda: cls(*identity)

    def __init__(self, n: int, eps: float) -> None:
        self.n = n
        self.eps = eps

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        rows = x.shape[0]
        blocks = x.view(rows, self.n // BLOCK, BLOCK)
        partial = (blocks * blocks).sum(dim=-1)  # (rows, n / 8): one partial sum per block
        scale = torch.rsqrt(partial.sum(dim=-1, keepdim=True) / self.n + self.eps)
        return x * scale * weight
