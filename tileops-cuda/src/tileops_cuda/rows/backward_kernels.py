"""tileops-cuda's row-wise backward kernels (RMSNorm, LayerNorm, softmax): key, region, refusals.

One row per block, on sm_80 .. sm_90, for float16/bfloat16/float32 rows that fit: softmax
holds y and dy in float32 registers (`backward_plan`); the norms stage x and dy through shared
memory and keep them in registers too where those fit beside the parameter partials
(`norm_backward_plan`). Longer rows go to Triton's looped kernel or the reference. Norms run on
a persistent grid and write per-block partials of dweight/dbias, summed here in a fixed order
(one torch sum over the blocks' axis for both): deterministic, no atomics. Programs:
`backward_program`.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, ClassVar

import torch

from tileops import Kernel
from tileops.ops import (
    LayerNormBackwardInterface,
    RMSNormBackwardInterface,
    SoftmaxBackwardInterface,
)

from .._common.arith import (
    AMPERE_AND_LATER,
    DTYPE_NAMES,
    ITEMSIZE,
    MAX_THREADS,
    WARP,
    ceil_div,
    pow2_ceil,
    vector_width,
)
from .._common.compile import Launch, build_program
from .._common.lanes import (
    BLOCKS_PER_SM,
    REDUCE_SCRATCH_BYTES,
    REGISTER_FILE,
    THREADS_PER_SM,
)
from .._common.operands import aligned, all_aligned, as_rows
from .backward_program import BackwardPlan, norm_backward_program, softmax_backward_program

BACKWARD_KEY = "tilelang_row_backward"
OVERHEAD_REGISTERS = 32  # addresses, loop state, the reductions: provisional (TUNING.md#backward)
MAX_REGISTERS = 255  # per thread
# The norms' program places every barrier it needs itself: TileLang's would add one per row
# after the cp.async wait, where each lane reads only the vectors it copied (backward_program).
OWN_BARRIERS = {"tl.disable_thread_storage_sync": True}
# A cluster's blocks write their row sums into each other's shared memory while the receiver
# still works: no buffer may share its region with another TileLang deems dead by then.
CLUSTER_BARRIERS = {**OWN_BARRIERS, "tl.disable_shared_memory_reuse": True}
MAX_CLUSTER = 8  # the portable cluster size on sm_90
EMPTY_ROWS = "rows of length 0 have no gradient to compute; the reference serves them"


def backward_plan(n: int, dtype: torch.dtype, arrays: int, sm_count: int) -> BackwardPlan | None:
    """The row over one block's lanes, `arrays` float32 values per element held per lane; None
    when the block's registers cannot hold them. `programs`: a persistent grid of as many
    blocks as the multiprocessors keep resident."""
    vec = vector_width(n, dtype)
    lanes, chunks = _layout(n, vec)
    resident = _resident(lanes, chunks * vec, arrays)
    if resident is None:
        return None
    return BackwardPlan(lanes, vec, chunks, max(sm_count, 1) * resident, resident)


def norm_backward_plan(
    n: int, dtype: torch.dtype, partials: int, sm_count: int, smem_budget: int,
    clusters: bool = False,
) -> BackwardPlan | None:  # fmt: skip
    """The norms' plan: x and dy staged through shared memory, two rows deep where the budget
    allows (one otherwise), and also held in float32 registers where those fit beside the
    lane's `partials` (dweight, dbias); rows too long for that are read from shared memory.
    Rows whose block would keep one stage, or that fit no block, are split over the smallest
    cluster of 2, 4 or 8 (`clusters`: sm_90) whose slices keep two (TUNING.md#backward)."""
    sizes = [1, *(2**k for k in range(1, MAX_CLUSTER.bit_length()) if clusters)]
    plans = [_slice_plan(n, dtype, partials, sm_count, smem_budget, size) for size in sizes]
    fitting = [plan for plan in plans if plan is not None]
    return next((plan for plan in fitting if plan.stages == 2), fitting[0] if fitting else None)


def _slice_plan(
    n: int, dtype: torch.dtype, partials: int, sm_count: int, smem_budget: int, cluster: int
) -> BackwardPlan | None:
    """norm_backward_plan for blocks of `cluster` sharing each row, a slice of n each."""
    vec = vector_width(n, dtype)
    lanes, chunks = _layout(ceil_div(n, cluster), vec)
    hold, resident = "registers", _resident(lanes, chunks * vec, 2 + partials)
    if resident is None:
        hold, resident = "shared", _resident(lanes, chunks * vec, partials)
        if resident is None:
            return None
    row_bytes = 2 * lanes * chunks * vec * ITEMSIZE[dtype]  # x and dy
    if row_bytes + REDUCE_SCRATCH_BYTES > smem_budget:
        return None
    stages = 2 if 2 * row_bytes + REDUCE_SCRATCH_BYTES <= smem_budget else 1
    resident = max(min(resident, smem_budget // (stages * row_bytes + REDUCE_SCRATCH_BYTES)), 1)
    programs = max(max(sm_count, 1) * resident // cluster, 1)
    return BackwardPlan(lanes, vec, chunks, programs, resident, stages, hold, cluster)


def _layout(length: int, vec: int) -> tuple[int, int]:
    """(lanes, chunks): `length` elements over at most a block's lanes, vectors of `vec`."""
    lanes = min(MAX_THREADS, max(WARP, pow2_ceil(ceil_div(length, vec))))
    return lanes, ceil_div(length, lanes * vec)


def _resident(lanes: int, values: int, arrays: int) -> int | None:
    """Blocks of `lanes` per multiprocessor when each lane holds `arrays` float32 values per
    element of its `values`; None when one block's registers cannot hold them."""
    registers = arrays * values + OVERHEAD_REGISTERS
    if registers > MAX_REGISTERS or lanes * registers > REGISTER_FILE:
        return None
    return min(REGISTER_FILE // (lanes * registers), THREADS_PER_SM[90] // lanes, BLOCKS_PER_SM)


class TileLangRowsBackward(Kernel):
    """What the three declare alike: archs, dtypes, empty rows, the register region."""

    supported_archs = AMPERE_AND_LATER

    @classmethod
    def refusal(cls, call: Any) -> str | None:
        if call.dtype not in ITEMSIZE:
            return (
                f"{call.dtype} is not served: these kernels compute in float32, which would "
                "lose float64 precision; the torch reference kernels serve it"
            )
        if call.n == 0:
            return EMPTY_ROWS
        own = cls.own_refusal(call)
        if own:
            return own
        if cls.plan(call, 1) is None:
            return (
                f"a row of {call.n} does not fit one block ({cls.held(call)}); Triton's looped "
                "kernel or the reference serves it"
            )
        return None

    @classmethod
    def plan(cls, call: Any, sm_count: int) -> BackwardPlan | None:
        raise NotImplementedError

    @classmethod
    def own_refusal(cls, call: Any) -> str | None:
        return None

    @classmethod
    def held(cls, call: Any) -> str:
        """What a lane keeps of the row, for the refusal of rows that do not fit."""
        raise NotImplementedError


class _NormBackward(TileLangRowsBackward):
    kind: ClassVar[str]

    @classmethod
    def own_refusal(cls, call: Any) -> str | None:
        if call.param_dtype is not None and call.param_dtype not in (call.dtype, torch.float32):
            return f"parameters of {call.param_dtype} beside x of {call.dtype} are not served"
        return None

    @classmethod
    def wanted(cls, call: Any) -> tuple[bool, bool, bool]:
        dtypes, needs = (*call.dtypes, None)[:3], (*call.needs, False)[:3]
        return needs[0], needs[1] and dtypes[1] is not None, needs[2] and dtypes[2] is not None

    @classmethod
    def held(cls, call: Any) -> str:
        partials = sum(cls.wanted(call)[1:])
        return (
            f"{partials} float32 register values per element for the parameter gradients' "
            "partials, x and dy in shared memory"
        )

    @classmethod
    def plan(cls, call: Any, sm_count: int) -> BackwardPlan | None:
        partials = sum(cls.wanted(call)[1:])
        return norm_backward_plan(
            call.n, call.dtype, partials, sm_count, call.smem_budget, call.arch >= 90
        )

    @classmethod
    def entry_for(cls, call: Any) -> tuple[Hashable, Any]:
        plan = cls.plan(call, call.sm_count)
        wanted = cls.wanted(call)
        identity = (call.arch, DTYPE_NAMES[call.dtype], call.n, call.eps, call.param_dtype,
                    call.dtypes[1] is not None, wanted, plan)  # fmt: skip

        def build() -> _NormBackward:
            program = lambda: norm_backward_program(cls.kind, plan, call, wanted)  # noqa: E731
            name = f"{cls.__name__}{identity}"
            configs = CLUSTER_BARRIERS if plan.cluster > 1 else OWN_BARRIERS
            built = build_program(name, program, call.arch, pass_configs=configs)
            return cls(built, plan, call.n, wanted)

        return identity, build

    def __init__(self, compiled: Any, plan: BackwardPlan, n: int, wanted: tuple) -> None:
        self.compiled, self.launch = compiled, Launch(compiled)
        self.plan, self.n, self.wanted = plan, n, wanted

    def forward(self, grads: tuple, inputs: tuple) -> tuple:
        (dy,), n = grads, self.n
        x, weight, bias = (*inputs, None)[:3]  # RMSNorm has no bias
        need_dx, need_dw, need_db = self.wanted
        rows, dy_rows = as_rows(x, n), as_rows(dy, n)
        params = () if weight is None else (weight.contiguous().view(n),)
        if not all_aligned(rows, dy_rows, *params):
            rows, dy_rows, *params = map(aligned, (rows, dy_rows, *params))
        dx = torch.empty_like(rows) if need_dx else None
        found = [dx if dx is None or rows is x else dx.view(x.shape), None, None]
        summed = need_dw + need_db  # dweight and dbias partials in one buffer, summed at once
        parts = None
        if summed:
            parts = torch.empty((summed, self.plan.programs, n), dtype=torch.float32,
                                device=x.device)  # fmt: skip
        if rows.shape[0]:
            buffers = [dx] if need_dx else []
            self.launch(rows, dy_rows, *params, *buffers, *(parts.unbind(0) if summed else ()))
        if summed:
            like = weight if need_dw else bias  # weight and bias share one dtype
            totals = parts.sum(1) if rows.shape[0] else parts.new_zeros(summed, n)
            totals = totals.to(like.dtype).view(summed, *like.shape).unbind(0)
            slots = [k for k, need in ((1, need_dw), (2, need_db)) if need]
            for slot, total in zip(slots, totals, strict=True):
                found[slot] = total
        return tuple(found[: len(inputs)])


class TileLangRMSNormBackward(_NormBackward, RMSNormBackwardInterface):
    """RMSNorm's dx and dweight for rows that fit one block's registers, sm_80 .. sm_90."""

    kind = "rms"


class TileLangLayerNormBackward(_NormBackward, LayerNormBackwardInterface):
    """LayerNorm's dx, dweight and dbias for rows that fit one block's registers."""

    kind = "layer"

    @classmethod
    def own_refusal(cls, call: Any) -> str | None:
        if call.n == 1:
            return (
                "a row of one column has dx exactly 0, where the kernel's fused multiply-add "
                "leaves the rounding of dy * weight (TUNING.md#backward); the reference serves it"
            )
        return super().own_refusal(call)


class TileLangSoftmaxBackward(TileLangRowsBackward, SoftmaxBackwardInterface):
    """Softmax's dx from the forward's y and dy, for rows that fit one block's registers."""

    @classmethod
    def own_refusal(cls, call: Any) -> str | None:
        if not call.has_output:
            return (
                "the forward's output y was modified in place since the forward, and this "
                "kernel reads y; the reference recomputes it from x"
            )
        return None

    @classmethod
    def held(cls, call: Any) -> str:
        return "2 float32 register values per element: y and dy"

    @classmethod
    def plan(cls, call: Any, sm_count: int) -> BackwardPlan | None:
        return backward_plan(call.n, call.dtype, 2, sm_count)

    @classmethod
    def entry_for(cls, call: Any) -> tuple[Hashable, Any]:
        plan = cls.plan(call, 1)
        dim = dict(call.params)["dim"]
        identity = (call.arch, DTYPE_NAMES[call.dtype], call.n, dim, plan)

        def build() -> TileLangSoftmaxBackward:
            program = lambda: softmax_backward_program(plan, call)  # noqa: E731
            return cls(build_program(f"{cls.__name__}{identity}", program, call.arch), call.n, dim)

        return identity, build

    def __init__(self, compiled: Any, n: int, dim: int) -> None:
        self.compiled, self.launch, self.n, self.dim = compiled, Launch(compiled), n, dim

    def forward(self, grads: tuple, inputs: tuple, outputs: tuple) -> tuple:
        (dy,), (y,), n = grads, outputs, self.n
        rank = y.dim()
        dim = self.dim % rank if rank else 0
        moved = rank > 1 and dim != rank - 1
        if moved:  # the softmax dim last, as the forward's rows
            y, dy = y.movedim(dim, -1), dy.movedim(dim, -1)
        rows, dy_rows = as_rows(y, n), as_rows(dy, n)
        if not all_aligned(rows, dy_rows):
            rows, dy_rows = aligned(rows), aligned(dy_rows)
        dx = torch.empty_like(rows)
        if rows.shape[0]:
            self.launch(rows, dy_rows, dx)
        dx = dx if rows is y else dx.view(y.shape)
        return (dx.movedim(-1, dim) if moved else dx,)
