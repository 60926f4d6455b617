"""Compiling a sweep's kernels before it times them: in parallel, into TileLang's disk cache, so
the timed process loads each one instead of compiling it in turn."""

from __future__ import annotations

import functools
import multiprocessing
from collections.abc import Callable
from typing import Any

WORKERS = 14
"""Build processes at most: the GPU machine's cores, less two for the parent and the system."""


def prebuild(build: Callable[..., Any], jobs: list[tuple]) -> None:
    """`build(*job)` for each job in a pool of spawned processes (`build` a module-level
    function, so the workers can import it); a job that fails prints why, and fails again
    where the sweep times it."""
    if jobs:
        with multiprocessing.get_context("spawn").Pool(min(WORKERS, len(jobs))) as pool:
            pool.map(functools.partial(_build_one, build), jobs)


def _build_one(build: Callable[..., Any], job: tuple) -> None:
    try:
        build(*job)
    except Exception as error:  # reported again, per row, when timed
        print(f"{job}: {type(error).__name__}: {error}", flush=True)


def built(kernel_type: Any, call: Any) -> Any:
    """The kernel `kernel_type` builds for `call` (a variant a sweep declares by subclassing a
    kernel); ValueError with its reason where it refuses the call."""
    refusal = kernel_type.refusal(call)
    if refusal:
        raise ValueError(refusal)
    return kernel_type.entry_for(call)[1]()


def variant_contenders(
    specs: list[str], build: Callable[[str], Any], run: Callable[[Any], Any]
) -> dict[str, Callable[[], Any] | Exception]:
    """ "tilelang <spec>": a call running the kernel `build(spec)` gives (`run(kernel)`), or the
    error that kept it from building (`timing.checked_runs` makes that its row)."""
    found: dict[str, Callable[[], Any] | Exception] = {}
    for spec in specs:
        try:
            kernel = build(spec)
        except Exception as error:
            found[f"tilelang {spec}"] = error
            continue
        found[f"tilelang {spec}"] = lambda kernel=kernel: run(kernel)
    return found
