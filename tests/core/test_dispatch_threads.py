"""Thread safety: concurrent misses on one call build once; hits take no lock; a simulation in
one thread never reaches another thread's selections."""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from dispatch_kit import INTERFACE, call, kernel, make_op

import tileops.device
import tileops.scope
import tileops.table
from tileops.plugins import LOADER
from tileops.registry import REGISTRY
from tileops.testing import simulate_device

THREADS = 16


def race(function, args_list):
    """Run `function(*args)` for every args in `args_list`, all released at once by a barrier,
    each in a copy of the caller's context (so a simulation around the race is in force)."""
    barrier = threading.Barrier(len(args_list))
    contexts = [contextvars.copy_context() for _ in args_list]

    def run(context, args):
        barrier.wait()
        return context.run(function, *args)

    with ThreadPoolExecutor(len(args_list)) as pool:
        return list(pool.map(run, contexts, args_list))


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


@pytest.mark.parametrize("simulated", [False, True], ids=["plain", "in-a-simulation"])
def test_hits_take_no_lock(simulated):
    k = kernel("k", devices={"cpu", "cuda"})
    op_cls = make_op({"k": k})
    op = op_cls()
    with contextlib.ExitStack() as context:
        if simulated:
            context.enter_context(simulate_device("cuda:0", arch=80, sm_count=108))
        spec = call("cuda:0" if simulated else "cpu")
        entry = op.kernel_for(INTERFACE, spec)
        worker_context = contextvars.copy_context()  # the simulation, if any, goes along
        _hits_while_locks_are_held(op_cls, op, spec, worker_context, entry)
    assert k.counts["entry_for"] == 1  # every call after the first was a hit


def _hits_while_locks_are_held(op_cls, op, spec, worker_context, entry) -> None:
    locks = [
        tileops.table.shared_entries(op_cls).lock,
        *tileops.table.shared_entries(op_cls).locks.values(),
        tileops.table._table_lock,
        tileops.device._lock,
        tileops.scope.SCOPES.lock,
        REGISTRY.lock,
        LOADER._lock,
    ]
    got = []
    with contextlib.ExitStack() as held:
        for lock in locks:
            held.enter_context(lock)
        worker = threading.Thread(
            target=worker_context.run,
            args=(lambda: got.extend(op.kernel_for(INTERFACE, spec) for _ in range(100)),),
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


def test_a_simulation_in_one_thread_never_reaches_another_threads_selections():
    """Two threads simulate cuda:0 as different boards and call one op instance: each gets
    the kernel for its own board, on misses and on hits, whichever selected first."""
    op = make_op(
        {
            "ampere": kernel("ampere", supported_archs={80}),
            "hopper": kernel("hopper", supported_archs={90}),
        }
    )()
    both_inside = threading.Barrier(2)

    def simulated(arch):
        with simulate_device("cuda:0", arch=arch, sm_count=1):
            both_inside.wait(5)
            served = []
            for _ in range(50):
                served.append(op.kernel_for(INTERFACE, call())(1))
                served.append(op.key_for(INTERFACE, call()))
            both_inside.wait(5)
            return set(served)

    assert race(simulated, [(80,), (90,)]) == [{"ampere"}, {"hopper"}]


def test_a_simulations_selections_are_dropped_when_it_ends():
    op = make_op({"k": kernel("k")})()
    with simulate_device("cuda:0", arch=90, sm_count=1):
        entry = op.kernel_for(INTERFACE, call())
        assert op.kernel_for(INTERFACE, call()) is entry  # a hit inside
        assert (INTERFACE, call()) not in op._table.hits  # never in the plain cache
    assert not op._table.scoped and isinstance(op._hits, dict)
