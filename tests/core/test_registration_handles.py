"""Every registration returns a handle that undoes it (`.remove()`, or the end of a `with`
block), as torch.library's registrations do; the op tables of later instances see the removal."""

from __future__ import annotations

import pytest
import torch
from dispatch_kit import INTERFACE, call, kernel, make_op

import tileops
from tileops import AmbiguousDispatchError, Kernel, OpNotAvailableError, SoftmaxFwdOp
from tileops.backend import (
    RegistrationHandle,
    register_detector,
    register_kernel_builder,
    register_kernel_type,
    registered_targets,
)
from tileops.ops import SoftmaxCall, SoftmaxInterface
from tileops.table import table_for

X = torch.randn(2, 8)
CALL = SoftmaxCall(device=torch.device("cpu"), n=8, dtype=torch.float32)  # X's softmax call


def softmax_kernel(result: float) -> type[Kernel]:
    class Constant(Kernel, SoftmaxInterface):
        devices = {"cpu"}

        def forward(self, x):
            return torch.full_like(x, result)

    return Constant


def keys() -> set[str]:
    return {c.key for c in table_for(SoftmaxFwdOp).candidates["softmax"]}


def test_removing_a_kernel_type_takes_it_out_of_later_op_tables(tileops_registry):
    handle = register_kernel_type(SoftmaxFwdOp, "constant", softmax_kernel(7.0))
    assert isinstance(handle, RegistrationHandle) and handle.registered
    before = SoftmaxFwdOp()
    assert "constant" in keys() and before.explain("softmax", CALL).chosen == "constant"
    assert bool((before(X) == 7.0).all())
    handle.remove()
    assert not handle.registered and "constant" not in keys()
    after = SoftmaxFwdOp()
    torch.testing.assert_close(after(X), torch.softmax(X, -1))
    assert after.explain("softmax", CALL).chosen == "reference"
    assert bool((before(X) == 7.0).all())  # an instance keeps the table it was built with
    assert "removed" in repr(handle) and "kernel key 'constant'" in repr(handle)


def test_a_with_block_undoes_the_registration_on_exit(tileops_registry):
    with register_kernel_type(SoftmaxFwdOp, "constant", softmax_kernel(3.0)) as handle:
        assert bool((SoftmaxFwdOp()(X) == 3.0).all())
    assert not handle.registered and "constant" not in keys()
    torch.testing.assert_close(SoftmaxFwdOp()(X), torch.softmax(X, -1))


def test_removing_twice_or_after_the_key_changed_hands_touches_nothing_else(tileops_registry):
    first = register_kernel_type(SoftmaxFwdOp, "constant", softmax_kernel(1.0))
    first.remove()
    second = register_kernel_type(SoftmaxFwdOp, "constant", softmax_kernel(2.0))
    first.remove()
    assert second.registered and bool((SoftmaxFwdOp()(X) == 2.0).all())


def test_target_registrations_are_undone_by_their_handles(tileops_registry):
    detector = register_detector("mine", lambda device: device.type == "cpu")
    builder = register_kernel_builder(
        SoftmaxFwdOp, "mine", lambda x, dim: lambda x, **out: torch.zeros_like(x)
    )
    assert bool((SoftmaxFwdOp()(X) == 0).all())
    builder.remove()
    with pytest.raises(OpNotAvailableError, match="registered no kernel builder"):
        SoftmaxFwdOp()(X)
    detector.remove()
    assert "mine" not in registered_targets()
    torch.testing.assert_close(SoftmaxFwdOp()(X), torch.softmax(X, -1))


def test_a_preference_is_withdrawn_by_its_handle(sm80, tileops_registry):
    tied = make_op({"a": kernel("a"), "b": kernel("b")})
    with tileops.prefer(tied, INTERFACE, "b", "a"):
        assert tied().kernel_for(INTERFACE, call())() == "b"
    with pytest.raises(AmbiguousDispatchError):
        tied().kernel_for(INTERFACE, call())
