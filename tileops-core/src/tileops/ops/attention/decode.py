"""Attention over a KV cache (decode): a few query tokens per sequence, the last ones of each
sequence, over the keys and values the cache holds for it; the cache contiguous (one row of
slots per sequence) or paged (blocks of slots, a block table per sequence)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from ...backward import BackwardInterface, RecomputeBackward
from ...callspec import CallSpec
from ...errors import OpInputError
from ...kernel import KernelInterface
from ...op import Op
from ...samples import Case
from ...signature import BoundCall, Input, Signature
from .._common import ReferenceKernel
from ._base import PARAM_TYPES, AttentionParams, call_kernel, check_heads, no_keys
from ._math import attend, gather_pages
from .prefill import LSE, OUT, Q, decode_bucket

Tensor = torch.Tensor
INDEX_DTYPES = (torch.int32, torch.int64)


class AttentionDecodeCall(CallSpec):
    """One decode call over a contiguous cache of `capacity` slots per sequence, rounded up to
    a power of two: a cache that grows by a token per step (transformers' DynamicCache) keeps
    hitting the dispatch cache; kernels read the capacity off the cache."""

    batch: int
    heads: int
    kv_heads: int
    q_len: int
    capacity: int
    head_dim: int
    v_dim: int
    causal: bool
    scale: float
    dtype: torch.dtype
    window: int | None = None


class AttentionPagedDecodeCall(CallSpec):
    """One decode call over a paged cache of `num_blocks` blocks of `block_size` slots, each
    sequence's block table `max_blocks` long, rounded up to a power of two as the contiguous
    cache's capacity is."""

    batch: int
    heads: int
    kv_heads: int
    q_len: int
    num_blocks: int
    block_size: int
    max_blocks: int
    head_dim: int
    v_dim: int
    causal: bool
    scale: float
    dtype: torch.dtype
    window: int | None = None


class AttentionDecodeInterface(KernelInterface):
    """Interface "attention_decode": attention of each sequence's last q_len tokens over the
    first cache_seqlens[b] slots of its cache row.

    Layout contract: q (batch, heads, q_len, head_dim), k_cache (batch, kv_heads, capacity,
    head_dim), v_cache (batch, kv_heads, capacity, v_dim), contiguous, of the call's dtype;
    cache_seqlens a contiguous int32 (batch,) tensor of values in [0, capacity] (the keys of
    sequence b, its queries' own included: query i stands at position cache_seqlens[b] - q_len
    + i). Masks, heads and the returned (out, lse) as for the "attention" interface. Calls with
    batch * heads * q_len == 0 or capacity == 0 never reach a kernel.
    """

    call_spec = AttentionDecodeCall

    def forward(
        self, q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor
    ) -> tuple[Tensor, Tensor]:
        raise NotImplementedError


class AttentionPagedDecodeInterface(KernelInterface):
    """Interface "attention_paged_decode": as "attention_decode", over a paged cache.

    Layout contract: q as for "attention_decode"; k_cache (num_blocks, kv_heads, block_size,
    head_dim) and v_cache (num_blocks, kv_heads, block_size, v_dim), contiguous, of the call's
    dtype; block_table a contiguous int32 (batch, max_blocks) tensor: token t of sequence b is
    in block block_table[b, t // block_size], slot t % block_size; entries past a sequence's
    length may hold anything and must not be read. cache_seqlens as for "attention_decode", in
    [0, max_blocks * block_size]. Calls with batch * heads * q_len == 0 or max_blocks *
    block_size == 0 never reach a kernel.
    """

    call_spec = AttentionPagedDecodeCall

    def forward(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        cache_seqlens: Tensor,
        block_table: Tensor,
    ) -> tuple[Tensor, Tensor]:
        raise NotImplementedError


def attend_cache(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    lens: Tensor,
    table: Tensor | None,
    options: dict[str, Any],
) -> tuple[Tensor, Tensor]:
    """`_math.attend` over each sequence's first lens[b] keys, paged caches gathered into
    contiguous rows first (`_math.gather_pages`); `options`: scale, causal and window."""
    k, v = k_cache, v_cache
    if table is not None:
        k, v = gather_pages(k_cache, table, lens), gather_pages(v_cache, table, lens)
    return attend(q, k, v, kv_lens=lens, **options)


class _DecodeReference(ReferenceKernel):
    build_fields = ("scale", "causal", "window")

    def __init__(self, scale: float, causal: bool, window: int | None) -> None:
        self.options = {"scale": scale, "causal": causal, "window": window}


class AttentionDecodeReference(_DecodeReference, AttentionDecodeInterface):
    """The explicit masked softmax over each sequence's cache row (`_math.attend`)."""

    def forward(
        self, q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor
    ) -> tuple[Tensor, Tensor]:
        return attend_cache(q, k_cache, v_cache, cache_seqlens, None, self.options)


class AttentionPagedDecodeReference(_DecodeReference, AttentionPagedDecodeInterface):
    """The pages gathered into contiguous rows (`_math.gather_pages`), then as the contiguous
    cache's reference."""

    def forward(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        cache_seqlens: Tensor,
        block_table: Tensor,
    ) -> tuple[Tensor, Tensor]:
        return attend_cache(q, k_cache, v_cache, cache_seqlens, block_table, self.options)


class AttentionDecodeOp(AttentionParams, Op):
    """Attention of the last q_len tokens of each sequence over its KV cache, as
    `AttentionFwdOp` over the first cache_seqlens[b] keys of the sequence (the queries' own
    keys included: append them to the cache first), returning (out, lse).

    Contiguous cache: k_cache (batch, kv_heads, capacity, head_dim), v_cache (batch, kv_heads,
    capacity, v_dim). Paged cache (`block_table` given, (batch, max_blocks)): k_cache
    (num_blocks, kv_heads, block_size, head_dim), v_cache likewise; token t of sequence b in
    block block_table[b, t // block_size]. cache_seqlens and block_table are int32 or int64.
    Their values (lengths within the cache, used table entries naming blocks that exist) are
    checked on CPU tensors; on a GPU, as in every decode kernel, they are the caller's promise.
    """

    namespace = "tileops"
    interfaces = {
        "attention_decode": AttentionDecodeInterface,
        "attention_paged_decode": AttentionPagedDecodeInterface,
        "backward": BackwardInterface,
    }
    kernel_types = {
        "reference": AttentionDecodeReference,
        "reference_paged": AttentionPagedDecodeReference,
        "reference_backward": RecomputeBackward,
    }
    signature = Signature(
        (
            Q,
            Input("k_cache", ("cache_rows", "kv_heads", "cache_len", "head_dim"), dtypes=("q",)),
            Input("v_cache", ("cache_rows", "kv_heads", "cache_len", "v_dim"), dtypes=("q",)),
            Input("cache_seqlens", ("batch",), dtypes=INDEX_DTYPES, differentiable=False),
            Input(
                "block_table",
                ("batch", "max_blocks"),
                dtypes=INDEX_DTYPES,
                optional=True,
                differentiable=False,
            ),
        ),
        PARAM_TYPES,
        (OUT, LSE),
    )

    def check(self, call: BoundCall) -> None:
        q, k_cache, _, lens, table = call.tensors
        op = type(self).__name__
        check_heads(op, q.shape[1], k_cache.shape[1], q.shape[-1], "k_cache")
        if table is None and k_cache.shape[0] != q.shape[0]:
            raise OpInputError(
                f"{op}(): argument 'k_cache' holds {k_cache.shape[0]} sequences (dim 0), but "
                f"argument 'q' has batch {q.shape[0]}; without a block_table the cache holds "
                "one row per sequence"
            )
        if lens.device.type == "cpu":
            _check_values(op, k_cache, lens, table)

    def forward(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        cache_seqlens: Tensor,
        block_table: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        spec = self._spec(q, k_cache, v_cache, block_table)
        if spec is None:
            return no_keys(q, v_cache.shape[-1], q.shape[:-1])
        out_shape = (*q.shape[:-1], v_cache.shape[-1])
        tensors = _operands(q, k_cache, v_cache, cache_seqlens, block_table)
        return call_kernel(self, *spec, out_shape, *tensors)

    def lane_for(self, call: BoundCall) -> Callable[..., tuple[Tensor, Tensor]] | None:
        """The kernel that served this layout, for its later calls: a decode loop calls with
        one layout step after step (lengths and block table change values only)."""
        q, k_cache, v_cache, _, table = call.tensors
        spec = self._spec(q, k_cache, v_cache, table)
        kernel = None if spec is None else self._hits.get(spec)
        if kernel is None:
            return None

        def lane(*tensors: Tensor | None) -> tuple[Tensor, Tensor]:
            return kernel(*_operands(*tensors))

        return lane

    def _spec(
        self, q: Tensor, k_cache: Tensor, v_cache: Tensor, table: Tensor | None
    ) -> tuple[str, CallSpec] | None:
        """(interface, call spec) of a call; None where the cache holds no slot."""
        facts = self.call_facts(q, v_cache)
        if table is None:
            if k_cache.shape[2] == 0:
                return None
            capacity = decode_bucket(k_cache.shape[2])
            return "attention_decode", self.remembered(
                (*facts, capacity),
                lambda: AttentionDecodeCall(**self.call_fields(q, v_cache), capacity=capacity),
            )
        if k_cache.shape[2] * table.shape[1] == 0:
            return None
        blocks, size, max_blocks = k_cache.shape[0], k_cache.shape[2], decode_bucket(table.shape[1])
        paged = self.remembered(
            (*facts, blocks, size, max_blocks),
            lambda: AttentionPagedDecodeCall(
                **self.call_fields(q, v_cache), num_blocks=blocks, block_size=size,
                max_blocks=max_blocks,
            ),
        )  # fmt: skip
        return "attention_paged_decode", paged

    def reference_forward(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        cache_seqlens: Tensor,
        block_table: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        options = {
            "scale": self.scale_for(q.shape[-1]),
            "causal": self.causal,
            "window": self.window,
        }
        return attend_cache(q, k_cache, v_cache, cache_seqlens, block_table, options)

    @classmethod
    def sample_cases(cls) -> Iterable[Case]:
        generator = torch.Generator().manual_seed(0)

        def randn(*shape: int) -> Tensor:
            return torch.randn(shape, generator=generator)

        lens = torch.tensor([5, 37, 64], dtype=torch.int32)
        cache = randn(3, 2, 64, 32), randn(3, 2, 64, 32)
        yield Case({"causal": True}, (randn(3, 8, 1, 32), *cache, lens), "contiguous, GQA")
        yield Case({"causal": True}, (randn(3, 4, 4, 32), *cache, lens), "four queries")
        table = torch.tensor([[3, 0, 0, 0], [1, 5, 0, 2], [7, 6, 4, 2]], dtype=torch.int32)
        paged = randn(8, 2, 16, 32), randn(8, 2, 16, 32)
        params = {"causal": True, "window": 20}
        yield Case(params, (randn(3, 4, 2, 32), *paged, lens, table), "paged, sliding window")


def _int32(t: Tensor) -> Tensor:
    return t.to(torch.int32).contiguous()


def _operands(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, lens: Tensor, table: Tensor | None
) -> list[Tensor]:
    """The kernel's operands as the interfaces promise them: contiguous, indices int32."""
    tensors = [q.contiguous(), k_cache.contiguous(), v_cache.contiguous(), _int32(lens)]
    return tensors if table is None else [*tensors, _int32(table)]


def _check_values(op: str, k_cache: Tensor, lens: Tensor, table: Tensor | None) -> None:
    """Lengths within the cache and the used table entries naming blocks that exist."""
    slots = k_cache.shape[2] * (1 if table is None else table.shape[1])
    bad = (lens < 0) | (lens > slots)
    if bad.any():
        at = int(bad.nonzero()[0, 0])
        raise OpInputError(
            f"{op}(): argument 'cache_seqlens' holds {int(lens[at])} at sequence {at}; expected "
            f"lengths in [0, {slots}] (the slots the cache holds per sequence)"
        )
    if table is None:
        return
    used = torch.arange(table.shape[1]) * k_cache.shape[2] < lens[:, None].long()
    wrong = used & ((table < 0) | (table >= k_cache.shape[0]))
    if wrong.any():
        b, j = (int(i) for i in wrong.nonzero()[0])
        raise OpInputError(
            f"{op}(): argument 'block_table' names block {int(table[b, j])} at [{b}, {j}], a "
            f"block sequence {b} uses; expected block numbers in [0, {k_cache.shape[0]}) "
            "(the blocks of k_cache)"
        )
