"""On a real GPU: device facts come from the call's own device, once, and never on a hit."""

from __future__ import annotations

import pytest
import torch
from dispatch_kit import INTERFACE, call, kernel, make_op

import tileops
from tileops import OpNotAvailableError
from tileops.device import device_facts

pytestmark = pytest.mark.gpu


def test_device_facts_match_the_device_properties():
    props = torch.cuda.get_device_properties(0)
    facts = device_facts(torch.device("cuda:0"))
    assert facts.arch == props.major * 10 + props.minor
    assert facts.sm_count == props.multi_processor_count
    assert facts.calibration == props.name
    assert facts.smem_budget == props.shared_memory_per_block_optin > 0


def test_a_real_device_is_read_on_the_first_miss_only(monkeypatch):
    reads = []
    real = torch.cuda.get_device_properties
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: reads.append(i) or real(i))
    monkeypatch.setattr("tileops.device._cache", {})
    index = torch.cuda.device_count() - 1
    arch = device_facts(torch.device(f"cuda:{index}")).arch
    reads.clear()
    monkeypatch.setattr("tileops.device._cache", {})
    op = make_op({"archbound": kernel("ArchBound", supported_archs={arch})}, name="GpuFactsOp")()
    assert op.key_for(INTERFACE, call(f"cuda:{index}", n=3)) == "archbound"
    op.kernel_for(INTERFACE, call(f"cuda:{index}", n=4))
    op.kernel_for(INTERFACE, call(f"cuda:{index}", n=4))
    assert reads == [index]


def test_ops_without_a_cuda_kernel_say_so_on_cuda_tensors():
    op = make_op({"host": kernel("HostOnly", devices={"cpu"})}, name="GpuHostOnlyOp")()
    with pytest.raises(OpNotAvailableError, match="do not run on 'cuda'"):
        op.kernel_for(INTERFACE, call("cuda:0"))


def test_float64_is_served_on_the_gpu_by_the_reference_kernels():
    x = torch.randn(3, 8, dtype=torch.float64, device="cuda")
    w = torch.randn(8, dtype=torch.float64, device="cuda")
    op = tileops.RMSNormFwdOp(8)
    torch.testing.assert_close(op(x, w), torch.nn.functional.rms_norm(x, (8,), w))
