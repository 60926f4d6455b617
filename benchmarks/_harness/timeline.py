"""Where the GPU waited on the host: the gaps of a profiled step's kernel timeline.

From a torch.profiler chrome trace (`export_chrome_trace`): the GPU's busy time, its idle
time inside the step, the part of that idle time it spent starved (the next kernel was
launched only after the previous one had ended, so the host was the bottleneck), and, from a
trace recorded `with_stack=True`, the Python functions that were running while it starved.
"""

from __future__ import annotations

import bisect
import collections
import json
from pathlib import Path
from typing import Any

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
SUMMARY = ("gpu_busy_us", "gpu_idle_us", "starved_us", "span_us")


def _events(trace: Path) -> list[dict[str, Any]]:
    data = json.loads(Path(trace).read_text())
    found = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in found if e.get("ph") == "X" and "dur" in e]


def starved_gaps(events: list[dict[str, Any]]) -> tuple[list[tuple[float, float]], dict]:
    """The intervals (us) in which the GPU idled waiting for a launch, and the summary:
    GPU busy, idle and starved microseconds, and the step's span on the GPU."""
    launches = {
        e["args"]["correlation"]: e["ts"]
        for e in events
        if e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {})
    }
    gpu = sorted(
        (e["ts"], e["ts"] + e["dur"], launches.get(e.get("args", {}).get("correlation")))
        for e in events
        if e.get("cat") in GPU_CATS
    )
    busy = idle = starved = 0.0
    gaps: list[tuple[float, float]] = []
    end = None
    for start, stop, launched in gpu:
        if end is not None and start > end:
            idle += start - end
            if launched is not None and launched > end:  # issued after the GPU ran dry
                gaps.append((end, start))
                starved += start - end
        if end is None or stop > end:
            busy += stop - max(start, end if end is not None else start)
            end = stop
    span = (gpu[-1][1] - gpu[0][0]) if gpu else 0.0
    return gaps, dict(zip(SUMMARY, (busy, idle, starved, span), strict=True))


def starved_by_function(events: list[dict[str, Any]], top: int) -> list[tuple[str, float]]:
    """Python functions by the starved time they were on a stack for (inclusive, any thread),
    largest first: where the host spent the time the GPU waited."""
    gaps, _ = starved_gaps(events)
    starts = [g[0] for g in gaps]
    totals: dict[str, float] = collections.defaultdict(float)
    for e in events:
        # C calls ("<built-in method ...>") are left out: the profiler's own context exit and
        # autograd's apply came out with durations spanning the whole trace
        if e.get("cat") != "python_function" or e["name"].startswith("<built-in"):
            continue
        a, b = e["ts"], e["ts"] + e["dur"]
        k = max(bisect.bisect_right(starts, a) - 1, 0)
        while k < len(gaps) and gaps[k][0] < b:
            lo, hi = max(a, gaps[k][0]), min(b, gaps[k][1])
            if hi > lo:
                totals[e["name"]] += hi - lo
            k += 1
    return sorted(totals.items(), key=lambda kv: -kv[1])[:top]


def summary(trace: Path) -> dict[str, float]:
    """`starved_gaps`' summary of one trace file."""
    return starved_gaps(_events(trace))[1]


def functions(trace: Path, top: int) -> list[tuple[str, float]]:
    """`starved_by_function` of one trace file recorded with stacks."""
    return starved_by_function(_events(trace), top)
