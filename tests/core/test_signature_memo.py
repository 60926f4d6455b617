"""An op instance remembers the checks' verdict per input layout; the memo never hides an error."""

from __future__ import annotations

import pytest
import torch

from tileops import BatchNormFwdOp, GemmOp, OpInputError, RMSNormFwdOp


def test_a_bad_call_after_a_good_one_with_the_same_shapes_still_fails():
    op = RMSNormFwdOp(8)
    x, w = torch.randn(2, 8), torch.randn(8)
    op(x, w)
    with pytest.raises(OpInputError, match="argument 'weight' has dtype float16"):
        op(x, w.half())
    with pytest.raises(OpInputError, match="argument 'weight' must be a torch.Tensor"):
        op(x, [1.0] * 8)
    with pytest.raises(OpInputError, match="argument 'weight' is on meta"):
        op(x, w.to("meta"))


def test_a_written_input_must_stay_contiguous_on_every_call():
    op = BatchNormFwdOp(3)
    x, stats = torch.randn(4, 3), torch.zeros(3, 2)
    op(x, None, None, stats[:, 0].contiguous(), torch.ones(3))
    with pytest.raises(OpInputError, match="'running_mean' is written in place and must be"):
        op(x, None, None, stats[:, 0], torch.ones(3))


def test_verdicts_are_reused_and_bounded():
    op = GemmOp()
    for m in range(1, 300):
        assert op(torch.randn(m, 2), torch.randn(2, 3)).shape == (m, 3)
    plan = op._shape_plan
    assert 0 < len(plan.verdicts) <= 256
    before = dict(plan.verdicts)
    op(torch.randn(299, 2), torch.randn(2, 3))
    assert plan.verdicts == before
