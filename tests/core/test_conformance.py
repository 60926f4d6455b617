"""tileops.testing.check_conformance reports a kernel's or a target's mismatches."""

from __future__ import annotations

import pytest
import torch

from tileops import BatchNormFwdOp, Kernel, RMSNormFwdOp, SoftmaxFwdOp
from tileops.backend import register_detector, register_kernel_builder
from tileops.ops import BatchNormInferInterface, SoftmaxInterface
from tileops.ops.norm.rms_norm import RMSNormInterface
from tileops.testing import TOLERANCES, check_conformance, isolated_registry, simulate_device


class GoodRMSNorm(Kernel, RMSNormInterface):
    devices = {"cpu"}

    def forward(self, x, weight):
        y = torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), None, None)
        y = y if weight is None else y * weight.float()
        return y.to(x.dtype)


class SloppyRMSNorm(GoodRMSNorm):
    def forward(self, x, weight):
        return super().forward(x, weight) * 1.01


class PickyRMSNorm(GoodRMSNorm):
    @classmethod
    def refusal(cls, call):
        return None if call.has_weight else "needs a weight"


def test_a_correct_kernel_conforms():
    report = check_conformance(RMSNormFwdOp, kernel=("good", GoodRMSNorm))
    assert report.ok, str(report)
    assert report.checked > 0


def test_a_wrong_kernel_is_reported_with_the_case_and_dtype():
    report = check_conformance(
        RMSNormFwdOp, kernel=("sloppy", SloppyRMSNorm), dtypes=[torch.float32]
    )
    assert not report.ok
    assert report.mismatches and "[float32]" in str(report.mismatches[0])
    assert "mismatch:" in str(report)


def test_calls_a_kernel_refuses_are_counted_not_compared():
    report = check_conformance(RMSNormFwdOp, kernel=("picky", PickyRMSNorm), dtypes=[torch.float32])
    assert report.ok and report.not_served


def test_a_target_is_checked_through_its_builder(tileops_registry):
    def build(x, *, dim):
        return lambda x, **out: next(iter(out.values())).copy_(torch.softmax(x.float(), dim))

    register_detector(target="fake", detect=lambda device: False)
    register_kernel_builder(op=SoftmaxFwdOp, target="fake", build_kernel=build)
    report = check_conformance(SoftmaxFwdOp, target="fake")
    assert report.ok, str(report)


def test_kernel_or_target_is_required():
    with pytest.raises(ValueError, match="exactly one of kernel"):
        check_conformance(SoftmaxFwdOp)


# -- kernels that corrupt their inputs -------------------------------------------------------


class ZeroingSoftmax(Kernel, SoftmaxInterface):
    """Right result, but zeroes x (the caller's own tensor when it is already rows)."""

    devices = {"cpu"}

    def forward(self, x):
        y = torch.softmax(x.float(), -1).to(x.dtype)
        x.zero_()
        return y


class InPlaceSoftmax(Kernel, SoftmaxInterface):
    """Right values, written into x and returned: the op's output is the caller's input."""

    devices = {"cpu"}

    def forward(self, x):
        return x.copy_(torch.softmax(x.float(), -1))


class DoublingRMSNorm(GoodRMSNorm):
    """Right result, but doubles weight afterwards."""

    def forward(self, x, weight):
        y = super().forward(x, weight)
        if weight is not None:
            weight.mul_(2)
        return y


class StatsScribblingBatchNorm(Kernel, BatchNormInferInterface):
    """Right result in inference, which only reads the running stats; it overwrites them."""

    devices = {"cpu"}

    def forward(self, x, weight, bias, running_mean, running_var):
        y = torch.nn.functional.batch_norm(x, running_mean, running_var, weight, bias, False)
        running_mean.zero_()
        return y


def details(report) -> list[str]:
    return [m.detail for m in report.mismatches]


def test_a_kernel_changing_an_input_the_op_does_not_write_is_a_mismatch():
    report = check_conformance(SoftmaxFwdOp, kernel=("zeroing", ZeroingSoftmax))
    assert not report.ok
    assert "input 'x' was changed by the call; the op does not write it" in str(report)
    report = check_conformance(RMSNormFwdOp, kernel=("doubling", DoublingRMSNorm))
    assert "input 'weight' was changed by the call" in str(report)
    assert all("'x'" not in d for d in details(report))


def test_an_output_sharing_memory_with_an_input_is_a_mismatch():
    report = check_conformance(SoftmaxFwdOp, kernel=("in_place", InPlaceSoftmax))
    assert not report.ok
    assert "output 0 shares memory with input 'x'" in str(report)


def test_inputs_read_only_in_inference_must_stay_as_they_were():
    """BatchNorm writes its running stats in training only: compared with the reference there,
    and required unchanged in inference."""
    report = check_conformance(BatchNormFwdOp, kernel=("scribbling", StatsScribblingBatchNorm))
    assert report.checked and not report.ok
    assert "input 'running_mean' was changed by the call; the op does not write it" in str(report)


def test_written_inputs_are_compared_with_the_reference_not_required_unchanged():
    """The training reference updates the running stats; a conforming kernel does the same."""

    class ReferenceTrain(BatchNormFwdOp.kernel_types["reference"]):
        general = False

    report = check_conformance(BatchNormFwdOp, kernel=("train", ReferenceTrain))
    assert report.ok, str(report)


def test_a_target_corrupting_its_input_is_a_mismatch(tileops_registry):
    def build(x, *, dim):
        def kernel(x, *, out):
            out.copy_(torch.softmax(x.float(), dim))
            x.zero_()

        return kernel

    register_detector(target="zeroing", detect=lambda device: False)
    register_kernel_builder(op=SoftmaxFwdOp, target="zeroing", build_kernel=build)
    report = check_conformance(SoftmaxFwdOp, target="zeroing")
    assert "input 'x' was changed by the call" in str(report)


class CudaRMSNorm(GoodRMSNorm):
    """A CUDA kernel written in torch: its numerics can be checked on CPU tensors."""

    devices = {"cuda"}
    supported_archs = {90}

    @classmethod
    def refusal(cls, call):
        return None if call.sm_count == 132 else f"tuned for 132 SMs, not {call.sm_count}"


needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU-less path")


@needs_no_gpu
def test_a_cuda_kernel_is_checked_without_a_gpu_through_a_cpu_twin():
    with simulate_device("cuda", arch=90, sm_count=132):
        report = check_conformance(
            RMSNormFwdOp, kernel=("cuda_rms", CudaRMSNorm), device="cuda", dtypes=[torch.float32]
        )
    assert report.ok and not report.not_served, str(report)
    assert report.subject.endswith("(a CPU twin, the CPU simulated as cuda)")


@needs_no_gpu
def test_the_twin_sees_the_simulated_facts():
    with simulate_device("cuda:0", arch=90, sm_count=100):
        report = check_conformance(
            RMSNormFwdOp, kernel=("cuda_rms", CudaRMSNorm), device="cuda:0", dtypes=[torch.float32]
        )
    assert not report.ok and report.checked == 0 and len(report.not_served) == 3


@needs_no_gpu
def test_cuda_conformance_without_a_gpu_or_a_simulation_says_what_to_do():
    with pytest.raises(ValueError, match=r"no CUDA device.*simulate_device\('cuda', arch="):
        check_conformance(RMSNormFwdOp, kernel=("cuda_rms", CudaRMSNorm), device="cuda")


def test_float64_has_a_stated_tolerance():
    assert TOLERANCES[torch.float64] == 1e-5 and set(TOLERANCES) >= {torch.float32, torch.float16}


def test_isolating_to_a_backend_that_is_not_loaded_is_refused():
    with pytest.raises(ValueError, match=r"'acme_typo' names no loaded backend; loaded: "):
        with isolated_registry(backends=["acme_typo"]):
            pass


class WrongInTree(GoodRMSNorm):
    """An op's own non-reference kernel, off by 1%: must not be compared with itself."""

    def forward(self, x, weight):
        return super().forward(x, weight) * 1.01


class RMSNormWithOwnKernel(RMSNormFwdOp):
    namespace = "conformance_test"
    kernel_types = {**RMSNormFwdOp.kernel_types, "own_fast": WrongInTree}


def test_an_in_tree_kernel_is_checked_in_place_against_the_general_kernel():
    report = check_conformance(
        RMSNormWithOwnKernel, kernel=("own_fast", WrongInTree), dtypes=[torch.float32]
    )
    assert report.checked == 3 and len(report.mismatches) == 3
