"""Device facts: read lazily from the call's own device index, and simulable."""

from __future__ import annotations

import dataclasses

from dispatch_kit import INTERFACE, call, kernel, make_op

from tileops import DeviceFacts
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
