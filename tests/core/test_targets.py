"""Targets (backends.md section 2) with the real ops: settling, building, caching, checks."""

from __future__ import annotations

import re
import threading

import pytest
import torch
import torch.nn.functional as F

from tileops import BUILTIN, BatchNormFwdOp, GemmOp, RMSNormFwdOp, SoftmaxFwdOp
from tileops.backend import (
    AmbiguousTargetError,
    BackendError,
    UnknownTargetError,
    default_target,
    register_detector,
    register_kernel_builder,
    registered_targets,
    set_default_target,
)
from tileops.errors import OpInputError, OpNotAvailableError
from tileops.testing import isolated_registry


@pytest.fixture(autouse=True)
def _isolated():
    with isolated_registry():
        yield


class Recorder:
    """A target's builder that records what it was given and serves with a torch function."""

    def __init__(self, compute):
        self.compute = compute
        self.builds: list[tuple[tuple, dict]] = []
        self.calls: list[tuple[tuple, dict]] = []

    def __call__(self, *specs, **params):
        self.builds.append((specs, params))

        def kernel(*inputs, **outputs):
            self.calls.append((inputs, outputs))
            (buffer,) = outputs.values()
            buffer.copy_(self.compute(*inputs, **params))

        return kernel


def softmax_target(name="fake", claims=lambda device: False) -> Recorder:
    recorder = Recorder(lambda x, dim: torch.softmax(x, dim))
    register_detector(target=name, detect=claims)
    register_kernel_builder(op=SoftmaxFwdOp, target=name, build_kernel=recorder)
    return recorder


def test_a_claiming_target_serves_every_call_and_forward_never_runs(monkeypatch):
    recorder = softmax_target(claims=lambda device: device.type == "cpu")
    op = SoftmaxFwdOp(dim=0)
    monkeypatch.setattr(op, "forward", lambda *a: pytest.fail("the op's own forward ran"))
    x = torch.randn(3, 5)
    torch.testing.assert_close(op(x), torch.softmax(x, 0))
    assert op.settled_target == "fake" and len(recorder.calls) == 1


def test_builder_gets_tensor_specs_in_signature_order_and_params_by_keyword():
    recorder = Recorder(
        lambda x, weight, normalized_shape, eps: F.rms_norm(x, normalized_shape, weight, eps)
    )
    register_detector(target="fake", detect=lambda device: False)
    register_kernel_builder(op="RMSNormFwdOp", target="fake", build_kernel=recorder)
    op = RMSNormFwdOp(normalized_shape=8, eps=1e-6, target="fake")
    x = torch.randn(2, 8)
    torch.testing.assert_close(op(x), F.rms_norm(x, (8,), None, 1e-6))
    ((specs, params),) = recorder.builds
    assert specs[0].shape == (2, 8) and specs[0].dtype == torch.float32
    assert specs[0].device == torch.device("cpu")
    assert specs[1] is None  # weight not passed
    assert params == {"normalized_shape": (8,), "eps": 1e-6}
    ((inputs, outputs),) = recorder.calls
    assert inputs[0] is x and inputs[1] is None
    assert list(outputs) == [o.name for o in op.signature.outputs]


def test_nothing_builds_before_the_first_call():
    recorder = softmax_target()
    SoftmaxFwdOp(target="fake")
    assert recorder.builds == []


def test_kernels_are_cached_per_instance_by_device_presence_dtype_and_shape():
    recorder = softmax_target()
    op = SoftmaxFwdOp(target="fake")
    op(torch.randn(4, 4))
    op(torch.randn(4, 4))
    assert len(recorder.builds) == 1
    op(torch.randn(4, 4, dtype=torch.float16))
    op(torch.randn(2, 4))
    assert len(recorder.builds) == 3
    SoftmaxFwdOp(target="fake")(torch.randn(4, 4))
    assert len(recorder.builds) == 4  # another instance has its own cache


def test_constructor_target_beats_default_which_beats_detectors():
    softmax_target("claimer", claims=lambda device: True)
    softmax_target("chosen")
    softmax_target("default")
    set_default_target("default")
    assert default_target() == "default"
    x = torch.randn(2, 3)
    explicit, defaulted = SoftmaxFwdOp(target="chosen"), SoftmaxFwdOp()
    explicit(x), defaulted(x)
    assert (explicit.settled_target, defaulted.settled_target) == ("chosen", "default")
    set_default_target(None)
    detected = SoftmaxFwdOp()
    detected(x)
    assert detected.settled_target == "claimer"


def test_no_claim_means_the_ops_own_kernels():
    softmax_target()
    op = SoftmaxFwdOp()
    x = torch.randn(2, 3)
    torch.testing.assert_close(op(x), torch.softmax(x, -1))
    assert op.settled_target == BUILTIN


def test_builtin_forces_own_kernels_where_a_target_claims_the_device():
    recorder = softmax_target(claims=lambda device: True)
    op = SoftmaxFwdOp(target=BUILTIN)
    op(torch.randn(2, 3))
    assert op.settled_target == BUILTIN and recorder.builds == []


def test_several_claims_are_ambiguous():
    softmax_target("one", claims=lambda device: True)
    softmax_target("two", claims=lambda device: True)
    with pytest.raises(AmbiguousTargetError, match=r"several targets claim cpu: 'one' .*'two'"):
        SoftmaxFwdOp()(torch.randn(2, 2))


def test_unknown_target_lists_the_known_ones():
    softmax_target("fake")
    with pytest.raises(UnknownTargetError, match=r"unknown target 'fakr'; known targets: fake"):
        SoftmaxFwdOp(target="fakr")(torch.randn(2, 2))
    with pytest.raises(UnknownTargetError, match="known targets: fake"):
        set_default_target("fakr")
    assert "fake" in registered_targets()


def test_the_settled_target_is_kept():
    softmax_target("first", claims=lambda device: True)
    op = SoftmaxFwdOp()
    op(torch.randn(2, 2))
    softmax_target("second")
    set_default_target("second")
    op(torch.randn(2, 2))
    assert op.settled_target == "first"


def test_a_call_whose_written_tensors_are_all_empty_settles_and_runs_nothing():
    recorder = softmax_target(claims=lambda device: True)
    op = SoftmaxFwdOp()
    out = op(torch.randn(0, 7))
    assert out.shape == (0, 7) and op.settled_target is None and recorder.builds == []


def test_a_failing_settling_call_is_undone():
    state = {"fail": True}

    def build(x, *, dim):
        if state["fail"]:
            raise RuntimeError("compiler crashed")
        return lambda x, **out: next(iter(out.values())).copy_(torch.softmax(x, dim))

    register_detector(target="flaky", detect=lambda device: True)
    register_kernel_builder(op=SoftmaxFwdOp, target="flaky", build_kernel=build)
    op = SoftmaxFwdOp()
    with pytest.raises(RuntimeError, match="compiler crashed"):
        op(torch.randn(2, 2))
    assert op.settled_target is None
    state["fail"] = False
    op(torch.randn(2, 2))
    assert op.settled_target == "flaky"


def test_a_target_without_a_builder_for_the_op_does_not_fall_back():
    softmax_target("fake", claims=lambda device: True)
    with pytest.raises(
        OpNotAvailableError, match="registered no kernel builder for tileops::GemmOp"
    ):
        GemmOp()(torch.randn(2, 3), torch.randn(3, 4))


@pytest.mark.parametrize(
    ("settle", "why"),
    [
        ("claim", r"its detector claims cpu"),
        ("argument", r"the op was constructed with target='fake'"),
        ("default", r"it is the process default, set by module test_targets"),
    ],
)
def test_a_target_without_a_builder_names_its_owner_why_and_both_ways_out(settle, why):
    """The error says whose target it is, how the op came to settle there, and how to leave."""
    softmax_target("fake", claims=lambda device: settle == "claim")
    if settle == "default":
        set_default_target("fake")
    op = GemmOp(target="fake" if settle == "argument" else None)
    with pytest.raises(OpNotAvailableError) as caught:
        op(torch.randn(2, 3), torch.randn(3, 4))
    message = str(caught.value)
    assert re.search(
        r"^tileops::GemmOp settled on target 'fake' \(module test_targets\), which registered "
        rf"no kernel builder for tileops::GemmOp: {why}\. There is no fall-back",
        message,
    ), message
    assert "construct the op with target='builtin' (its own kernels) or another target" in message
    assert "change the process default with tileops.backend.set_default_target(...)" in message


def test_a_detector_answering_anything_but_a_bool_is_a_backend_error():
    """'no' is truthy: read as a claim it would settle every op on a target that never meant to
    claim the device."""
    register_detector(target="wishy", detect=lambda device: "no")
    with pytest.raises(
        BackendError,
        match=r"detector of target 'wishy' \(module test_targets\) returned 'no' \(str\) for "
        r"cpu; a detector must return a bool",
    ):
        SoftmaxFwdOp()(torch.randn(2, 2))


def test_a_raising_detector_names_target_and_distribution():
    def detect(device):
        raise RuntimeError("driver missing")

    register_detector(target="broken", detect=detect)
    with pytest.raises(
        BackendError, match=r"detector of target 'broken' \(module test_targets\).*driver missing"
    ):
        SoftmaxFwdOp()(torch.randn(2, 2))


def test_a_target_sees_contiguous_inputs_on_one_device():
    recorder = softmax_target()
    op = SoftmaxFwdOp(target="fake")
    x = torch.randn(6, 4).t()
    torch.testing.assert_close(op(x), torch.softmax(x, -1))
    ((inputs, _),) = recorder.calls
    assert inputs[0].is_contiguous()
    with pytest.raises(OpInputError, match="'b' is on meta"):
        GemmOp(target=BUILTIN)(torch.randn(2, 3), torch.randn(3, 4, device="meta"))


def test_a_written_input_that_must_be_contiguous_is_refused_for_targets():
    recorder = Recorder(lambda *a, **k: torch.zeros(()))
    register_detector(target="fake", detect=lambda device: False)
    register_kernel_builder(op=BatchNormFwdOp, target="fake", build_kernel=recorder)
    op = BatchNormFwdOp(num_features=3, training=True, target="fake")
    stats = torch.zeros(3, 2)[:, 0]
    with pytest.raises(
        OpInputError, match="'running_mean' is written in place and must be contiguous"
    ):
        op(torch.randn(4, 3), None, None, stats, torch.ones(3))


def test_two_threads_settle_one_target_and_build_once():
    builds = []
    barrier = threading.Barrier(8)

    def build(x, *, dim):
        builds.append(1)
        return lambda x, **out: next(iter(out.values())).copy_(torch.softmax(x, dim))

    register_detector(target="fake", detect=lambda device: True)
    register_kernel_builder(op=SoftmaxFwdOp, target="fake", build_kernel=build)
    op = SoftmaxFwdOp()
    x = torch.randn(3, 3)

    def first_call():
        barrier.wait()
        op(x)

    threads = [threading.Thread(target=first_call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1 and op.settled_target == "fake"
