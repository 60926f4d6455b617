"""GPU timing: medians of `triton.testing.do_bench` (the L2 cleared per repetition), back-to-back
loops, CUDA-graph replays, GPU kernel times from the profiler, and host profiles (cProfile)."""

from __future__ import annotations

import contextlib
import cProfile
import io
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch


def bench(fn: Callable[[], Any], rounds: int) -> float:
    """Milliseconds: the best of `rounds` medians of do_bench (L2 cleared per repetition)."""
    from triton.testing import do_bench

    return min(do_bench(fn, return_mode="median") for _ in range(rounds))


class Forced(NamedTuple):
    """A contender run inside `context()` (an SDPA backend forced, a key pinned), entered around
    its whole timing rather than per call: the context's own host cost (tens of microseconds,
    as much as a decode call) is no part of the figure."""

    context: Callable[[], Any]
    fn: Callable[[], Any]


def call_once(contender: Callable[[], Any] | Forced) -> Any:
    """One call of a plain or forced contender (a forced one inside its context)."""
    if not isinstance(contender, Forced):
        return contender()
    with contender.context():
        return contender.fn()


def bench_all(contenders: dict[str, Callable[[], Any] | Forced], rounds: int) -> dict[str, float]:
    """Milliseconds per contender: the best of `rounds` medians, the rounds interleaved across
    contenders, so a transient slowdown (compile workers still busy after torch.compile's first
    call, clocks settling) cannot land on one contender's rounds only. A `Forced` contender's
    context is entered around its whole timing."""
    from triton.testing import do_bench

    best = dict.fromkeys(contenders, float("inf"))
    for _ in range(rounds):
        for name, fn in contenders.items():
            context, call = fn if isinstance(fn, Forced) else (contextlib.nullcontext, fn)
            with context():
                best[name] = min(best[name], do_bench(call, return_mode="median"))
    return best


def checked_runs(
    contenders: dict[str, Callable[[], Any] | Forced | Exception],
    want: torch.Tensor,
    measure: Callable[[Callable[[], Any]], Any],
) -> dict[str, tuple[float, Any] | str]:
    """Per contender, (its output's error relative to `want`, `measure(call)`), run without
    grad and inside a `Forced` one's context; or why it has no figure ("failed: ..."): the
    error given in place of its call (what kept it from building), or the one it raised."""
    results: dict[str, tuple[float, Any] | str] = {}
    for name, fn in contenders.items():
        if isinstance(fn, Exception):
            results[name] = failure_text(fn)
            continue
        context, call = fn if isinstance(fn, Forced) else (contextlib.nullcontext, fn)
        try:
            with context(), torch.no_grad():
                out = call()
                out = out[0] if isinstance(out, tuple) else out
                error = float((out.float() - want).norm() / want.norm())
                results[name] = (error, measure(call))
        except Exception as failure:  # a contender that cannot run or be measured is a row
            results[name] = failure_text(failure)
    return results


def failure_text(error: Exception) -> str:
    first = (str(error).splitlines() or [""])[0]
    return f"failed: {type(error).__name__}: {first[:100]}"


def loop_us(fn: Callable[[], Any], calls: int = 200) -> float:
    """Microseconds per call of `calls` back-to-back calls, L2 warm: whichever of the host's
    launch path and the GPU is slower, as in a model's layer loop."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def graphed(fn: Callable[[], Any]) -> Callable[[], Any]:
    """`fn` captured in a CUDA graph, its replay: the GPU's time without the host's launch
    path, as under CUDA graphs or torch.compile's reduce-overhead mode."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def kernel_us(fn: Callable[[], Any], calls: int = 30, clear: str = "write") -> float:
    """Median microseconds of GPU kernel time per call of `fn` (every kernel it launches), the
    L2 cleared before each call by writing (`clear` "write") or reading ("read") a 256 MB
    buffer; from torch.profiler's device-side durations."""
    per_call = _kernels_per_call(fn, calls, clear)
    return statistics.median(sum(e.time_range.elapsed_us() for e in call) for call in per_call)


def kernel_breakdown(fn: Callable[[], Any], calls: int = 30, clear: str = "read") -> list:
    """(name, median us) of each kernel one call of `fn` launches, in launch order."""
    per_call = _kernels_per_call(fn, calls, clear)
    return [
        (call_events[0].name, statistics.median(e.time_range.elapsed_us() for e in call_events))
        for call_events in zip(*per_call, strict=True)
    ]


def _kernels_per_call(fn: Callable[[], Any], calls: int, clear: str) -> list[list]:
    """Each call's device kernels in launch order, the L2 cleared before each call."""
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    clear_l2 = flush.zero_ if clear == "write" else lambda: flush.max()
    clearing = {e.name for e in _device_kernels(clear_l2, 1)}
    fn()
    torch.cuda.synchronize()
    kernels = [e for e in _device_kernels(fn, calls, clear_l2) if e.name not in clearing]
    if len(kernels) % calls:
        raise RuntimeError(f"{len(kernels)} kernels over {calls} calls: cannot split them")
    each = len(kernels) // calls
    ordered = sorted(kernels, key=lambda e: e.time_range.start)
    return [ordered[i : i + each] for i in range(0, len(ordered), each)]


def _device_kernels(fn: Callable[[], Any], calls: int, before: Callable[[], Any] | None = None):
    """The device kernels of `calls` calls of `fn`, each after `before` and a synchronize."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        for _ in range(calls):
            if before is not None:
                before()
                torch.cuda.synchronize()  # each call's kernels after its own clearing
            fn()
        torch.cuda.synchronize()
    return [e for e in trace.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def per_call_ns(fns: dict, device: str, number: int, repeats: int) -> dict[str, float]:
    """Median ns per call of each of `fns`, timed in turns (one loop of each per repeat), so
    drift in the machine's speed hits every variant alike."""
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for fn in fns.values():
        for _ in range(number // 10):
            fn()
    synchronize()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(number):
                fn()
            synchronize()
            times[name].append((time.perf_counter() - start) / number * 1e9)
    return {name: statistics.median(t) for name, t in times.items()}


def host_profile(fn: Callable[[], Any], calls: int, top: int, orders=("tottime",)) -> str:
    """cProfile of `calls` calls of `fn` (the device synchronised at the end): the `top`
    functions in each of `orders` ("tottime": own time, "cumulative")."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    profiler.disable()
    text = io.StringIO()
    for order in orders:
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(top)
    return relative_paths(text.getvalue().strip())


def relative_paths(text: str) -> str:
    """Source paths as the project and the packages name them: no folders of the machine (the
    project root and every import path, the longest first, are cut off)."""
    roots = {str(Path(__file__).resolve().parents[2]), *(p for p in sys.path if p)}
    for root in sorted(roots, key=len, reverse=True):
        text = text.replace(f"{root.rstrip('/')}/", "")
    return text
