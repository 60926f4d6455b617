"""An op called with ever-new shapes keeps a flat memory footprint; a hit stays one lookup."""

from __future__ import annotations

import gc
import logging
import tracemalloc

import torch
from dispatch_kit import INTERFACE, call, kernel, make_op

import tileops.table
from tileops import GemmOp, SoftmaxFwdOp
from tileops.backend import register_detector, register_kernel_builder
from tileops.table import ENTRY_LIMIT, FALLBACK_WARNINGS, FALLBACK_WINDOW, HIT_LIMIT


def test_memory_stays_flat_over_100000_distinct_gemm_shapes():
    op = GemmOp()
    b = torch.ones(1, 1)
    tracemalloc.start()
    try:
        for m in range(1, 50_001):
            op(torch.empty(m, 1), b)
        gc.collect()
        halfway, _ = tracemalloc.get_traced_memory()
        for m in range(50_001, 100_001):
            op(torch.empty(m, 1), b)
        gc.collect()
        end, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert end - halfway < 512 * 1024, f"grew {(end - halfway) / 2**20:.1f} MiB"
    assert len(op._table.hits) <= HIT_LIMIT and len(op._table.keys) <= HIT_LIMIT
    assert len(tileops.table.shared_entries(GemmOp).entries) <= ENTRY_LIMIT


def test_a_recent_call_is_still_a_hit_after_eviction():
    op = GemmOp()
    b = torch.ones(1, 1)
    for m in range(1, HIT_LIMIT + 10):
        op(torch.empty(m, 1), b)
    hits = op._table.hits
    latest = [key for key in hits][-1]
    assert latest[1].m == HIT_LIMIT + 9 and hits.get(latest) is not None


def test_the_target_kernel_cache_is_bounded(tileops_registry):
    builds = []

    def build(x, *, dim):
        builds.append(x.shape)
        return lambda x, *, out: out.copy_(torch.softmax(x, dim))

    register_detector(target="bounded", detect=lambda device: False)
    register_kernel_builder(op=SoftmaxFwdOp, target="bounded", build_kernel=build)
    op = SoftmaxFwdOp(target="bounded")
    for n in range(1, HIT_LIMIT + 100):
        op(torch.empty(1, n))
    assert len(op._target_kernels) <= HIT_LIMIT and len(builds) == HIT_LIMIT + 99


def test_fallback_warnings_are_bounded_and_rate_limited(sm80, caplog, monkeypatch):
    """Every spec falls back: what the table remembers of them stays bounded, and the log says
    a few per window, then that it stops; the next window starts with how many it left out."""
    now = [1000.0]
    monkeypatch.setattr(tileops.table, "_now", lambda: now[0])
    op = make_op(
        {
            "special": kernel("special", refuse=lambda c: "refuses all"),
            "fallback": kernel("fallback", general=True),
        },
        name="AlwaysFallbackOp",
    )()
    with caplog.at_level(logging.WARNING, logger="tileops.dispatch"):
        for n in range(2 * HIT_LIMIT):
            op.kernel_for(INTERFACE, call(n=n))
        assert len(op._table.fallbacks_seen) <= HIT_LIMIT
        messages = [r.getMessage() for r in caplog.records]
        assert len(messages) == FALLBACK_WARNINGS + 1
        assert all("only the general fallback 'fallback' serves" in m for m in messages[:-1])
        assert messages[-1] == (
            f"{op.op_name}: {FALLBACK_WARNINGS} calls served only by the general fallback were "
            f"logged in {FALLBACK_WINDOW:.0f} s; further ones in that time are counted, not "
            "logged (tileops explain shows a call's refusals; TILEOPS_STRICT=1 makes them raise)"
        )
        caplog.clear()
        now[0] += FALLBACK_WINDOW
        op.kernel_for(INTERFACE, call(n=-1))
    skipped = 2 * HIT_LIMIT - FALLBACK_WARNINGS
    first, second = [r.getMessage() for r in caplog.records]
    assert first == (
        f"{op.op_name}: {skipped} more calls served only by the general fallback were not logged"
    )
    assert "n=-1" in second
