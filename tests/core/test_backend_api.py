"""register_kernel_type and the target registrations, in process, with the real ops."""

from __future__ import annotations

import pytest
import torch

from tileops import Kernel, RMSNormFwdOp, SoftmaxFwdOp
from tileops.backend import (
    BUILTIN,
    BackendError,
    register_detector,
    register_kernel_builder,
    register_kernel_type,
)
from tileops.errors import KernelDeclarationError, UnknownOpError
from tileops.ops import RMSNormCall, RMSNormInterface, SoftmaxInterface
from tileops.ops.norm.rms_norm import RMSNormReference
from tileops.provenance import Source, entry_point_of, loading_source, remember_entry_point


class PluggedRMSNorm(RMSNormReference):
    """The reference math, registered as a non-general CPU kernel so it wins where it serves."""

    general = False


def cpu_call(n: int = 8) -> RMSNormCall:
    return RMSNormCall(
        device=torch.device("cpu"), n=n, eps=1e-6, dtype=torch.float32, has_weight=False
    )


def test_registration_by_class_or_name_reaches_instances_constructed_afterwards(
    tileops_registry,
):
    before = RMSNormFwdOp(8)
    register_kernel_type("RMSNormFwdOp", "plugged", PluggedRMSNorm)
    after = RMSNormFwdOp(8)
    assert before.key_for("rms_norm", cpu_call()) == "reference"
    assert after.key_for("rms_norm", cpu_call()) == "plugged"
    x = torch.randn(3, 8)
    torch.testing.assert_close(after(x), torch.nn.functional.rms_norm(x, (8,)))


def test_the_same_key_twice_is_a_backend_error_naming_both(tileops_registry):
    register_kernel_type(RMSNormFwdOp, "plugged", PluggedRMSNorm)
    with pytest.raises(
        BackendError,
        match=r"'plugged' of tileops::RMSNormFwdOp is registered twice: "
        r"by module test_backend_api .* and by module",
    ):
        register_kernel_type(RMSNormFwdOp, "plugged", PluggedRMSNorm)


def test_a_key_the_op_already_has_fails_at_registration(tileops_registry):
    with pytest.raises(
        KernelDeclarationError,
        match=r"tileops::RMSNormFwdOp: module test_backend_api registers kernel key 'reference' "
        r"\(PluggedRMSNorm\), but backends cannot reuse keys it has",
    ):
        register_kernel_type(RMSNormFwdOp, "reference", PluggedRMSNorm)
    assert RMSNormFwdOp(8).key_for("rms_norm", cpu_call()) == "reference"  # the op still works


def test_an_unknown_op_name_suggests_the_closest():
    with pytest.raises(
        UnknownOpError,
        match=r"'RMSNormOp' is not a known op\. Did you mean "
        r"RMSNormFwdOp",
    ):
        register_kernel_type("RMSNormOp", "plugged", PluggedRMSNorm)
    with pytest.raises(UnknownOpError, match="Did you mean SoftmaxFwdOp"):
        register_kernel_builder(op="SoftmaxOp", target="fake", build_kernel=lambda x, dim: None)


@pytest.mark.parametrize(
    ("key", "cls", "problem"),
    [
        ("", PluggedRMSNorm, "key must be a non-empty str"),
        (3, PluggedRMSNorm, "key must be a non-empty str"),
        ("plugged", PluggedRMSNorm(1e-6), "cls must be a class"),
    ],
)
def test_bad_registration_arguments(key, cls, problem):
    with pytest.raises(BackendError, match=problem):
        register_kernel_type(RMSNormFwdOp, key, cls)


def test_a_class_that_is_not_a_kernel_fails_at_registration(tileops_registry):
    class NotRMSNorm(RMSNormInterface):
        pass

    with pytest.raises(KernelDeclarationError, match="'odd'.*NotRMSNorm.*not a subclass"):
        register_kernel_type(RMSNormFwdOp, "odd", NotRMSNorm)
    assert RMSNormFwdOp(8).key_for("rms_norm", cpu_call()) == "reference"


def test_a_kernel_of_another_ops_interface_fails_at_registration(tileops_registry):
    class SoftmaxForNorms(Kernel, SoftmaxInterface):
        devices = {"cpu"}

        def forward(self, x):
            return x

    with pytest.raises(
        KernelDeclarationError,
        match=r"tileops::RMSNormFwdOp: kernel 'odd' .*SoftmaxForNorms.* implements none of the "
        r"op's interfaces \(RMSNormInterface, RMSNormBackwardInterface\)",
    ):
        register_kernel_type(RMSNormFwdOp, "odd", SoftmaxForNorms)
    assert RMSNormFwdOp(8).key_for("rms_norm", cpu_call()) == "reference"


def test_a_registration_that_would_close_a_preference_cycle_fails_at_registration(
    tileops_registry,
):
    class Ahead(PluggedRMSNorm):
        preferred_over = {"behind"}

    class Behind(PluggedRMSNorm):
        preferred_over = {"ahead"}

    register_kernel_type(RMSNormFwdOp, "ahead", Ahead)
    with pytest.raises(KernelDeclarationError, match="preferred_over forms a cycle"):
        register_kernel_type(RMSNormFwdOp, "behind", Behind)
    assert RMSNormFwdOp(8).key_for("rms_norm", cpu_call()) == "ahead"


def test_target_names_are_checked(tileops_registry):
    with pytest.raises(BackendError, match=r"'builtin' \(BUILTIN\) is reserved"):
        register_detector(target=BUILTIN, detect=lambda device: False)
    with pytest.raises(BackendError, match="target must be a non-empty str"):
        register_detector(target="", detect=lambda device: False)
    with pytest.raises(BackendError, match="detect must be callable"):
        register_detector(target="fake", detect=None)
    register_detector(target="fake", detect=lambda device: False)
    with pytest.raises(BackendError, match="target 'fake' already has a detector"):
        register_detector(target="fake", detect=lambda device: False)


def test_one_builder_per_op_and_target(tileops_registry):
    register_kernel_builder(op=SoftmaxFwdOp, target="fake", build_kernel=lambda x, dim: None)
    with pytest.raises(BackendError, match="already has a builder for tileops::SoftmaxFwdOp"):
        register_kernel_builder(op=SoftmaxFwdOp, target="fake", build_kernel=lambda x, dim: None)
    with pytest.raises(BackendError, match="build_kernel must be callable"):
        register_kernel_builder(op=RMSNormFwdOp, target="fake", build_kernel="nope")


def test_a_registration_names_the_entry_point_whose_module_made_it():
    """Not whichever backend is loading: the module's own entry point, found by its package."""
    plugin, other = Source("pkg-a", "plugin"), Source("pkg-a", "other")
    remember_entry_point("provenance_probe.plugin", plugin)
    remember_entry_point("provenance_probe.other", other)
    assert entry_point_of("provenance_probe.plugin.kernels") == plugin
    assert entry_point_of("provenance_probe.other") == other
    assert entry_point_of("provenance_probe.shared") is None  # two in its package, none loading
    token = loading_source.set(other)
    try:
        assert entry_point_of("provenance_probe.shared") == other
        assert entry_point_of("unrelated_module") is None
    finally:
        loading_source.reset(token)
