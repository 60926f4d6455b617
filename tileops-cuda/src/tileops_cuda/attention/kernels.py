"""Attention kernels: torch's SDPA backends (vendor) and TileLang's, on the "attention"
interface of AttentionFwdOp, the "attention_bwd" interface of AttentionBwdOp, the
"attention_decode" and "attention_paged_decode" interfaces of AttentionDecodeOp, and
FlashAttention's varlen entry points on AttentionVarlenFwdOp and AttentionVarlenBwdOp.

| key                     | archs     | serves                                    | preferred over |
|-------------------------|-----------|-------------------------------------------|----------------|
| sdpa_cudnn              | sm_80..90 | 16-bit; head dims <= 128, multiples of 8; | sdpa_flash,    |
|                         |           | kv_len > 1; causal where q_len == kv_len; | sdpa_efficient |
|                         |           | no decode (the decode region)             |                |
| sdpa_flash              | sm_80..90 | 16-bit; head_dim = v_dim <= 256, multiple | sdpa_efficient |
|                         |           | of 8; causal where q_len <= kv_len        |                |
| sdpa_efficient          | sm_80..90 | 16-bit, float32; head dims multiples of 8 |                |
|                         |           | (4); causal where q_len == kv_len; no     |                |
|                         |           | grouped-query decode (q_len == 1)         |                |
| tilelang_flash_fwd      | sm_80..89 | 16-bit; head_dim = v_dim in {64, 128};    |                |
| tilelang_flash_fwd_sm90 | sm_90     | every mask; outside the decode region     |                |
| tilelang_flash_decode   | sm_80..90 | as the forward, in the decode region (a   | sdpa_flash,    |
|                         |           | kv head's query rows fit the decode tile) | sdpa_efficient |
| tilelang_paged_decode   | sm_80..90 | as the decode, over a paged cache: blocks |                |
|                         |           | of a power of two >= 8 slots              |                |
| sdpa_flash (varlen)     | sm_80..90 | packed sequences: 16-bit; head_dim =      |                |
|                         |           | v_dim <= 256, multiple of 8; windows      |                |

No SDPA kernel takes a sliding window. Every SDPA kernel is preferred over the TileLang
forwards; the backward interface has the three SDPA kernels alone, in the same order.
AttentionDecodeOp's "tilelang_flash_decode" (contiguous cache) and "tilelang_paged_decode" have
no vendor kernel beside them; the varlen ops have FlashAttention alone (TUNING.md#varlen).

cuDNN over FlashAttention 2 over the memory-efficient kernel is the H200's measured order
(TUNING.md#vendor-order). The TileLang forwards lose to every vendor kernel that serves a call:
none has been measured faster yet (TUNING.md#tilelang-unmeasured), so they serve what no vendor
does (sliding windows, causal calls with q_len != kv_len on cuDNN's side) and what a pin or an
operator preference gives them. Decode is the TileLang split-KV kernel's: faster than
FlashAttention at every decode shape measured, and cuDNN plans anew for every key length
(TUNING.md#cudnn-decode).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Hashable
from typing import Any, ClassVar

import torch

from tileops import AttentionFwdOp, Kernel
from tileops.backend import Build
from tileops.ops import (
    AttentionBwdInterface,
    AttentionCall,
    AttentionDecodeInterface,
    AttentionInterface,
    AttentionPagedDecodeInterface,
    AttentionVarlenBwdInterface,
    AttentionVarlenCall,
    AttentionVarlenInterface,
)

from .._common.arith import AMPERE_AND_LATER
from . import sdpa
from .base import FlashBackward, FlashForward, SplitDecode, decode_region, scale_refusal
from .plans import DECODE_BLOCK_N, DECODE_ROWS

HALF = (torch.float16, torch.bfloat16)
Tensor = torch.Tensor
TILELANG_FORWARD_KEYS = frozenset({"tilelang_flash_fwd", "tilelang_flash_fwd_sm90"})
"""The TileLang forwards: every vendor kernel is preferred over them (TUNING.md#fwd-overlap)."""
TILELANG_KEYS = frozenset({*TILELANG_FORWARD_KEYS, "tilelang_flash_decode"})
CUDNN_MAX_DIM = 128
"""cuDNN's SDPA serves head dims up to 128 in the torch builds we run (256 needs cuDNN 9.22
on sm_90, torch's own check)."""
FLASH_MAX_DIM = 256
CUDNN_MAX_BATCH_HEADS = 65535


def dtype_refusal(call: Any, dtypes: tuple[torch.dtype, ...]) -> str | None:
    if call.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        return f"{call.dtype} is not served ({names} only); the reference serves it"
    return None


def shared_refusal(call: AttentionCall, dtypes: tuple[torch.dtype, ...]) -> str | None:
    """What no SDPA backend serves: dtypes beyond `dtypes`, sliding windows, scales <= 0."""
    if call.window is not None:
        return "torch's SDPA kernels take no sliding window"
    return dtype_refusal(call, dtypes) or scale_refusal(call)


def top_left_causal(call: AttentionCall) -> str | None:
    """cuDNN's and the memory-efficient kernel's causal mask aligns to the top left."""
    if call.causal and call.q_len != call.kv_len:
        return (
            f"its causal mask aligns to the top left, not to the bottom right as the interface's "
            f"(they differ where q_len={call.q_len} != kv_len={call.kv_len})"
        )
    return None


def dims_refusal(call: Any, multiple: int, limit: int | None) -> str | None:
    dims = {call.head_dim, call.v_dim}
    if any(d % multiple for d in dims) or (limit is not None and max(dims) > limit):
        most = f", at most {limit}" if limit else ""
        return (
            f"head dims {call.head_dim} and {call.v_dim} are not served (multiples of "
            f"{multiple}{most})"
        )
    return None


class _Sdpa(Kernel):
    """One SDPA backend (`backend`), its refusals shared by its forward and backward kernels."""

    backend: ClassVar[str]
    supported_archs = AMPERE_AND_LATER

    @classmethod
    def backend_refusal(cls, call: AttentionCall) -> str | None:
        raise NotImplementedError

    @classmethod
    def refusal(cls, call: AttentionCall) -> str | None:
        return cls.backend_refusal(call)

    @classmethod
    def entry_for(cls, call: AttentionCall) -> tuple[Hashable, Build]:
        identity = (call.causal, call.scale)
        return identity, lambda: cls(*identity)

    def __init__(self, causal: bool, scale: float) -> None:
        self.causal, self.scale = causal, scale


class _Cudnn(_Sdpa):
    """cuDNN's fused attention (torch's cuDNN SDPA backend)."""

    backend = "cudnn"
    deterministic = False  # torch refuses it under use_deterministic_algorithms

    @classmethod
    def backend_refusal(cls, call: AttentionCall) -> str | None:
        if call.kv_len == 1:
            return "cuDNN's SDPA does not take a key/value sequence of length 1"
        if max(call.batch, call.heads) > CUDNN_MAX_BATCH_HEADS:
            return f"cuDNN's SDPA takes batch and heads up to {CUDNN_MAX_BATCH_HEADS}"
        return (
            shared_refusal(call, HALF)
            or dims_refusal(call, 8, CUDNN_MAX_DIM)
            or top_left_causal(call)
        )


def flash_dims_refusal(call: Any) -> str | None:
    if call.head_dim != call.v_dim:
        return (
            f"FlashAttention takes one head dim for q, k and v, not {call.head_dim} and "
            f"{call.v_dim}"
        )
    return dims_refusal(call, 8, FLASH_MAX_DIM)


def flash_backward_refusal(call: Any) -> str | None:
    if call.arch in (86, 89) and 192 < call.head_dim <= 224:
        return "FlashAttention's backward has no kernel for head dims in (192, 224] on sm_86/89"
    return None


class _Flash(_Sdpa):
    """FlashAttention 2 (torch's flash SDPA backend); grouped heads natively."""

    backend = "flash"

    @classmethod
    def backend_refusal(cls, call: AttentionCall) -> str | None:
        if call.causal and call.q_len > call.kv_len:
            return (
                f"q_len={call.q_len} > kv_len={call.kv_len}: the first rows see no key, for which "
                "FlashAttention's log-sum-exp is +inf where the interface's is -inf"
            )
        return shared_refusal(call, HALF) or flash_dims_refusal(call)


class _Efficient(_Sdpa):
    """The memory-efficient kernel (torch's efficient SDPA backend, from xFormers): one kv head
    per query head, so grouped kv heads are repeated first."""

    backend = "efficient"

    @classmethod
    def backend_refusal(cls, call: AttentionCall) -> str | None:
        if call.heads != call.kv_heads and call.q_len == 1:
            return (
                "grouped-query decode: it takes one kv head per query head, and repeating the "
                "kv heads would copy the whole cache for one query row"
            )
        multiple = 4 if call.dtype == torch.float32 else 8
        return (
            shared_refusal(call, (*HALF, torch.float32))
            or dims_refusal(call, multiple, None)
            or top_left_causal(call)
        )


class _SdpaForward(AttentionInterface):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple:
        return sdpa.forward(self.backend, q, k, v, self.causal, self.scale)


class _SdpaBackward(AttentionBwdInterface):
    def forward(self, grad_out, q, k, v, out, lse) -> tuple:
        saved = None if out is None else (out, lse)
        return sdpa.backward(self.backend, grad_out, q, k, v, saved, self.causal, self.scale)


class SdpaCudnn(_Cudnn, _SdpaForward):
    preferred_over = frozenset({"sdpa_flash", "sdpa_efficient", *TILELANG_FORWARD_KEYS})

    @classmethod
    def backend_refusal(cls, call: AttentionCall) -> str | None:
        if decode_region(call) is None:
            return (
                "cuDNN builds an execution plan for every new key length (tens of ms, "
                "TUNING.md#cudnn-decode), and a decode loop's cache grows a key a step: "
                "tilelang_flash_decode serves decode"
            )
        return super().backend_refusal(call)


class SdpaFlash(_Flash, _SdpaForward):
    preferred_over = frozenset({"sdpa_efficient", *TILELANG_FORWARD_KEYS})


class SdpaEfficient(_Efficient, _SdpaForward):
    preferred_over = TILELANG_FORWARD_KEYS


class SdpaCudnnBackward(_Cudnn, _SdpaBackward):
    """cuDNN's backward, from the forward's out and lse where given (whichever kernel served
    the forward: the interface fixes what they hold), else after its own forward."""

    preferred_over = frozenset({"sdpa_flash", "sdpa_efficient", "tilelang_flash_bwd"})


class SdpaFlashBackward(_Flash, _SdpaBackward):
    """FlashAttention 2's backward, after its forward recomputed for the state it takes."""

    preferred_over = frozenset({"sdpa_efficient", "tilelang_flash_bwd"})

    @classmethod
    def backend_refusal(cls, call: AttentionCall) -> str | None:
        return flash_backward_refusal(call) or super().backend_refusal(call)


class SdpaEfficientBackward(_Efficient, _SdpaBackward):
    """The memory-efficient kernel's backward on repeated kv heads, summed back per group."""


class _FlashVarlen(Kernel):
    """FlashAttention 2's varlen entry points (`sdpa.flash_varlen_forward`): grouped heads and
    sliding windows natively, each sequence's causal mask aligned to its bottom right."""

    supported_archs = AMPERE_AND_LATER

    @classmethod
    def refusal(cls, call: AttentionVarlenCall) -> str | None:
        return dtype_refusal(call, HALF) or scale_refusal(call) or flash_dims_refusal(call)

    @classmethod
    def entry_for(cls, call: AttentionVarlenCall) -> tuple[Hashable, Build]:
        identity = (call.causal, call.scale, call.window)
        return identity, lambda: cls(*identity)

    def __init__(self, causal: bool, scale: float, window: int | None) -> None:
        self.causal, self.scale, self.window = causal, scale, window


class SdpaFlashVarlen(_FlashVarlen, AttentionVarlenInterface):
    def forward(self, q, k, v, cu_seqlens_q, cu_seqlens_k) -> tuple[Tensor, Tensor]:
        mask = self.causal, self.scale, self.window
        return sdpa.flash_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, *mask)


class SdpaFlashVarlenBackward(_FlashVarlen, AttentionVarlenBwdInterface):
    """FlashAttention 2's varlen backward, from the forward's out and lse where given."""

    @classmethod
    def refusal(cls, call: AttentionVarlenCall) -> str | None:
        return flash_backward_refusal(call) or super().refusal(call)

    def forward(self, grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse) -> tuple:
        saved = None if out is None else (out, lse)
        mask = self.causal, self.scale, self.window
        return sdpa.flash_varlen_backward(
            grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, saved, *mask
        )


# -- TileLang --------------------------------------------------------------------------------


def forward_region(call: AttentionCall) -> str | None:
    if decode_region(call) is None:
        return (
            f"the query rows per kv head fit the decode tile ({DECODE_ROWS}): "
            "tilelang_flash_decode serves it"
        )
    return None


class TileLangFlashFwd(FlashForward, AttentionInterface):
    """FlashAttention 2 on sm_80..89: mma.sync fed by cp.async, 128 query rows per block."""

    supported_archs = frozenset({80, 86, 89})

    @classmethod
    def region_refusal(cls, call: AttentionCall) -> str | None:
        return forward_region(call)


class TileLangFlashFwdSm90(FlashForward, AttentionInterface):
    """FlashAttention 3's manner on sm_90a (`fwd_ws_program`): a TMA producer warpgroup, two
    consumer warpgroups overlapping the softmax with asynchronous wgmma."""

    supported_archs = frozenset({90})
    features = "a"
    pass_configs = None

    @classmethod
    def region_refusal(cls, call: AttentionCall) -> str | None:
        return forward_region(call)


class TileLangFlashBwd(FlashBackward, AttentionBwdInterface):
    """FlashAttention 2's backward on sm_80 .. sm_90 (mma.sync fed by cp.async), from the
    forward's out and lse: sliding windows and the calls torch's kernels refuse; slower than
    cuDNN's and FlashAttention's backward, faster than the memory-efficient one
    (TUNING.md#bwd-tiles)."""

    supported_archs = AMPERE_AND_LATER
    deterministic = False  # dQ summed by float32 atomics, in no fixed order
    preferred_over = frozenset({"sdpa_efficient"})

    def forward(self, grad_out, q, k, v, out, lse) -> tuple:
        if out is None or lse is None:  # out modified in place since: the forward once more
            with torch.no_grad():
                out, lse = self.forward_op(q, k, v)
        return self.backward(grad_out, q, k, v, out, lse)

    @functools.cached_property
    def forward_op(self) -> AttentionFwdOp:
        """The op recomputing out and lse, built once per kernel (an op is not free to build)."""
        return AttentionFwdOp(*self.mask)


class TileLangFlashDecode(SplitDecode, AttentionInterface):
    """Split-KV decode over k and v of one length (transformers' caches): faster than
    FlashAttention at every decode shape measured, and no plan per length as cuDNN's
    (TUNING.md#cudnn-decode)."""

    supported_archs = AMPERE_AND_LATER
    preferred_over = frozenset({"sdpa_flash", "sdpa_efficient"})

    @classmethod
    def region_refusal(cls, call: AttentionCall) -> str | None:
        return decode_region(call)

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return self.decode(q, k, v, None)


class TileLangCacheDecode(SplitDecode, AttentionDecodeInterface):
    """Split-KV decode over a contiguous cache, each sequence its own length."""

    supported_archs = AMPERE_AND_LATER
    per_sequence = True

    @classmethod
    def region_refusal(cls, call: Any) -> str | None:
        return decode_region(call)

    def forward(
        self, q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor
    ) -> tuple[Tensor, Tensor]:
        return self.decode(q, k_cache, v_cache, cache_seqlens)


MIN_BLOCK_SIZE = 8
"""The fewest slots per block the paged decode reads block by block (16-byte rows, at least
one per thread of a copy); smaller blocks go to the reference."""


def paged_refusal(call: Any) -> str | None:
    """A key tile lies within one block, or holds whole blocks: block sizes are powers of two
    from MIN_BLOCK_SIZE (the tile is DECODE_BLOCK_N keys)."""
    size = call.block_size
    if size < MIN_BLOCK_SIZE or size & (size - 1):
        return (
            f"block_size {size} is not served (a power of two, at least {MIN_BLOCK_SIZE}: a "
            f"tile of {DECODE_BLOCK_N} keys lies within a block or holds whole ones)"
        )
    return None


class TileLangPagedDecode(SplitDecode, AttentionPagedDecodeInterface):
    """Split-KV decode over a paged cache: each tile of keys and values loaded through the
    block table, one block's slice or whole blocks at a time."""

    supported_archs = AMPERE_AND_LATER
    per_sequence = True

    @classmethod
    def region_refusal(cls, call: Any) -> str | None:
        return decode_region(call) or paged_refusal(call)

    @classmethod
    def plan(cls, call: Any) -> Hashable:
        return dataclasses.replace(super().plan(call), block_size=call.block_size)

    def forward(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        cache_seqlens: Tensor,
        block_table: Tensor,
    ) -> tuple[Tensor, Tensor]:
        return self.decode(q, k_cache, v_cache, cache_seqlens, block_table)
