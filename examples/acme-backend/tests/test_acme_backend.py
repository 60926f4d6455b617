"""acme's own tests: its kernels agree with tileops' reference kernels over every op's sample
calls (tileops.testing.check_conformance), and acme takes nothing it did not ask for."""

from __future__ import annotations

import pytest
import torch

import tileops_acme
from tileops.backend import TensorSpec
from tileops.ops import RMSNormCall, RMSNormFwdOp, SoftmaxFwdOp
from tileops.testing import check_conformance
from tileops_acme.softmax import build_softmax, claims_device


def test_the_rms_norm_kernel_conforms_where_it_serves() -> None:
    report = check_conformance(
        RMSNormFwdOp, kernel=(tileops_acme.RMS_NORM_KEY, tileops_acme.AcmeRMSNorm)
    )
    assert report.ok, str(report)
    assert report.not_served, "the sample calls without weight or in 16 bits are not acme's"


def test_the_acme_target_conforms_for_every_call() -> None:
    report = check_conformance(SoftmaxFwdOp, target=tileops_acme.TARGET)
    assert report.ok, str(report)
    assert not report.not_served


def rms_norm_call(**changes: object) -> RMSNormCall:
    fields = dict(device=torch.device("cpu"), n=64, eps=1e-6, dtype=torch.float32, has_weight=True)
    return RMSNormCall(**{**fields, **changes})


def test_the_kernel_serves_float32_rows_of_multiples_of_8_with_a_weight() -> None:
    assert RMSNormFwdOp(64).key_for("rms_norm", rms_norm_call()) == tileops_acme.RMS_NORM_KEY


@pytest.mark.parametrize(
    ("changes", "sentence"),
    [
        ({"dtype": torch.bfloat16}, "serves float32 only, not torch.bfloat16"),
        ({"n": 60}, "n=60 is not a multiple of 8"),
        ({"has_weight": False}, "needs a weight"),
    ],
)
def test_calls_it_refuses_stay_with_the_reference_and_say_why(changes, sentence) -> None:
    op, call = RMSNormFwdOp(64), rms_norm_call(**changes)
    assert op.key_for("rms_norm", call) == "reference"
    explanation = op.explain("rms_norm", call)
    assert explanation.verdict(tileops_acme.RMS_NORM_KEY) == "refused"
    assert sentence in explanation.text


def test_the_target_claims_no_device_so_ops_opt_in() -> None:
    assert not any(claims_device(torch.device(d)) for d in ("cpu", "meta", "cuda"))
    plain, opted = SoftmaxFwdOp(), SoftmaxFwdOp(target=tileops_acme.TARGET)
    x = torch.randn(3, 5)
    torch.testing.assert_close(plain(x), opted(x))
    assert (plain.settled_target, opted.settled_target) == ("builtin", tileops_acme.TARGET)


@pytest.mark.parametrize(("shape", "dim"), [((4, 7), -1), ((2, 3, 5), 1), ((), 0)])
def test_the_built_kernel_writes_into_the_output_buffer(shape, dim) -> None:
    x = torch.randn(shape)
    kernel = build_softmax(TensorSpec.of(x), dim=dim)
    out = torch.full_like(x, float("nan"))
    assert kernel(x, out=out) is None
    torch.testing.assert_close(out, torch.softmax(x, dim))
