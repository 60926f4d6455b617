"""GEMM kernels in TileLang: a Hopper kernel (TMA + wgmma), a general tensor-core kernel, and a
split-K kernel for skinny calls. All take float16 / bfloat16, accumulate in float32, read every
layout (NN, NT, TN, TT: each operand as it is stored, `call.trans_a` / `call.trans_b`) and add
a bias in their epilogue (in float32, before C's one rounding).

| key                   | archs      | serves                          | preferred over          |
|-----------------------|------------|---------------------------------|-------------------------|
| tilelang_gemm_skinny  | sm_80..90  | m <= 64, k > 0; on sm_90 from   | tilelang_gemm, _hopper  |
|                       |            | m = 48 only what TMA can't take |                         |
| tilelang_gemm_hopper  | sm_90      | k > 0; n, k (and m when a is    | tilelang_gemm           |
|                       |            | transposed) multiples of 8 or   |                         |
|                       |            | padded to them from 2^36 flops  |                         |
| tilelang_gemm         | sm_80..90  | every 16-bit call (k == 0: 0s)  |                         |

cuBLAS (`vendor.CublasGemm`, key `cublas`) is preferred over all three and steps aside only in
the regions where one of them measured faster on the H200 (`vendor.GEMM_FASTER`,
TUNING.md#vendor-regions): the tables below partition what remains when it does.

float32 is refused by all three: TileLang's T.gemm runs float32 operands as tf32 on the tensor
cores (10 mantissa bits), while torch.mm keeps full float32 unless the user allows tf32; the
Triton or reference kernels serve it.

Symbolic vs baked: n and k are the weight's shape and are baked in (static strides, exact tail
masks, one build per layer); m, the tokens or batch, is symbolic, so one build serves every m
that the tile rule maps to the same tiles (m <= 64: the decode tile). The skinny kernel bakes
in its m bucket (16, 32 or 64: its row tile; m = 1 apart, for its fixup) and the split of k,
which follows from n, k and the device. The layout and the bias are baked in: each is its own
build. With a transposed a, m is also a's row pitch (symbolic: TMA descriptors are made per
launch, so the Hopper kernel needs m aligned as it needs n and k).

The tile rules are in `tiles` (their measurements in TUNING.md), the programs in `programs`.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch
import torch.nn.functional as F

from tileops.backend import Build
from tileops.ops import GemmCall

from .._common.arith import AMPERE_AND_LATER, ceil_div, round_up
from .._common.operands import aligned, current_raw_stream
from .base import _Gemm, with_bias
from .programs import MMA_SYNC_ONLY, gemm_program, reduce_program, skinny_program
from .tiles import (
    DECODE_HOPPER_M,
    GENERAL_TILES,
    HALF,
    HOPPER_TILES,
    PAD_MIN_FLOPS,
    SKINNY_M,
    TMA_ALIGN_BYTES,
    SkinnyPlan,
    Tile,
    decode_tile,
    misaligned,
    pick_tile,
    skinny_plan,
    tma_misaligned,
)


class GemmGeneral(_Gemm):
    """Every float16/bfloat16 call, sm_80 on: mma.sync fed by cp.async, pipelined in shared
    memory; any n and k (misaligned ones with narrower copies); k == 0 gives zeros."""

    supported_archs = AMPERE_AND_LATER
    pass_configs = MMA_SYNC_ONLY

    @classmethod
    def plan(cls, call: GemmCall) -> Tile:
        return pick_tile(call, GENERAL_TILES)

    @classmethod
    def programs(cls, call: GemmCall) -> list[tuple[int, Any]]:
        tile = cls.plan(call)
        return [(0, lambda: gemm_program(call, tile, tma=False))]


class GemmHopper(_Gemm):
    """sm_90: TMA loads into a multi-stage shared-memory ring, wgmma from a producer/consumer
    warp-specialized pipeline (TileLang's sm_90a lowering of T.Pipelined + T.gemm).

    TMA needs 16-byte aligned row strides. Where n or k (or m, with a transposed a) is not a
    multiple of 8 in a large call (PAD_MIN_FLOPS), the operands are copied into zero-padded
    ones and the result out of a padded one (TUNING.md#hopper-padding).
    """

    supported_archs = frozenset({90})
    preferred_over = frozenset({"tilelang_gemm"})
    features = "a"  # wgmma and setmaxnreg exist on sm_90a only

    @classmethod
    def region_refusal(cls, call: GemmCall) -> str | None:
        if call.k == 0:
            return "k == 0 leaves nothing to multiply: tilelang_gemm returns the zeros"
        off = misaligned(call)
        if off and 2 * call.m * call.n * call.k < PAD_MIN_FLOPS:
            verb = "is not a multiple" if len(off) == 1 else "are not multiples"
            return (
                f"TMA needs 16-byte aligned rows: {' and '.join(off)} {verb} of "
                f"{TMA_ALIGN_BYTES // HALF[call.dtype]} ({call.layout}), and below "
                f"{PAD_MIN_FLOPS} flops padding costs more than it saves; tilelang_gemm serves it"
            )
        return None

    @classmethod
    def entry_for(cls, call: GemmCall) -> tuple[Hashable, Build]:
        """The padded call's entry: one build per padded layer shape."""
        align = TMA_ALIGN_BYTES // HALF.get(call.dtype, 2)
        padded = {"n": round_up(call.n, align), "k": round_up(call.k, align)}
        return super().entry_for(type(call)(**{**call.__dict__, **padded}))

    @classmethod
    def plan(cls, call: GemmCall) -> Tile:
        return decode_tile(call) if call.m <= SKINNY_M else pick_tile(call, HOPPER_TILES)

    @classmethod
    def programs(cls, call: GemmCall) -> list[tuple[int, Any]]:
        tile = cls.plan(call)
        return [(0, lambda: gemm_program(call, tile, tma=True))]

    def forward(self, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        m, n = a.shape[self.m_dim], b.shape[self.n_dim]
        k_a, k_b = 1 - self.m_dim, 1 - self.n_dim  # where k lies in a's and b's shapes
        align = TMA_ALIGN_BYTES // a.element_size()
        pad_k, pad_n = round_up(a.shape[k_a], align) - a.shape[k_a], round_up(n, align) - n
        pad_m = round_up(m, align) - m if self.m_dim else 0  # m is a's row pitch
        if pad_k:  # zeros in both operands: the extra products add nothing
            a, b = zero_padded(a, k_a, pad_k), zero_padded(b, k_b, pad_k)
        if pad_m:
            a = zero_padded(a, 1, pad_m)
        if pad_n:
            b = zero_padded(b, self.n_dim, pad_n)
            bias = None if bias is None else F.pad(bias, (0, pad_n))
        c = super().forward(a, b, bias)
        if pad_n:
            return c[:m, :n].contiguous()
        return c[:m] if pad_m else c


class GemmSkinny(_Gemm):
    """m <= 64 (decode): a weight-streaming split-K kernel, n in 64-column tiles and k split
    over blocks, float32 partials summed by a second kernel, or at m = 1 by the last block of
    each column tile (the fixup); one kernel when k is not split. On sm_90 from
    DECODE_HOPPER_M rows it leaves the TMA-aligned calls to the Hopper kernel's decode tile."""

    supported_archs = AMPERE_AND_LATER
    preferred_over = frozenset({"tilelang_gemm", "tilelang_gemm_hopper"})
    pass_configs = MMA_SYNC_ONLY

    @classmethod
    def region_refusal(cls, call: GemmCall) -> str | None:
        if call.k == 0:
            return "k == 0 leaves nothing to multiply: tilelang_gemm returns the zeros"
        if call.m > SKINNY_M:
            return f"skinny serves m <= {SKINNY_M}, not m={call.m}"
        on_hopper = call.arch in GemmHopper.supported_archs and not tma_misaligned(call)
        if call.m >= DECODE_HOPPER_M and on_hopper:
            return (
                f"m={call.m} >= {DECODE_HOPPER_M} on sm_{call.arch}: tilelang_gemm_hopper "
                "streams the weight faster unsplit (TMA, wgmma)"
            )
        return None

    @classmethod
    def plan(cls, call: GemmCall) -> SkinnyPlan:
        return skinny_plan(call)

    @classmethod
    def programs(cls, call: GemmCall) -> list[tuple[int, Any]]:
        plan = skinny_plan(call)
        if plan.splits == 1 or plan.fixup:
            return [(0, lambda: skinny_program(call, plan))]
        return [(0, lambda: skinny_program(call, plan)), (1, lambda: reduce_program(call, plan))]

    def __init__(self, call: GemmCall, compiled: list[Any]) -> None:
        super().__init__(call, compiled)
        self.plan_ = skinny_plan(call) if call.k else None
        self._scratch: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        plan = self.plan_
        if plan is None or plan.splits == 1:
            return super().forward(a, b, bias)
        a, b = aligned(a), aligned(b)
        c = self.output(a, b)
        n = c.shape[1]
        if plan.fixup:  # one launch: its scratch can be the stream's own, kept between calls
            self.launches[0](a, b, *self._fixup_scratch(a.device, n), c, *with_bias(bias))
            return c
        partials = torch.empty((plan.splits * plan.tile.block_m, n), dtype=torch.float32,
                               device=a.device)  # fmt: skip
        self.launches[0](a, b, partials)
        self.launches[1](partials, c, *with_bias(bias))
        return c

    def _fixup_scratch(self, device: torch.device, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The fixup kernel's float32 partials and its arrival counters, one per column tile,
        zero between calls (the last block resets its own). One set per stream: kernels on
        one stream run one after another, while two streams' calls could interleave."""
        key = (device.index, current_raw_stream(device))
        scratch = self._scratch.get(key)
        if scratch is None:
            plan = self.plan_
            partials = torch.empty((plan.splits * plan.tile.block_m, n), dtype=torch.float32,
                                   device=device)  # fmt: skip
            counters = torch.zeros(ceil_div(n, plan.tile.block_n), dtype=torch.int32, device=device)
            scratch = self._scratch[key] = partials, counters
        return scratch


def zero_padded(t: torch.Tensor, dim: int, extra: int) -> torch.Tensor:
    """`t` (2-D) with `extra` zeros appended along `dim`."""
    return F.pad(t, (0, extra) if dim == 1 else (0, 0, 0, extra))
