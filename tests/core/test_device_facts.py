"""Device facts: read lazily from the call's own device index, and simulable."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import threading

from dispatch_kit import INTERFACE, call, kernel, make_op

import tileops.device
from tileops import DeviceFacts
from tileops.scope import SCOPES
from tileops.testing import simulate_device


def test_device_facts_hold_the_four_facts():
    names = [f.name for f in dataclasses.fields(DeviceFacts)]
    assert names == ["arch", "sm_count", "calibration", "smem_budget"]


def test_a_call_spec_reads_facts_of_a_simulated_device_only_when_asked():
    with simulate_device(
        "cuda:0", arch=90, sm_count=132, calibration="H100", smem_budget=232448
    ) as sim:
        spec = call("cuda:0")
        assert sim.reads == 0
        facts = (spec.arch, spec.sm_count, spec.calibration, spec.smem_budget)
        assert facts == (90, 132, "H100", 232448)
        assert sim.reads == 4


def test_facts_come_from_the_call_device_index(sm80, sm90):
    assert (call("cuda:0").arch, call("cuda:1").arch) == (80, 90)
    assert (call("cuda:0").calibration, call("cuda:1").calibration) == ("A100", "H100")
    assert sm80.reads == sm90.reads == 2


def test_host_devices_have_no_architecture():
    spec = call("cpu")
    assert (spec.arch, spec.sm_count, spec.calibration, spec.smem_budget) == (None, 0, None, 0)


def test_nested_simulations_restore_the_outer_one(sm80):
    with simulate_device("cuda:0", arch=90, sm_count=1):
        assert call().arch == 90
    assert call().arch == 80


def test_dispatch_follows_the_simulation_in_force(sm80):
    op = make_op(
        {
            "ampere": kernel("ampere", supported_archs={80}),
            "hopper": kernel("hopper", supported_archs={90}),
        }
    )()
    assert op.kernel_for(INTERFACE, call())(1) == "ampere"
    with simulate_device("cuda:0", arch=90, sm_count=132) as sim:
        assert op.key_for(INTERFACE, call()) == "hopper"
        assert op.kernel_for(INTERFACE, call())(1) == "hopper"
        assert sim.reads > 0
    assert op.key_for(INTERFACE, call()) == "ampere"
    assert op.kernel_for(INTERFACE, call())(1) == "ampere"


def in_threads(*bodies):
    """Run each body in a thread of its own, all started together; return their results."""
    results = [None] * len(bodies)
    errors = []

    def run(index, body):
        try:
            results[index] = body()
        except BaseException as exc:  # handed back to the test
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(i, b)) for i, b in enumerate(bodies)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(10)
    if errors:
        raise errors[0]
    return results


def test_a_simulation_is_seen_only_in_its_own_thread():
    both_inside = threading.Barrier(2)

    def simulated(arch):
        with simulate_device("cuda:0", arch=arch, sm_count=1):
            both_inside.wait(5)
            seen = call().arch
            both_inside.wait(5)
            return seen

    assert in_threads(lambda: simulated(80), lambda: simulated(90)) == [80, 90]


def test_the_first_simulation_to_end_leaves_the_other_threads_in_force():
    inside, first_ended = threading.Event(), threading.Event()

    def short():
        with simulate_device("cuda:0", arch=80, sm_count=1):
            inside.wait(5)
        first_ended.set()

    def long():
        with simulate_device("cuda:0", arch=90, sm_count=1):
            inside.set()
            first_ended.wait(5)
            return call().arch

    assert in_threads(short, long) == [None, 90]
    assert SCOPES.active == 0  # nothing left behind when both ended


def test_a_thread_started_inside_a_simulation_sees_it_only_if_it_copies_the_context(sm80):
    copied = contextvars.copy_context()
    seen = []
    worker = threading.Thread(target=copied.run, args=(lambda: seen.append(call().arch),))
    worker.start()
    worker.join()
    assert seen == [80]
    bare = threading.Thread(target=lambda: seen.append(dict(tileops.device.SIMULATED.get())))
    bare.start()
    bare.join()
    assert seen == [80, {}]  # a plain thread starts with an empty context: no simulation


def test_simulations_are_per_asyncio_task():
    async def simulated(arch):
        with simulate_device("cuda:0", arch=arch, sm_count=1):
            await asyncio.sleep(0.01)  # the other task runs its simulation meanwhile
            return call().arch

    async def both():
        return await asyncio.gather(simulated(86), simulated(89))

    assert asyncio.run(both()) == [86, 89]


def test_hits_read_the_plain_cache_while_no_simulation_is_in_force_anywhere():
    op = make_op({"k": kernel("k", devices={"cpu"})})()
    assert isinstance(op._hits, dict)
    with simulate_device("cuda:5", arch=90, sm_count=1):
        assert not isinstance(op._hits, dict)  # some context simulates: hits consult theirs
        assert op.kernel_for(INTERFACE, call("cpu"))() == "k"
    assert isinstance(op._hits, dict)
    assert op._hits.get((INTERFACE, call("cpu"))) is not None  # the CPU's selection stands


def test_cuda_and_cuda_0_are_one_simulated_device():
    with simulate_device("cuda", arch=86, sm_count=82) as sim:
        assert (call("cuda").arch, call("cuda:0").arch) == (86, 86)
    with simulate_device("cuda:0", arch=89, sm_count=142):
        assert call("cuda").arch == 89
    assert sim.reads == 2
