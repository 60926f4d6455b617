"""What the TileLang attention kernels share: the calls no program of theirs takes, the build
identity and compilation, and the launches (outputs allocated here, decode's partials too;
through `Launch`, TileLang's argument wrapper skipped).
Which kernel serves which call is declared in `kernels`."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, ClassVar

import torch

from tileops import Kernel
from tileops.backend import Build

from .._common.arith import DTYPE_NAMES
from .._common.compile import Launch, build_program
from .._common.operands import aligned, current_raw_stream
from .bwd_program import bwd_program
from .decode_program import combine_program, split_program
from .fwd_program import fwd_program
from .fwd_ws_program import fwd_persistent_program, fwd_ws_program
from .plans import DECODE_ROWS, HEAD_DIMS, bwd_plan, decode_plan, decode_rows, fwd_plan

Tensor = torch.Tensor
HALF = (torch.float16, torch.bfloat16)
# The sm_80 lowering (mma.sync fed by cp.async), for builds that plain sm_90 also runs.
MMA_SYNC_ONLY = {"tl.disable_warp_specialized": True, "tl.disable_wgmma": True}
PARTIAL_SETS = 8
_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: False)


def scale_refusal(call: Any) -> str | None:
    """An online softmax tracks each row's largest raw score, which is its largest scaled score
    only for a positive scale (FlashAttention's kernels as ours)."""
    if call.scale <= 0:
        return f"scale {call.scale} <= 0: the online softmax needs a positive scale"
    return None


def program_refusal(call: Any) -> str | None:
    """What no TileLang attention program takes: other dtypes, other head dims, scales <= 0."""
    if call.dtype not in HALF:
        return f"{call.dtype} is not served (float16 and bfloat16 only); the reference serves it"
    if call.head_dim != call.v_dim or call.head_dim not in HEAD_DIMS:
        return (
            f"head dims {call.head_dim} and {call.v_dim} are not served (one head dim of "
            f"{' or '.join(map(str, HEAD_DIMS))})"
        )
    return scale_refusal(call)


def decode_region(call: Any) -> str | None:
    """The decode kernel packs a kv head's query rows into one tile of at most DECODE_ROWS."""
    rows = decode_rows(call)
    if rows > DECODE_ROWS:
        return (
            f"{rows} query rows per kv head (heads per kv head x q_len) exceed the decode tile "
            f"of {DECODE_ROWS}"
        )
    return None


class _TileLang(Kernel):
    """Base: refusals, identity (arch, dtype, heads, dims, mask, scale, plan) and compiling."""

    features: ClassVar[str] = ""  # "a": sm_90a (wgmma, TMA lowering)
    pass_configs: ClassVar[dict[str, Any] | None] = MMA_SYNC_ONLY

    @classmethod
    def refusal(cls, call: Any) -> str | None:
        return program_refusal(call) or cls.region_refusal(call)

    @classmethod
    def region_refusal(cls, call: Any) -> str | None:
        return None

    @classmethod
    def plan(cls, call: Any) -> Hashable:
        raise NotImplementedError

    @classmethod
    def programs(cls, call: Any, plan: Any) -> list[Any]:
        """The prim_func factories of the entry, in launch order."""
        raise NotImplementedError

    @classmethod
    def entry_for(cls, call: Any) -> tuple[Hashable, Build]:
        plan = cls.plan(call)
        q_len = call.q_len if cls.q_len_baked else None
        shape = (DTYPE_NAMES[call.dtype], call.heads, call.kv_heads, q_len, call.head_dim)
        identity = (call.arch, *shape, call.causal, call.window, call.scale, plan)

        def build() -> _TileLang:
            name = f"{cls.__name__}{identity}"
            options = {"features": cls.features, "pass_configs": cls.pass_configs}
            programs = cls.programs(call, plan)
            compiled = [
                build_program(f"{name}/{i}", p, call.arch, **options)
                for i, p in enumerate(programs)
            ]
            return cls(plan, compiled)

        return identity, build

    q_len_baked: ClassVar[bool] = False  # whether q_len shapes the program

    def __init__(self, plan: Any, compiled: list[Any]) -> None:
        self.plan_, self.compiled = plan, compiled
        self.launches = [Launch(program) for program in compiled]


class FlashForward(_TileLang):
    """The forward (`fwd_program`, or `fwd_ws_program` where the plan overlaps): q_len, kv_len
    and batch symbolic."""

    @classmethod
    def plan(cls, call: Any) -> Hashable:
        return fwd_plan(call, tma=cls.features == "a")

    @classmethod
    def programs(cls, call: Any, plan: Any) -> list[Any]:
        program = fwd_ws_program if plan.overlap else fwd_program
        if plan.workers:
            program = fwd_persistent_program
        return [lambda: program(call, plan)]

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        q, k, v = aligned(q), aligned(k), aligned(v)
        out = torch.empty_like(q)
        lse = q.new_empty(*q.shape[:-1], dtype=torch.float32)  # ints: a Size parses slower
        self.launches[0].entry(q, k, v, out, lse)
        return out, lse


class FlashBackward(_TileLang):
    """The backward (`bwd_program`): dK and dV per key block, dQ added by float32 atomics and
    scaled and rounded here; delta = rowsum(dO * O) computed here. q_len, kv_len and batch
    symbolic. `mask`: the call's (causal, scale, window), AttentionFwdOp's params."""

    mask: tuple[bool, float, int | None]

    @classmethod
    def plan(cls, call: Any) -> Hashable:
        return bwd_plan(call)

    @classmethod
    def entry_for(cls, call: Any) -> tuple[Hashable, Build]:
        identity, build = super().entry_for(call)

        def built() -> FlashBackward:
            kernel = build()
            kernel.mask = (call.causal, call.scale, call.window)
            return kernel

        return identity, built

    @classmethod
    def programs(cls, call: Any, plan: Any) -> list[Any]:
        return [lambda: bwd_program(call, plan)]

    def backward(
        self, grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        q, k, v, grad_out = aligned(q), aligned(k), aligned(v), aligned(grad_out)
        delta = (grad_out.float() * out.float()).sum(-1)
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        self.launches[0](q, k, v, grad_out, aligned(lse), delta, dq, dk, dv)
        return dq.mul_(self.mask[1]).to(q.dtype), dk, dv


class SplitDecode(_TileLang):
    """Split-KV decode (`decode_program`): the slices' partials, then their combination. q_len
    is baked in (it shapes the row tile); batch and the cache length are symbolic."""

    q_len_baked = True
    per_sequence: ClassVar[bool] = False  # lengths per sequence (a tensor), else the cache's

    @classmethod
    def plan(cls, call: Any) -> Hashable:
        return decode_plan(call, call.batch, call.kv_heads)

    @classmethod
    def programs(cls, call: Any, plan: Any) -> list[Any]:
        per_sequence = cls.per_sequence
        return [
            lambda: split_program(call, plan, per_sequence, plan.block_size),
            lambda: combine_program(call, plan),
        ]

    def __init__(self, plan: Any, compiled: list[Any]) -> None:
        super().__init__(plan, compiled)
        self._scratch: dict[tuple, tuple[Tensor, Tensor]] = {}

    def decode(
        self, q: Tensor, k: Tensor, v: Tensor, lens: Tensor | None, table: Tensor | None = None
    ) -> tuple:
        q, k, v = aligned(q), aligned(k), aligned(v)
        o_part, lse_part = self._partials(q)
        slices = self.launches[0].entry
        if lens is None:
            slices(q, k, v, o_part, lse_part)
        elif table is None:
            slices(q, k, v, lens, o_part, lse_part)
        else:
            slices(q, k, v, lens, table, o_part, lse_part)
        out = torch.empty_like(q)  # head_dim == v_dim: out has q's shape
        lse = q.new_empty(*q.shape[:-1], dtype=torch.float32)  # ints: a Size parses slower
        self.launches[1].entry(o_part, lse_part, out, lse)
        return out, lse

    def _partials(self, q: Tensor) -> tuple[Tensor, Tensor]:
        """The slices' float32 partials, reused from call to call per (stream, batch): on one
        stream a call's combine has read them before the next call's slices write them. At
        most PARTIAL_SETS sets are kept (an engine's batch sizes vary). A call captured into
        a CUDA graph gets fresh ones, from the graph's own memory: a set the graph kept would
        be written by its replays after this cache let it go."""
        if _capturing():
            return self._new_partials(q)
        key = (q.device.index, current_raw_stream(q.device), q.shape[0])
        found = self._scratch.get(key)
        if found is None:
            if len(self._scratch) >= PARTIAL_SETS:
                self._scratch.pop(next(iter(self._scratch)))
            found = self._scratch[key] = self._new_partials(q)
        return found

    def _new_partials(self, q: Tensor) -> tuple[Tensor, Tensor]:
        batch, heads, q_len, dim = q.shape
        o_part = q.new_empty((batch, heads * q_len, self.plan_.splits, dim), dtype=torch.float32)
        return o_part, q.new_empty(o_part.shape[:-1], dtype=torch.float32)
