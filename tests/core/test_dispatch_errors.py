"""The three dispatch errors (spec section 2), their messages, and errors from kernel code."""

from __future__ import annotations

import re

import pytest
from dispatch_kit import INTERFACE, call, kernel, make_op

from tileops import (
    AmbiguousDispatchError,
    BackendError,
    NoImplementationError,
    OpNotAvailableError,
)


def test_no_key_runs_on_the_device_type():
    op = make_op({"a": kernel("a"), "b": kernel("b", devices={"cuda", "xpu"})})()
    for method in (op.kernel_for, op.key_for):
        with pytest.raises(OpNotAvailableError, match=r"do not run on 'cpu'") as caught:
            method(INTERFACE, call("cpu"))
        assert isinstance(caught.value, BackendError)
        assert "runs on cuda, xpu, not cpu" in str(caught.value)
        assert re.search(
            r"(No installed backend declares devices of type|backends that declare) 'cpu'",
            str(caught.value),
        )


def test_no_implementation_serves_this_call_lists_every_reason(sm80):
    op = make_op(
        {
            "big": kernel("big", refuse=lambda c: f"needs n >= 1024, got {c.n}"),
            "hopper": kernel("hopper", supported_archs={90}),
            "host": kernel("host", devices={"cpu"}),
        }
    )()
    with pytest.raises(NoImplementationError, match="no implementation serves this call") as caught:
        op.kernel_for(INTERFACE, call(n=8))
    message = str(caught.value)
    assert isinstance(caught.value, ValueError)
    for reason in (
        "big",
        "needs n >= 1024, got 8",
        "hopper",
        "supports sm_90; cuda:0 has sm_80",
        "host",
        "runs on cpu, not cuda",
    ):
        assert reason in message


def test_ambiguous_dispatch_names_the_tied_keys(sm80):
    op = make_op(
        {
            "a": kernel("a", preferred_over={"c"}),
            "b": kernel("b"),
            "c": kernel("c"),
            "fallback": kernel("fallback", general=True),
        }
    )()
    with pytest.raises(
        AmbiguousDispatchError,
        match=r"dispatch is ambiguous between .a. \[module dispatch_kit\], .b. \[module "
        r"dispatch_kit\];",
    ):
        op.kernel_for(INTERFACE, call())
    assert issubclass(AmbiguousDispatchError, ValueError)


def test_a_failed_dispatch_is_not_cached(sm80):
    k = kernel("k", refuse=lambda c: "refused")
    op = make_op({"k": k})()
    for _ in range(2):
        with pytest.raises(NoImplementationError):
            op.kernel_for(INTERFACE, call())
    assert k.counts["refusal"] == 2


def test_a_raising_refusal_is_a_backend_error_naming_the_key(sm80):
    op = make_op({"boom": kernel("boom", refuse=lambda c: 1 / 0)})()
    with pytest.raises(BackendError, match=r"refusal\(\) of kernel 'boom'.*ZeroDivisionError"):
        op.kernel_for(INTERFACE, call())


def test_an_unhashable_build_identity_is_a_backend_error_naming_the_key(sm80):
    op = make_op({"k": kernel("k", identity=lambda c: ["not", "hashable"])})()
    with pytest.raises(BackendError, match=r"kernel 'k'.*unhashable build identity"):
        op.kernel_for(INTERFACE, call())
