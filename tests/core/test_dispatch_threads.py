"""Thread safety: concurrent misses on one call build once; hits take no lock."""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from dispatch_kit import INTERFACE, call, kernel, make_op

import tileops.device
import tileops.table
from tileops.backend.plugins import LOADER
from tileops.backend.registry import REGISTRY

THREADS = 16


def race(function, args_list):
    """Run `function(*args)` for every args in `args_list`, all released at once by a barrier."""
    barrier = threading.Barrier(len(args_list))

    def run(args):
        barrier.wait()
        return function(*args)

    with ThreadPoolExecutor(len(args_list)) as pool:
        return list(pool.map(run, args_list))


def test_concurrent_misses_on_one_call_build_once(sm80):
    k = kernel("k", on_build=lambda c: time.sleep(0.05))
    op = make_op({"k": k})()
    entries = race(op.kernel_for, [(INTERFACE, call())] * THREADS)
    assert all(entry is entries[0] for entry in entries)
    assert k.counts["build"] == 1


def test_concurrent_misses_of_many_instances_and_calls_sharing_an_identity_build_once(sm80):
    k = kernel("k", identity=lambda c: c.n % 2, on_build=lambda c: time.sleep(0.05))
    op_cls = make_op({"k": k})
    entries = race(lambda n: op_cls().kernel_for(INTERFACE, call(n=n)), [(n,) for n in range(16)])
    assert len({id(e) for e in entries}) == 2
    assert k.counts["build"] == 2


def test_hits_take_no_lock(sm80):
    op_cls = make_op({"k": kernel("k")})
    op = op_cls()
    entry = op.kernel_for(INTERFACE, call())
    locks = [
        op_cls._entries_lock,
        *op_cls._entry_locks.values(),
        tileops.table._table_lock,
        tileops.device._lock,
        REGISTRY.lock,
        LOADER._lock,
    ]
    got = []
    with contextlib.ExitStack() as held:
        for lock in locks:
            held.enter_context(lock)
        worker = threading.Thread(
            target=lambda: got.extend(op.kernel_for(INTERFACE, call()) for _ in range(100))
        )
        worker.start()
        worker.join(timeout=5)
        assert not worker.is_alive(), "a hit waited for a lock the dispatcher holds"
    assert len(got) == 100 and all(e is entry for e in got)


def test_a_hit_does_not_wait_for_a_slow_build_of_another_call(sm80):
    release = threading.Event()
    k = kernel(
        "k", identity=lambda c: c.n, on_build=lambda c: release.wait(5) if c.n == 2 else None
    )
    op = make_op({"k": k})()
    ready = op.kernel_for(INTERFACE, call(n=1))
    slow = threading.Thread(target=op.kernel_for, args=(INTERFACE, call(n=2)))
    slow.start()
    try:
        started = time.perf_counter()
        assert op.kernel_for(INTERFACE, call(n=1)) is ready
        assert time.perf_counter() - started < 1
    finally:
        release.set()
        slow.join()
