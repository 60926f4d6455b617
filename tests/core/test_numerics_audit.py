"""The numerics audit runs every key on this machine and catches a wrong one."""

from __future__ import annotations

import torch

import tileops
from tileops import Kernel
from tileops.backend import register_kernel_type
from tileops.numerics import audit_numerics, report
from tileops.ops import SoftmaxInterface

CPU = torch.device("cpu")


class SloppySoftmax(Kernel, SoftmaxInterface):
    """Off by 10%: the audit must say so."""

    devices = {"cpu"}

    def forward(self, x):
        return (torch.softmax(x.float(), -1) * 1.1).to(x.dtype)


def test_every_reference_key_passes_on_the_cpu():
    ops = [tileops.LayerNormFwdOp, tileops.RMSNormFwdOp, tileops.SoftmaxFwdOp]
    ops += [tileops.BatchNormFwdOp, tileops.GemmOp]
    results = audit_numerics(ops, CPU)
    references = [r for r in results if r.key.startswith("reference")]
    assert {r.op for r in references} == {op.op_name for op in ops}
    assert all(r.ok and r.checked > 0 for r in references), report(references, CPU)


def test_a_wrong_kernel_is_reported_with_its_worst_error(tileops_registry):
    register_kernel_type(tileops.SoftmaxFwdOp, "sloppy", SloppySoftmax)
    results = {r.key: r for r in audit_numerics([tileops.SoftmaxFwdOp], CPU)}
    sloppy = results["sloppy"]
    assert not sloppy.ok and sloppy.worst > 0.05 and sloppy.checked == 8  # 2 cases x 4 dtypes
    assert results["reference"].ok
    text = report(list(results.values()), CPU)
    assert "sloppy" in text and "over tolerance" in text
    assert "sloppy [module test_numerics_audit] params(dim=-1) inputs([16, 100]) float32" in text
