"""A kernel, builder or target that misbehaves: the user learns which one, with its
distribution, and never gets a silently wrong result."""

from __future__ import annotations

import pytest
import torch

from tileops import BackendError, GemmOp, Kernel, RMSNormFwdOp, SoftmaxFwdOp
from tileops.backend import register_detector, register_kernel_builder, register_kernel_type
from tileops.ops import GemmInterface, RMSNormInterface, SoftmaxInterface

SOURCE = "[module test_kernel_failures]"


def notes(exc: BaseException) -> str:
    return "\n".join(getattr(exc, "__notes__", []))


class Exploding(Kernel, RMSNormInterface):
    devices = {"cpu"}

    def forward(self, x, weight):
        raise ZeroDivisionError("kernel blew up")


def test_a_kernel_exception_keeps_its_type_and_names_its_source(tileops_registry):
    register_kernel_type(RMSNormFwdOp, "exploding", Exploding)
    with pytest.raises(ZeroDivisionError) as info:
        RMSNormFwdOp(4)(torch.randn(2, 4))
    assert str(info.value) == "kernel blew up"
    assert (
        f"raised by kernel 'exploding' {SOURCE} serving tileops::RMSNormFwdOp.rms_norm for "
        "RMSNormCall(" in notes(info.value)
    )


class FailingBuild(Kernel, SoftmaxInterface):
    devices = {"cpu"}

    @classmethod
    def entry_for(cls, call):
        def build():
            raise RuntimeError("nvcc exited 1")

        return (call.n,), build


class FailingEntryFor(Kernel, SoftmaxInterface):
    devices = {"cpu"}

    @classmethod
    def entry_for(cls, call):
        raise KeyError("no tile config")


@pytest.mark.parametrize(
    ("cls", "error", "where"),
    [
        (FailingBuild, RuntimeError, "raised while building kernel 'failing' " + SOURCE),
        (FailingEntryFor, KeyError, "raised by entry_for() while building kernel 'failing' "),
    ],
)
def test_a_build_failure_names_its_source(tileops_registry, cls, error, where):
    register_kernel_type(SoftmaxFwdOp, "failing", cls)
    with pytest.raises(error) as info:
        SoftmaxFwdOp()(torch.randn(2, 4))
    assert where in notes(info.value)
    assert "for tileops::SoftmaxFwdOp.softmax" in notes(info.value)


def test_a_target_builder_or_kernel_failure_names_the_target(tileops_registry):
    def build(x, *, dim):
        if x.shape[-1] == 3:
            raise ValueError("no such config")
        return lambda x, *, out: (_ for _ in ()).throw(RuntimeError("launch failed"))

    register_detector(target="flaky", detect=lambda device: False)
    register_kernel_builder(op=SoftmaxFwdOp, target="flaky", build_kernel=build)
    with pytest.raises(ValueError) as info:
        SoftmaxFwdOp(target="flaky")(torch.randn(2, 3))
    assert str(info.value) == "no such config"
    assert f"raised by build_kernel of target 'flaky' {SOURCE} for tileops::SoftmaxFwdOp" in (
        notes(info.value)
    )
    with pytest.raises(RuntimeError) as info:
        SoftmaxFwdOp(target="flaky")(torch.randn(2, 4))
    assert str(info.value) == "launch failed"
    assert notes(info.value) == (
        f"raised by the kernel of target 'flaky' {SOURCE} for tileops::SoftmaxFwdOp"
    )


def wrong(output):
    """A CPU softmax kernel class returning `output(x)`."""

    class Wrong(Kernel, SoftmaxInterface):
        devices = {"cpu"}

        def forward(self, x):
            return output(x)

    return Wrong


@pytest.mark.parametrize(
    ("output", "got"),
    [
        (lambda x: None, "NoneType None"),
        (lambda x: x.t().contiguous(), "a contiguous float32 tensor of shape [8, 2]"),
        (lambda x: x.double(), "a contiguous float64 tensor of shape [2, 8]"),
        (lambda x: x.t().contiguous().t(), "a non-contiguous float32 tensor of shape [2, 8]"),
        (lambda x: x.to("meta"), "a contiguous float32 tensor of shape [2, 8] on meta"),
        (lambda x: x.numpy(), "ndarray"),
    ],
    ids=["none", "transposed", "dtype", "non-contiguous", "device", "not-a-tensor"],
)
def test_a_wrong_output_is_a_backend_error_naming_the_key(tileops_registry, output, got):
    register_kernel_type(SoftmaxFwdOp, "wrong", wrong(output))
    with pytest.raises(BackendError) as info:
        SoftmaxFwdOp()(torch.randn(2, 8))
    message = str(info.value)
    assert message.startswith(
        f"Output of kernel 'wrong' {SOURCE} serving tileops::SoftmaxFwdOp.softmax for "
    )
    assert f"it returned {got}" in message
    assert "expects a contiguous float32 tensor of shape [2, 8] on cpu" in message


def test_every_op_checks_its_kernels_output(tileops_registry):
    class TransposedGemm(Kernel, GemmInterface):
        devices = {"cpu"}

        def forward(self, a, b, bias):
            return (a @ b).t().contiguous()

    register_kernel_type(GemmOp, "transposed", TransposedGemm)
    with pytest.raises(
        BackendError, match=r"returned a contiguous float32 tensor of shape \[5, 3\]"
    ):
        GemmOp()(torch.randn(3, 4), torch.randn(4, 5))
