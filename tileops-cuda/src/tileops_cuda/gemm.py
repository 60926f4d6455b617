"""GEMM kernels in TileLang: a Hopper kernel (TMA + wgmma), a general tensor-core kernel, and a
split-K kernel for skinny calls. All take float16 / bfloat16 and accumulate in float32.

| key                   | archs      | serves                          | preferred over          |
|-----------------------|------------|---------------------------------|-------------------------|
| tilelang_gemm_skinny  | sm_80..90  | m <= 64, k > 0; on sm_90 from   | tilelang_gemm, _hopper  |
|                       |            | m = 48 only what TMA can't take |                         |
| tilelang_gemm_hopper  | sm_90      | k > 0; n, k multiples of 8 or   | tilelang_gemm           |
|                       |            | padded to them from 2^36 flops  |                         |
| tilelang_gemm         | sm_80..90  | every 16-bit call (k == 0: 0s)  |                         |

float32 is refused by all three: TileLang's T.gemm runs float32 operands as tf32 on the tensor
cores (10 mantissa bits), while torch.mm keeps full float32 unless the user allows tf32; the
Triton or reference kernels serve it.

Symbolic vs baked: n and k are the weight's shape and are baked in (static strides, exact tail
masks, one build per layer); m, the tokens or batch, is symbolic, so one build serves every m
that the tile rule maps to the same tiles (m <= 64: the decode tile). The skinny kernel bakes
in its m bucket (16, 32 or 64: its row tile; m = 1 apart, for its fixup) and the split of k,
which follows from n, k and the device.

Tile rules are rules over the device facts; their constants come from the H200 sweeps of
benchmarks/sweeps/gemm_tiles_h200.py (results/gemm/gemm_tiles_hopper_skinny_nvidia_h200.md, and
results/gemm/gemm_tiles_skinny_nvidia_h200.md for the TMA copies).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from tileops import Kernel
from tileops.kernel import Build
from tileops.ops import GemmCall, GemmInterface

from .compile import build_program
from .operands import aligned
from .rows import AMPERE_AND_LATER, DTYPE_NAMES, vector_width

HALF = {torch.float16: 2, torch.bfloat16: 2}
# TMA (cp.async.bulk.tensor) needs 16-byte aligned row strides: 8 elements of a 16-bit type.
TMA_ALIGN_BYTES = 16
# The largest m the skinny kernel serves: one row tile of at most 64 (a decode batch).
SKINNY_M = 64
# Shared memory a block keeps beside its pipeline stages (mbarriers, the compiler's scratch).
SMEM_RESERVE = 2048
MIN_STAGES, MAX_STAGES = 2, 4
# Rasterize blocks in panels of this many tile rows so blocks running together share their
# B tiles in L2 (the Triton matmul tutorial's GROUP_M).
SWIZZLE_PANEL = 8
# Skinny: blocks per multiprocessor the split-K grid aims for, and the fewest k tiles per split
# (enough to fill the pipeline). Measured on the H200 (gemm_tiles_h200.py): one block per
# multiprocessor with 64 x 64 weight tiles beat 2 and 4, 128-column and 128-deep tiles, and
# TMA copies at m = 1, 16, 64 and n = k = 4096, 8192 (57% of copy at m = 1, n = k = 4096,
# against 55% for the earlier 4 blocks of 64 x 128). Deeper pipelines than the shared-memory
# rule's (6, 8, 12 stages) were no faster at any decode shape and up to 20% slower at m = 64
# (results/gemm/gemm_tiles_persistent_stages_nvidia_h200.md). From kernel times after a read-only L2
# clearing the rule reaches 72-73% of copy at m = 1 and 16 (n = k = 4096) and 97% at m = 1
# (8192); no alternative beat it: summing the splits in a cluster (57% at m = 1, 4096), 256
# threads (67%), TMA copies with wgmma (53-64%), or a CUDA-core GEMV for m <= 8 (71% at m = 1,
# commit b13531a) (results/gemm/gemm_tiles_skinny_split_sum_*, gemm_tiles_skinny_threads_clean_l2_*,
# gemm_tiles_skinny_wgmma_clean_l2_*, gemm_tiles_gemv_*).
SKINNY_BLOCKS_PER_SM = 1
MIN_K_TILES_PER_SPLIT = 4
# Up to this m a split k is summed by the fixup (SkinnyPlan.fixup): at m = 1 it beat the
# second kernel by 3-10% (n = k = 4096: 59-61% of copy against 54-55%; 8192: 78% against 74%),
# while from m = 16 the last block's sum, even vectorized with every split's reads in flight,
# trails the second kernel by kernel time (clean L2, n = k = 4096: 71.2 against 71.7% of copy
# at m = 16, 63.3 against 66.4 at 32, 48.7 against 51.7 at 64; its serial sum had cost 40% more
# than the launch at m = 64).
SKINNY_FIXUP_MAX_M = 1
REDUCE_THREADS = 256
# TileLang lowerings that would pick wgmma and warp specialization on sm_90: off for the
# sm_80-style kernels, which build for plain sm_90 (their copies also say `disable_tma`: they
# serve shapes TMA cannot take).
MMA_SYNC_ONLY = {"tl.disable_warp_specialized": True, "tl.disable_wgmma": True}
NO_TMA = {"disable_tma": True}


@dataclass(frozen=True)
class Tile:
    """One block's tile: block_m x block_n of C, block_k deep per pipeline stage; `policy`
    names TileLang's GemmWarpPolicy (how the warps split the tile); `smem_epilogue` stages C
    through shared memory (one bulk store, TMA on sm_90a) instead of each thread storing its
    fragment."""

    block_m: int
    block_n: int
    block_k: int
    threads: int
    stages: int = MIN_STAGES
    policy: str = "Square"
    smem_epilogue: bool = False

    def stage_bytes(self, itemsize: int) -> int:
        return (self.block_m + self.block_n) * self.block_k * itemsize

    def epilogue_bytes(self, itemsize: int) -> int:
        return self.block_m * self.block_n * itemsize if self.smem_epilogue else 0


# Candidate tiles, largest first; the rule takes the first whose tiles fill the device.
# Hopper: 128-row tiles run two consumer warpgroups (64 rows each, one wgmma m64nNk16 apiece);
# TileLang adds a producer warpgroup that issues the TMA loads. 64-deep k: a 128-byte row.
# FullRow: each consumer warpgroup takes whole rows (64 x block_n, CUTLASS's split), measured
# 4% faster than Square at 4096^3 and 8192^3 with four stages (gemm_tiles_h200.py). C staged
# in shared memory and stored in bulk: 128 x 256 at 4096^3 0.88x torch.matmul against 0.83x
# for the fragment's own stores (8192^3: 1.00x against 0.96x), 128 x 128 0.82x against 0.75x,
# though the C tile costs 128 x 256 a pipeline stage (3 left). A persistent grid (one block per
# multiprocessor walking the tiles under T.Persistent, the epilogue under the next tile's
# loads) measured slower with every tile: 0.86x against 0.92x at 4096^3, 0.94x against 1.00x
# at 8192^3 (results/gemm/gemm_tiles_persistent_stages_nvidia_h200.md, option of commit 169676c).
HOPPER_TILES = (
    Tile(128, 256, 64, 256, policy="FullRow", smem_epilogue=True),
    Tile(128, 128, 64, 256, policy="FullRow", smem_epilogue=True),
    Tile(64, 128, 64, 128, policy="FullRow"),
)
# sm_80 style (mma.sync + cp.async): TileLang's Ampere example tiles, 32-deep k.
GENERAL_TILES = (Tile(128, 256, 32, 256), Tile(128, 128, 32, 128), Tile(64, 64, 32, 128))
# Skinny: narrow columns (more blocks along n), deep k (long weight streams per stage).
SKINNY_BLOCK_N, SKINNY_BLOCK_K, SKINNY_THREADS = 64, 64, 128
# Decode on the Hopper kernel (m <= SKINNY_M): one 64-row tile (a warpgroup's wgmma), k unsplit
# (no partials, no second kernel) and a deep TMA pipeline of 128-deep stages. Column tile: the
# narrowest of DECODE_BLOCK_NS whose tiles fit one wave. From m = DECODE_HOPPER_M it beats the
# split-K kernel: 68.7-70.4 against 51.6% of copy at 64x4096x4096 (cuBLAS 70.9), 91.1 against
# 86.9 at 64x8192x8192, 81.7 against 65.1 at 64x11008x4096, 69.5 against 51.8 at 48x4096x4096.
# Below it TMA's out-of-bounds rows of A cost too much (the kernel on 16 rows: 17.0 us, on the
# same rows zero-padded to 64: 10.9): at m = 33 it trails at 8192x8192 (76.3 against 87.7),
# and the 32-column tile trails the 64 at m = 48 (56.5 against 69.5), so none is used.
# (results/gemm/gemm_tiles_hopper_skinny_clean_l2_nvidia_h200.md)
DECODE_HOPPER_M = 48
DECODE_BLOCK_NS = (64, 128)
DECODE_BLOCK_K = 128
DECODE_MAX_STAGES = 6
# Padding a misaligned call for TMA costs three copies and their host time; from 2^36 flops
# (about 110 us of GEMM) the Hopper kernel still wins by 3x (4096 x 4095 x 4096: 463 TFLOP/s
# against cuBLAS's 143), below it the host time sinks it (1000 x 1001 x 999: 19 against 48
# for tilelang_gemm).
PAD_MIN_FLOPS = 1 << 36


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(value: int, multiple: int) -> int:
    return _ceil_div(value, multiple) * multiple


def _pow2_ceil(value: int) -> int:
    return 1 << max(value - 1, 0).bit_length()


def pick_tile(call: GemmCall, candidates: tuple[Tile, ...]) -> Tile:
    """The largest candidate whose tiles of C give every multiprocessor a block (one full wave),
    else the smallest; stages: as many as the shared-memory budget holds, 2 to 4."""
    tile = next((t for t in candidates if _tiles(call, t) >= call.sm_count), candidates[-1])
    return _with_stages(tile, call, _ceil_div(call.k, tile.block_k))


def _tiles(call: GemmCall, tile: Tile) -> int:
    return _ceil_div(call.m, tile.block_m) * _ceil_div(call.n, tile.block_n)


def _with_stages(tile: Tile, call: GemmCall, k_tiles: int, most: int = MAX_STAGES) -> Tile:
    itemsize = HALF[call.dtype]
    room = call.smem_budget - SMEM_RESERVE - tile.epilogue_bytes(itemsize)
    fit = room // tile.stage_bytes(itemsize)
    stages = max(MIN_STAGES, min(most, fit, k_tiles))
    return replace(tile, stages=stages)


def decode_tile(call: GemmCall) -> Tile:
    """The Hopper kernel's tile for m <= SKINNY_M: 64 rows, the narrowest column tile whose
    tiles fit one wave (the most blocks streaming the weight, none waiting), up to
    DECODE_MAX_STAGES stages of DECODE_BLOCK_K."""
    fits = [bn for bn in DECODE_BLOCK_NS if _ceil_div(call.n, bn) <= call.sm_count]
    block_n = fits[0] if fits else DECODE_BLOCK_NS[-1]
    tile = Tile(64, block_n, DECODE_BLOCK_K, 128, policy="FullRow")
    return _with_stages(tile, call, _ceil_div(call.k, DECODE_BLOCK_K), DECODE_MAX_STAGES)


def tma_misaligned(call: GemmCall) -> bool:
    """n or k not a multiple of 8 (16-bit): their rows are not 16-byte aligned for TMA."""
    align = TMA_ALIGN_BYTES // HALF.get(call.dtype, 2)
    return bool(call.n % align or call.k % align)


@dataclass(frozen=True)
class SkinnyPlan:
    """Skinny tiling: row tile block_m (m's bucket), `splits` slices of `k_tiles` k tiles.
    `fixup`: one launch for a split k, the last block of each column tile to finish summing
    the partials (a counter per column tile tells it), instead of a second kernel."""

    tile: Tile
    splits: int
    k_tiles: int
    fixup: bool = False


def skinny_plan(
    call: GemmCall,
    block_n: int = SKINNY_BLOCK_N,
    block_k: int = SKINNY_BLOCK_K,
    blocks_per_sm: float = SKINNY_BLOCKS_PER_SM,
) -> SkinnyPlan:
    """Row tile: m rounded up to a power of two, at least 16 (the mma's rows). Split k so that
    column tiles x splits reach `blocks_per_sm` blocks per multiprocessor, keeping at least
    MIN_K_TILES_PER_SPLIT k tiles per split; no split is left empty."""
    block_m = max(16, _pow2_ceil(call.m))
    columns = _ceil_div(call.n, block_n)
    k_tiles = _ceil_div(call.k, block_k)
    wanted = _ceil_div(blocks_per_sm * call.sm_count, columns)
    splits = max(1, min(wanted, k_tiles // MIN_K_TILES_PER_SPLIT))
    per_split = _ceil_div(k_tiles, splits)
    tile = Tile(block_m, block_n, block_k, SKINNY_THREADS)
    splits = _ceil_div(k_tiles, per_split)
    fixup = splits > 1 and call.m <= SKINNY_FIXUP_MAX_M
    return SkinnyPlan(_with_stages(tile, call, per_split), splits, per_split, fixup)


def dtype_refusal(call: GemmCall) -> str | None:
    if call.dtype in HALF:
        return None
    if call.dtype == torch.float32:
        return (
            "float32 is not served: T.gemm would run it as tf32 (10 mantissa bits) where "
            "torch.mm keeps float32; the Triton or reference kernels serve it"
        )
    return f"{call.dtype} is not served (float16 and bfloat16 only); the reference serves it"


class _Gemm(Kernel, GemmInterface):
    """Base: dtype refusal, build identity (arch, dtype, n, k, plan) and the compiled call."""

    features: ClassVar[str] = ""
    pass_configs: ClassVar[dict[str, Any] | None] = MMA_SYNC_ONLY

    @classmethod
    def refusal(cls, call: GemmCall) -> str | None:
        return dtype_refusal(call) or cls.region_refusal(call)

    @classmethod
    def region_refusal(cls, call: GemmCall) -> str | None:
        return None

    @classmethod
    def plan(cls, call: GemmCall) -> Hashable:
        raise NotImplementedError

    @classmethod
    def entry_for(cls, call: GemmCall) -> tuple[Hashable, Build]:
        plan = cls.plan(call) if call.k else None
        identity = (call.arch, DTYPE_NAMES[call.dtype], call.n, call.k, plan)

        def build() -> _Gemm:
            if plan is None:
                return cls(call, [])
            name = f"{cls.__name__}{identity}"
            return cls(call, [cls.compile(name, i, p, call.arch) for i, p in cls.programs(call)])

        return identity, build

    @classmethod
    def compile(cls, name: str, index: int, program: Any, arch: int) -> Any:
        return build_program(
            f"{name}/{index}", program, arch, features=cls.features, pass_configs=cls.pass_configs
        )

    @classmethod
    def programs(cls, call: GemmCall) -> list[tuple[int, Any]]:
        tile = cls.plan(call)
        return [(0, lambda: gemm_program(call, tile, tma=cls.features == "a"))]

    def __init__(self, call: GemmCall, compiled: list[Any]) -> None:
        self.compiled = compiled

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        c = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
        if not self.compiled:  # k == 0: an empty sum
            return c.zero_()
        self.compiled[0](aligned(a), aligned(b), c)
        return c


class GemmGeneral(_Gemm):
    """Every float16/bfloat16 call, sm_80 on: mma.sync fed by cp.async, pipelined in shared
    memory; any n and k (misaligned ones with narrower copies); k == 0 gives zeros."""

    supported_archs = AMPERE_AND_LATER

    @classmethod
    def plan(cls, call: GemmCall) -> Tile:
        return pick_tile(call, GENERAL_TILES)


class GemmHopper(_Gemm):
    """sm_90: TMA loads into a multi-stage shared-memory ring, wgmma from a producer/consumer
    warp-specialized pipeline (TileLang's sm_90a lowering of T.Pipelined + T.gemm).

    TMA needs 16-byte aligned row strides. Where n or k is not a multiple of 8 in a large
    call (PAD_MIN_FLOPS), the operands are copied into zero-padded ones and the result out of
    a padded one, against cuBLAS losing ~80% of its throughput on such shapes.
    """

    supported_archs = frozenset({90})
    preferred_over = frozenset({"tilelang_gemm"})
    features = "a"  # wgmma and setmaxnreg exist on sm_90a only
    pass_configs = None

    @classmethod
    def region_refusal(cls, call: GemmCall) -> str | None:
        if call.k == 0:
            return "k == 0 leaves nothing to multiply: tilelang_gemm returns the zeros"
        if tma_misaligned(call) and 2 * call.m * call.n * call.k < PAD_MIN_FLOPS:
            return (
                f"TMA needs 16-byte aligned rows: n={call.n} and k={call.k} are not both "
                f"multiples of {TMA_ALIGN_BYTES // HALF[call.dtype]}, and below {PAD_MIN_FLOPS} "
                "flops padding them costs more than it saves; tilelang_gemm serves it"
            )
        return None

    @classmethod
    def entry_for(cls, call: GemmCall) -> tuple[Hashable, Build]:
        """The padded call's entry: one build per padded layer shape."""
        align = TMA_ALIGN_BYTES // HALF.get(call.dtype, 2)
        padded = {"n": _round_up(call.n, align), "k": _round_up(call.k, align)}
        return super().entry_for(type(call)(**{**call.__dict__, **padded}))

    @classmethod
    def plan(cls, call: GemmCall) -> Tile:
        return decode_tile(call) if call.m <= SKINNY_M else pick_tile(call, HOPPER_TILES)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        k, n = b.shape
        align = TMA_ALIGN_BYTES // a.element_size()
        pad_k, pad_n = _round_up(k, align) - k, _round_up(n, align) - n
        if pad_k:  # zeros in both operands: the extra products add nothing
            a, b = F.pad(a, (0, pad_k)), F.pad(b, (0, 0, 0, pad_k))
        if pad_n:
            b = F.pad(b, (0, pad_n))
        c = super().forward(a, b)
        return c[:, :n].contiguous() if pad_n else c


class GemmSkinny(_Gemm):
    """m <= 64 (decode): a weight-streaming split-K kernel, n in 64-column tiles and k split
    over blocks, float32 partials summed by a second kernel, or at m = 1 by the last block of
    each column tile (the fixup); one kernel when k is not split. On sm_90 from
    DECODE_HOPPER_M rows it leaves the TMA-aligned calls to the Hopper kernel's decode tile."""

    supported_archs = AMPERE_AND_LATER
    preferred_over = frozenset({"tilelang_gemm", "tilelang_gemm_hopper"})

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
        self._counters: dict[tuple[torch.device, int], torch.Tensor] = {}

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        plan = self.plan_
        if plan is None or plan.splits == 1:
            return super().forward(a, b)
        a, b = aligned(a), aligned(b)
        rows = plan.splits * plan.tile.block_m
        partials = torch.empty((rows, b.shape[1]), dtype=torch.float32, device=a.device)
        c = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
        if plan.fixup:
            self.compiled[0](a, b, partials, self._column_counters(a.device, b.shape[1]), c)
            return c
        self.compiled[0](a, b, partials)
        self.compiled[1](partials, c)
        return c

    def _column_counters(self, device: torch.device, n: int) -> torch.Tensor:
        """The fixup's arrival counters, one per column tile, zero between calls (the last
        block resets its own). One set per stream: kernels on one stream run in order, while
        two streams' calls could interleave their counts."""
        stream = torch.cuda.current_stream(device).cuda_stream
        counters = self._counters.get((device, stream))
        if counters is None:
            columns = _ceil_div(n, self.plan_.tile.block_n)
            counters = torch.zeros(columns, dtype=torch.int32, device=device)
            self._counters[(device, stream)] = counters
        return counters


# -- TileLang programs -----------------------------------------------------------------------


def gemm_program(call: GemmCall, tile: Tile, tma: bool) -> Any:
    """C = A @ B with `tile`: a pipelined k loop of T.copy into shared memory and T.gemm into a
    float32 fragment. On sm_90a (`tma`) TileLang lowers the copies to TMA and the product to
    wgmma, elsewhere (no `tma`, MMA_SYNC_ONLY) to cp.async and mma.sync. m is symbolic."""
    import tilelang.language as T

    from . import tiles

    n, k, dtype = call.n, call.k, DTYPE_NAMES[call.dtype]
    bm, bn, bk = tile.block_m, tile.block_n, tile.block_k
    m = T.dynamic("m")
    hints = None if tma else NO_TMA

    def main(A, B, C):
        with T.Kernel(T.ceildiv(n, bn), T.ceildiv(m, bm), threads=tile.threads) as (bx, by):
            a_tile = T.alloc_shared((bm, bk), dtype)
            b_tile = T.alloc_shared((bk, bn), dtype)
            acc = T.alloc_fragment((bm, bn), "float32")
            T.use_swizzle(SWIZZLE_PANEL)
            T.clear(acc)
            for kk in T.Pipelined(T.ceildiv(k, bk), num_stages=tile.stages):
                T.copy(A[by * bm, kk * bk], a_tile, annotations=hints)
                T.copy(B[kk * bk, bx * bn], b_tile, annotations=hints)
                T.gemm(a_tile, b_tile, acc, policy=getattr(T.GemmWarpPolicy, tile.policy))
            if tile.smem_epilogue:
                c_tile = T.alloc_shared((bm, bn), dtype)
                T.copy(acc, c_tile)
                T.copy(c_tile, C[by * bm, bx * bn])
            else:
                T.copy(acc, C[by * bm, bx * bn])

    return tiles.prim_func(main, dtype, A=(m, k), B=(k, n), C=(m, n))


def skinny_program(call: GemmCall, plan: SkinnyPlan) -> Any:
    """Block (column tile, split) multiplies all m rows (one row tile) by its slice of k.
    Split: float32 partials into P[split * block_m + row, col]; unsplit: straight into C.
    Copies are cp.async: TMA copies trailed them at every decode shape on the H200."""
    import tilelang.language as T

    from . import tiles

    n, k, dtype = call.n, call.k, DTYPE_NAMES[call.dtype]
    tile, per_split = plan.tile, plan.k_tiles
    bm, bn, bk = tile.block_m, tile.block_n, tile.block_k
    split_k = plan.splits > 1
    m = T.dynamic("m")

    # The fixup's sum: each thread takes `vec` adjacent columns (one 16-byte float32 read per
    # split where n allows) and its passes are unrolled, so every split's reads are in flight at
    # once: the sum costs one L2 round trip, not one per element.
    vec = min(vector_width(n, torch.float32), bn)
    passes = _ceil_div(bm * bn, tile.threads * vec)
    sum_splits = split_sum(plan, vec)

    @T.macro
    def fixup(P, Count, C, bx):
        """The split-k fixup: each block counts itself in for its column tile once its partials
        are written (release); the last to arrive (acquire) sums every split's partials of the
        tile into C and resets the counter for the next call."""
        tx = T.get_thread_binding()
        arrived = T.alloc_shared((1,), "int32")
        T.sync_threads()  # every thread's partials written before the count
        if tx == 0:
            arrived[0] = T.atomic_add(Count[bx], 1, memory_order="acq_rel", return_prev=True)
        T.sync_threads()
        if arrived[0] == plan.splits - 1:
            for i in T.unroll(passes):
                row = ((i * tile.threads + tx) * vec) // bn
                col = bx * bn + ((i * tile.threads + tx) * vec) % bn
                if row < m and col < n:
                    sum_splits(P, C, row, col)
            if tx == 0:
                Count[bx] = 0

    @T.macro
    def body(A, B, C, Count, Out):
        with T.Kernel(T.ceildiv(n, bn), plan.splits, threads=tile.threads) as (bx, split):
            a_tile = T.alloc_shared((bm, bk), dtype)
            b_tile = T.alloc_shared((bk, bn), dtype)
            acc = T.alloc_fragment((bm, bn), "float32")
            T.clear(acc)
            for kk in T.Pipelined(per_split, num_stages=tile.stages):
                T.copy(A[0, (split * per_split + kk) * bk], a_tile, annotations=NO_TMA)
                T.copy(B[(split * per_split + kk) * bk, bx * bn], b_tile, annotations=NO_TMA)
                T.gemm(a_tile, b_tile, acc)
            if split_k:
                T.copy(acc, C[split * bm, bx * bn])
            else:
                T.copy(acc, C[0, bx * bn])
            if split_k and plan.fixup:
                fixup(C, Count, Out, bx)

    if split_k and plan.fixup:

        def main(A, B, C, Count, Out):
            body(A, B, C, Count, Out)

        dtypes = {"C": "float32", "Count": "int32"}
        columns = _ceil_div(n, bn)
        shapes = {"A": (m, k), "B": (k, n), "C": (plan.splits * bm, n), "Count": (columns,)}
        return tiles.prim_func(main, dtype, dtypes, **shapes, Out=(m, n))

    def main(A, B, C):
        body(A, B, C, None, None)

    if split_k:
        return tiles.prim_func(
            main, dtype, {"C": "float32"}, A=(m, k), B=(k, n), C=(plan.splits * bm, n)
        )
    return tiles.prim_func(main, dtype, A=(m, k), B=(k, n), C=(m, n))


def split_sum(plan: SkinnyPlan, vec: int) -> Any:
    """C[row, col:col + vec] = the sum over splits of P[split * block_m + row, col:col + vec],
    in float32, rounded once: the fixup's and the reduce kernel's sum."""
    import tilelang.language as T

    @T.macro
    def sum_splits(P, C, row, col):
        total = T.alloc_local((vec,), "float32")
        for v in T.vectorized(vec):
            total[v] = P[row, col + v]
        for s in T.unroll(1, plan.splits):
            for v in T.vectorized(vec):
                total[v] += P[s * plan.tile.block_m + row, col + v]
        for v in T.vectorized(vec):
            C[row, col + v] = total[v]

    return sum_splits


def reduce_program(call: GemmCall, plan: SkinnyPlan) -> Any:
    """C[row, col] = sum over splits of P[split * block_m + row, col], in float32, rounded once.
    Threads take consecutive vectors of C (coalesced reads of every split's rows)."""
    import tilelang.language as T

    from . import tiles

    n, dtype, bm = call.n, DTYPE_NAMES[call.dtype], plan.tile.block_m
    vec = vector_width(n, torch.float32)
    runs = n // vec
    m = T.dynamic("m")
    sum_splits = split_sum(plan, vec)

    def main(P, C):
        with T.Kernel(T.ceildiv(m * runs, REDUCE_THREADS), threads=REDUCE_THREADS) as bx:
            g = bx * REDUCE_THREADS + T.get_thread_binding()
            if g < m * runs:
                sum_splits(P, C, g // runs, (g % runs) * vec)

    return tiles.prim_func(main, dtype, {"P": "float32"}, P=(plan.splits * bm, n), C=(m, n))
