"""Entries: shared by build identity within an interface, across op instances, and kept."""

from __future__ import annotations

import pytest
from dispatch_kit import INTERFACE, Binary, Unary, call, kernel, make_op

from tileops import NoImplementationError
from tileops.backend import register_kernel_type


def test_calls_with_the_same_class_and_identity_share_an_entry(sm80):
    k = kernel("k", identity=lambda c: ("parity", c.n % 2))
    op = make_op({"k": k})()
    odd = op.kernel_for(INTERFACE, call(n=1))
    assert op.kernel_for(INTERFACE, call(n=3)) is odd
    even = op.kernel_for(INTERFACE, call(n=2))
    assert even is not odd
    assert op.kernel_for(INTERFACE, call(n=4)) is even
    assert k.counts["build"] == 2


def test_different_classes_with_the_same_identity_build_separately(sm80):
    small = kernel("small", refuse=lambda c: "large n" if c.n > 8 else None)
    large = kernel("large", refuse=lambda c: "small n" if c.n <= 8 else None)
    op = make_op({"small": small, "large": large})()
    assert op.kernel_for(INTERFACE, call(n=1))(0) == "small"
    assert op.kernel_for(INTERFACE, call(n=9))(0) == "large"
    assert small.counts["build"] == large.counts["build"] == 1


def test_entries_are_not_shared_across_interfaces(sm80):
    both = kernel("both", base=(Unary, Binary))
    op = make_op({"both": both}, interfaces={"u": Unary, "b": Binary})()
    assert op.kernel_for("u", call()) is not op.kernel_for("b", call())
    assert both.counts["build"] == 2


def test_op_instances_of_one_class_share_entries(sm80):
    k = kernel("k")
    op_cls = make_op({"k": k})
    layers = [op_cls() for _ in range(32)]
    entries = {id(layer.kernel_for(INTERFACE, call())) for layer in layers}
    assert len(entries) == 1
    assert k.counts["build"] == 1
    assert k.counts["refusal"] == 1  # selected once, too


def test_entries_outlive_registration_changes(sm80, isolated):
    k = kernel("k", preferred_over={"late"})
    op_cls = make_op({"k": k}, name="OutliveOp")
    first = op_cls().kernel_for(INTERFACE, call())
    register_kernel_type(op_cls, "late", kernel("late"))
    again = op_cls()
    assert again.explain(INTERFACE, call()).verdict("late") == "outranked"
    refusals = k.counts["refusal"]
    assert again.kernel_for(INTERFACE, call()) is first
    assert k.counts["refusal"] == refusals + 1  # a miss on the new table, yet no new build
    assert k.counts["build"] == 1


def test_a_failing_call_discards_no_built_entry(sm80):
    failing = {2}

    def on_build(c):
        if c.n in failing:
            raise RuntimeError("compiler crashed")

    def refuse(c):
        return "n = 5 is not served" if c.n == 5 else None

    k = kernel("k", identity=lambda c: c.n, on_build=on_build, refuse=refuse)
    op = make_op({"k": k})()
    built = op.kernel_for(INTERFACE, call(n=1))
    with pytest.raises(RuntimeError, match="compiler crashed"):
        op.kernel_for(INTERFACE, call(n=2))
    with pytest.raises(NoImplementationError):
        op.kernel_for(INTERFACE, call(n=5))
    assert op.kernel_for(INTERFACE, call(n=1)) is built
    assert type(op)().kernel_for(INTERFACE, call(n=1)) is built
    failing.clear()
    op.kernel_for(INTERFACE, call(n=2))  # the failed build is retried, not cached as failed
    assert k.counts["build"] == 3
