"""Targets (backends.md section 2) with the real ops: settling, building, caching, checks."""

from __future__ import annotations

import re
import threading

import pytest
import torch
import torch.nn.functional as F

from tileops import BUILTIN, BatchNormFwdOp, GemmOp, Op, RMSNormFwdOp, SoftmaxFwdOp
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
from tileops.signature import Input, Output, Signature
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

        def kernel(*inputs, **outputs):  # takes `out` through **outputs: returns it
            self.calls.append((inputs, outputs))
            (buffer,) = outputs.values()
            return buffer.copy_(self.compute(*inputs, **params))

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
    assert "construct the op with target=BUILTIN (its own kernels) or another target" in message
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


# -- what a target kernel returns (backends.md, "The target contract") ---------------------


def softmax_kernel(kernel, name="fake"):
    """Target `name` for SoftmaxFwdOp whose builder returns `kernel(x, dim)`."""
    register_detector(target=name, detect=lambda device: False)
    register_kernel_builder(op=SoftmaxFwdOp, target=name, build_kernel=lambda x, *, dim: kernel)


@pytest.mark.parametrize("requires_grad", [False, True], ids=["eager", "autograd"])
def test_a_kernel_returning_its_result_is_used_even_if_it_ignores_out(requires_grad):
    """Upstream TileOPs' kernels return their result; the buffer it never wrote is dropped."""
    results = []

    def kernel(x, **execution):
        results.append(torch.softmax(x.detach(), -1))
        return results[-1]

    softmax_kernel(kernel)
    x = torch.randn(3, 5).requires_grad_(requires_grad)
    y = SoftmaxFwdOp(target="fake")(x)
    assert y is results[0] or (requires_grad and torch.equal(y, results[0]))
    torch.testing.assert_close(y, torch.softmax(x, -1))


def test_a_kernel_naming_out_and_returning_none_has_written_it():
    buffers = []

    def kernel(x, *, out):
        buffers.append(out.copy_(torch.softmax(x, -1)))

    softmax_kernel(kernel)
    x = torch.randn(3, 5)
    assert SoftmaxFwdOp(target="fake")(x) is buffers[0]


class Opaque:
    """A kernel whose signature Python cannot read (as some extension callables)."""

    @property
    def __signature__(self):
        raise ValueError("no signature")

    def __call__(self, x, *, out):
        out.copy_(torch.softmax(x, -1))


@pytest.mark.parametrize(
    "kernel, why",
    [
        (lambda x, **buffers: None, r"only through \*\*kwargs"),
        (lambda *args, **buffers: None, r"only through \*\*kwargs"),
        (Opaque(), r"only through \*\*kwargs \(or has a signature Python cannot read\)"),
    ],
    ids=["kwargs", "args and kwargs", "unreadable signature"],
)
def test_a_none_from_a_kernel_not_naming_out_is_an_error(kernel, why):
    """Never uninitialised memory: such a kernel may not have looked at the buffer at all."""
    softmax_kernel(kernel)
    with pytest.raises(
        BackendError,
        match=r"the kernel of target 'fake' \[module test_targets\] for tileops::SoftmaxFwdOp "
        rf"returned None, but takes its output buffers \(out\) {why}.*return the result, or "
        r"name out as parameters of the kernel",
    ):
        SoftmaxFwdOp(target="fake")(torch.randn(3, 5))


X = torch.randn(3, 5)
BAD_RETURNS = [
    (
        "int",
        lambda x, **b: 0,
        r"returned int 0; expected None \(having written out in place\) "
        r"or a tensor \(out\)",
    ),
    ("tuple", lambda x, **b: (torch.softmax(x, -1),), r"returned tuple \(tensor\("),
    (
        "shape",
        lambda x, **b: torch.softmax(x, -1)[:2],
        r"returned for output 'out' a contiguous float32 tensor of shape \[2, 5\] on cpu, but "
        r"the op's signature expects a contiguous float32 tensor of shape \[3, 5\] on cpu",
    ),
    ("dtype", lambda x, **b: torch.softmax(x, -1).double(), r"float64 tensor of shape \[3, 5\]"),
    ("device", lambda x, **b: torch.empty(3, 5, device="meta"), r"shape \[3, 5\] on meta"),
    (
        "strides",
        lambda x, **b: torch.softmax(x, -1).t().contiguous().t(),
        r"a non-contiguous float32 tensor of shape \[3, 5\]",
    ),
    (
        "input",
        lambda x, **b: x.copy_(torch.softmax(x, -1)),
        r"returned for output 'out' a tensor sharing memory with its input 'x'",
    ),
    ("view of input", lambda x, **b: x.view(3, 5), r"sharing memory with its input 'x'"),
]


@pytest.mark.parametrize(
    "kernel, match", [c[1:] for c in BAD_RETURNS], ids=[c[0] for c in BAD_RETURNS]
)
def test_a_wrong_return_is_an_error_naming_the_target(kernel, match):
    softmax_kernel(kernel)
    with pytest.raises(BackendError, match=r"the kernel of target 'fake' \[module test_targets\]"):
        SoftmaxFwdOp(target="fake")(X.clone())
    with pytest.raises(BackendError, match=match):
        SoftmaxFwdOp(target="fake")(X.clone())


class RowRangeOp(Op):
    """Two outputs, for targets only: each row's min and max."""

    signature = Signature(
        (Input("x", ("rows", "n")),),
        (),
        (
            Output("low", shape=("rows",), dtype_of="x"),
            Output("high", shape=("rows",), dtype_of="x"),
        ),
    )


def row_range_target(kernel, name="fake"):
    register_detector(target=name, detect=lambda device: False)
    register_kernel_builder(op=RowRangeOp, target=name, build_kernel=lambda x: kernel)
    return RowRangeOp(target=name)


def test_several_outputs_are_returned_as_a_tuple_in_signature_order():
    x = torch.randn(4, 6)
    low, high = row_range_target(lambda x, **buffers: (x.amin(-1), x.amax(-1)))(x)
    assert torch.equal(low, x.amin(-1)) and torch.equal(high, x.amax(-1))

    def kernel(x, *, low, high):
        low.copy_(x.amin(-1))
        high.copy_(x.amax(-1))

    assert torch.equal(row_range_target(kernel, "in place")(x)[1], x.amax(-1))


@pytest.mark.parametrize(
    "kernel, match",
    [
        (
            lambda x, **b: x.amin(-1),
            r"returned Tensor tensor\(.*expected None \(having written "
            r"low, high in place\) or a tuple of 2 tensors \(low, high\)",
        ),
        (lambda x, **b: [x.amin(-1), x.amax(-1)], r"returned list \[tensor"),
        (lambda x, **b: (x.amin(-1), None), r"returned tuple \(tensor"),
        (lambda x, **b: (x.amin(-1), x.amax(-1)[:1]), r"returned for output 'high' a contiguous"),
        (lambda x, *, low, **b: None, r"returned None, but takes its output buffers \(low, high\)"),
    ],
    ids=["one tensor", "list", "None in the tuple", "wrong shape", "one buffer named"],
)
def test_several_outputs_need_a_tuple_of_fitting_tensors(kernel, match):
    with pytest.raises(BackendError, match=match):
        row_range_target(kernel)(torch.randn(4, 6))
