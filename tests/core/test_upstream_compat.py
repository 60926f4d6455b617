"""Names and behaviours of upstream TileOPs' protocol, matched or also accepted (issue 34)."""

from __future__ import annotations

import pickle

import pytest
import torch

import tileops
from tileops import BUILTIN, CallSpec, GemmOp, Kernel, KernelInterface, Op, RMSNormFwdOp
from tileops.backend import (
    CallSpecFieldError,
    KernelDeclarationError,
    OpNotAvailableError,
    default_target,
    key_serves,
    register_detector,
    register_kernel_builder,
    register_kernel_type,
    registered_targets,
    set_default_target,
)
from tileops.ops.norm.rms_norm import RMSNormCall, RMSNormInterface
from tileops.testing import isolated_registry


@pytest.fixture(autouse=True)
def _isolated():
    with isolated_registry():
        yield


def rms_call(**facts) -> RMSNormCall:
    return RMSNormCall(n=8, eps=1e-6, dtype=torch.float32, has_weight=False, **facts)


# -- BUILTIN ---------------------------------------------------------------------------------
def test_builtin_is_one_sentinel_that_the_old_string_still_names():
    assert repr(BUILTIN) == "BUILTIN" and BUILTIN == "builtin"
    assert RMSNormFwdOp(8, target="builtin").target is BUILTIN
    set_default_target("builtin")
    assert default_target() is BUILTIN
    op = RMSNormFwdOp(8)
    op(torch.randn(2, 8))
    assert op.serving_target is BUILTIN and op.settled_target is BUILTIN


def test_builtin_survives_pickling_as_the_sentinel():
    op = pickle.loads(pickle.dumps(RMSNormFwdOp(8, target=BUILTIN)))
    assert op.target is BUILTIN
    assert pickle.loads(pickle.dumps(BUILTIN)) is BUILTIN


# -- registered_targets(op) ------------------------------------------------------------------
def test_registered_targets_of_an_op_are_those_with_a_builder_for_it():
    register_detector(target="claims_nothing", detect=lambda device: False)
    register_kernel_builder(op="GemmFwdOp", target="builds_gemm", build_kernel=lambda *a, **k: 0)
    assert {"claims_nothing", "builds_gemm"} <= set(registered_targets())
    assert "builds_gemm" in registered_targets("GemmFwdOp")
    assert "claims_nothing" not in registered_targets(tileops.GemmFwdOp)
    assert "builds_gemm" not in registered_targets("RMSNormFwdOp")


# -- KernelInterface.request -----------------------------------------------------------------
def test_request_is_upstreams_spelling_of_call_spec():
    class Upstream(KernelInterface):
        request = RMSNormCall

        def forward(self, x):
            raise NotImplementedError

    assert Upstream.call_spec is RMSNormCall and Upstream.request is RMSNormCall
    assert RMSNormInterface.request is RMSNormInterface.call_spec is RMSNormCall


def test_request_and_call_spec_naming_two_classes_is_refused():
    with pytest.raises(
        KernelDeclarationError, match="declares call_spec = RMSNormCall and request"
    ):

        class Both(KernelInterface):  # noqa: F841
            call_spec = RMSNormCall
            request = CallSpec


# -- Kernel.entry_for ------------------------------------------------------------------------
class BuiltFromCall(Kernel, RMSNormInterface):
    devices = {"cpu"}

    def __init__(self, call):
        self.eps = call.eps

    def forward(self, x, weight):
        return torch.nn.functional.rms_norm(x, x.shape[-1:], weight, self.eps)


class BuiltBare(Kernel, RMSNormInterface):
    def forward(self, x, weight):
        return x


def test_entry_for_builds_from_the_call_when_the_constructor_takes_it():
    call = rms_call()
    identity, build = BuiltFromCall.entry_for(call)
    assert identity == call and build().eps == 1e-6
    assert BuiltBare.entry_for(call)[0] == ()


def test_a_kernel_taking_the_call_serves_without_an_entry_for():
    register_kernel_type(RMSNormFwdOp, "from_call", BuiltFromCall)
    op = RMSNormFwdOp(8)
    x = torch.randn(3, 8)
    torch.testing.assert_close(op(x), torch.nn.functional.rms_norm(x, (8,)))
    entries = op.built_entries("rms_norm")
    assert any(cls is BuiltFromCall for cls, _ in entries)


# -- target kernels that return their result -------------------------------------------------
def test_a_target_kernel_taking_only_the_inputs_is_called_with_them_and_returns():
    register_detector(target="plain", detect=lambda device: device.type == "cpu")
    register_kernel_builder(
        op="RMSNormFwdOp",
        target="plain",
        build_kernel=lambda x, weight, *, normalized_shape, eps: lambda x, weight: x * 2,
    )
    op = RMSNormFwdOp(8)
    x = torch.randn(3, 8)
    torch.testing.assert_close(op(x, None), x * 2)
    assert op.serving_target == "plain"
    ((key, kernel),) = op.built_entries("rms_norm").items()
    assert key == (torch.device("cpu"), (torch.float32, (3, 8)), None) and callable(kernel)


def test_a_target_kernel_taking_no_buffer_must_return_its_result():
    register_kernel_builder(
        op="RMSNormFwdOp", target="silent", build_kernel=lambda *s, **p: lambda x, weight: None
    )
    with pytest.raises(tileops.BackendError, match=r"takes its output buffers \(out\) not at all"):
        RMSNormFwdOp(8, target="silent")(torch.randn(3, 8))


# -- CallSpec(device=None) and stated device facts -------------------------------------------
def test_a_call_spec_without_a_device_names_the_current_one():
    expected = (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
    assert rms_call().device == expected and rms_call(device=None) == rms_call()


def test_stated_device_facts_decide_selection_but_kernel_for_refuses_them():
    h200 = {"arch": 90, "sm_count": 132, "calibration": "NVIDIA H200", "smem_budget": 232448}
    call = rms_call(device=torch.device("cuda", 0), **h200)  # no device is read: all stated
    assert (call.arch, call.sm_count, call.stated_device_facts) == (90, 132, frozenset(h200))
    assert rms_call(arch=80).facts == tileops.DeviceFacts(80, 0, None, 0)  # the rest: the CPU's
    op = RMSNormFwdOp(8)
    stated = rms_call(**h200)
    assert op.key_for("rms_norm", stated) == "reference"
    with pytest.raises(CallSpecFieldError, match="states arch, calibration, sm_count, smem_budget"):
        op.kernel_for("rms_norm", stated)


def test_a_fact_that_is_no_device_fact_is_refused_by_name():
    with pytest.raises(TypeError, match="unexpected keyword argument.*warps.*may state are arch"):
        rms_call(warps=4)


# -- key aliases -----------------------------------------------------------------------------
class Beats(Kernel, RMSNormInterface):
    devices = {"cpu"}
    preferred_over = {"rms_norm"}  # upstream's name of the op's own kernel

    def forward(self, x, weight):
        return x


def test_the_interface_name_is_another_name_of_the_ops_own_kernel():
    register_kernel_type(RMSNormFwdOp, "beats", Beats)
    op = RMSNormFwdOp(8)
    (beats,) = [c for c in op._table.candidates["rms_norm"] if c.key == "beats"]
    assert beats.preferred == {"reference"}
    assert "not installed" not in op.explain("rms_norm", rms_call()).text
    assert key_serves(RMSNormFwdOp, "rms_norm", rms_call())
    assert key_serves("LayerNormFwdOp", "layer_norm", tileops.ops.LayerNormCall(
        device=torch.device("cpu"), n=8, eps=1e-5, dtype=torch.float32,
        has_weight=False, has_bias=False,
    ))  # fmt: skip


# -- GemmFwdOp, module paths, exports --------------------------------------------------------
def test_gemm_fwd_op_is_upstreams_gemm_nt_by_default_without_bias():
    from tileops.ops.gemm import GemmOp as old_path
    from tileops.ops.gemm.gemm import GemmFwdOp

    assert old_path is GemmOp and issubclass(GemmFwdOp, GemmOp)
    a, b = torch.randn(5, 4), torch.randn(3, 4)
    op = GemmFwdOp()
    assert (op.trans_a, op.trans_b) == (False, True)
    torch.testing.assert_close(op(a, b), a @ b.t())
    torch.testing.assert_close(GemmFwdOp(trans_b=False)(a, b.t()), a @ b.t())
    with pytest.raises(tileops.OpInputError, match=r"takes at most 2 tensor arguments \(a, b\)"):
        op(a, b, torch.randn(3))


def test_a_kernel_registered_for_gemm_op_serves_gemm_fwd_op_and_back():
    from tileops.ops.gemm import GemmInterface
    from tileops.ops.gemm.gemm import GemmFwdOp

    class Cpu(Kernel, GemmInterface):
        devices = {"cpu"}
        preferred_over = {"gemm"}

        def forward(self, a, b, bias):
            return torch.full((a.shape[0], b.shape[0]), 7.0)

    register_kernel_type("GemmFwdOp", "cpu_gemm", Cpu)
    assert (GemmFwdOp()(torch.randn(2, 4), torch.randn(3, 4)) == 7).all()
    assert (GemmOp(trans_b=True)(torch.randn(2, 4), torch.randn(3, 4)) == 7).all()


def test_a_target_builds_gemm_fwd_op_from_a_and_b_and_the_transposes():
    from tileops.ops.gemm.gemm import GemmFwdOp

    seen = []

    def build_gemm(a, b, *, trans_a, trans_b):
        seen.append((a.shape, b.shape, trans_a, trans_b))
        return lambda a, b: a @ b.t()

    register_kernel_builder(op="GemmFwdOp", target="cpu_gemm", build_kernel=build_gemm)
    a, b = torch.randn(5, 4), torch.randn(3, 4)
    torch.testing.assert_close(GemmFwdOp(target="cpu_gemm")(a, b), a @ b.t())
    assert seen == [((5, 4), (3, 4), False, True)]


def test_upstream_module_paths_and_exports():
    from tileops.ops.reduction.softmax import SoftmaxFwdOp

    assert SoftmaxFwdOp is tileops.SoftmaxFwdOp
    import tileops.backend as backend

    assert backend.OpNotAvailableError is tileops.OpNotAvailableError
    for name in ("Build", "BackendError", "NoImplementationError", "OpInputError", "Target"):
        assert name in backend.__all__ and hasattr(backend, name)


def test_an_op_written_upstreams_way_passes_target_to_op_init():
    class Doubling(Op):
        namespace = "compat_test"

        def __init__(self, *, target=None):
            super().__init__(target=target)

        def forward(self, x):
            return 2 * x

    assert Doubling(target=BUILTIN).target is BUILTIN
    with pytest.raises(TypeError, match="target must be a target name, BUILTIN or None"):
        Doubling(target=3)


def test_no_builder_for_the_settled_target_is_op_not_available():
    register_detector(target="cpu_only_rms", detect=lambda device: device.type == "cpu")
    with pytest.raises(OpNotAvailableError, match="registered no kernel builder"):
        tileops.SoftmaxFwdOp(-1)(torch.randn(2, 3))
