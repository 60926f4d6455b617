"""What a backend author is told: forgotten `devices`, misspelt preferences, the "do not run on"
message, and conformance cases of their own."""

from __future__ import annotations

import pytest
import torch
from cli_kit import RowsCall, RowsOp, plant, rows_kernel

from tileops import OpNotAvailableError, RMSNormFwdOp
from tileops.ops import RMSNormInterface
from tileops.ops.norm.rms_norm import RMSNormReference
from tileops.testing import case, check_conformance


def cpu_call(n: int = 4) -> RowsCall:
    return RowsCall(device=torch.device("cpu"), n=n, dtype=torch.float32)


def test_explain_says_a_kernel_without_devices_runs_on_cuda_only(rows_op):
    plant(forgetful=rows_kernel("Forgetful"))
    text = RowsOp().explain("rows", cpu_call()).text
    assert "forgetful [" in text and "unavailable: runs on cuda, not cpu" in text
    assert "note: forgetful declares no `devices`, so it runs on cuda only (the default)" in text
    assert "must declare `devices = {'cpu'}`" in text


def test_explain_suggests_the_key_a_misspelt_preference_meant(rows_op):
    plant(
        fast=rows_kernel("Fast", devices={"cpu"}, preferred_over={"slwo"}),
        slow=rows_kernel("Slow", devices={"cpu"}),
    )
    explanation = RowsOp().explain("rows", cpu_call())
    assert "fast is preferred over 'slwo', which is not installed" in explanation.text
    assert "did you mean 'slow'?" in explanation.text
    assert explanation.error is not None  # the typo left fast and slow tied


def test_not_running_on_a_device_does_not_blame_in_tree_kernels(rows_op):
    plant(gpu=rows_kernel("Gpu"))
    with pytest.raises(OpNotAvailableError) as caught:
        RowsOp().kernel_for("rows", cpu_call())
    first = str(caught.value).splitlines()[0]
    assert first == "cli_kit::RowsOp.rows: the installed kernels do not run on 'cpu'."


class EveryOther(RMSNormReference, RMSNormInterface):
    """Serves only even row lengths: a refusal boundary the sample cases never reach."""

    general = False

    @classmethod
    def refusal(cls, call):
        return None if call.n % 2 == 0 else f"odd rows ({call.n})"


def test_check_conformance_takes_cases_of_the_backends_own():
    report = check_conformance(
        RMSNormFwdOp,
        kernel=("every_other", EveryOther),
        dtypes=[torch.float32],
        cases=[
            case({"normalized_shape": (1025,)}, (3, 1025), (1025,), note="odd"),
            case({"normalized_shape": (1024,)}, (3, 1024), (1024,), note="even"),
        ],
    )
    assert report.ok, str(report)
    assert report.checked == 4  # 3 samples (all even) + "even"
    assert report.not_served == [
        "params(normalized_shape=(1025,)) inputs([3, 1025], [1025]) odd [float32]"
    ]
