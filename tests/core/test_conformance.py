"""tileops.testing.check_conformance reports a kernel's or a target's mismatches."""

from __future__ import annotations

import pytest
import torch

from tileops import Kernel, RMSNormFwdOp, SoftmaxFwdOp
from tileops.backend import register_detector, register_kernel_builder
from tileops.ops.norm.rms_norm import RMSNormInterface
from tileops.testing import check_conformance


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
