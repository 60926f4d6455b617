"""Target "triton": ops opt in by name or process default, the detector claims only ROCm
builds, kernels write the op's output buffers, and calls no Triton kernel can serve raise."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from triton_kit import TOLERANCE, interpreted, rel_error

from tileops.backend import TensorSpec, registered_targets, set_default_target
from tileops.errors import OpNotAvailableError
from tileops.ops import BatchNormFwdOp, GemmOp, LayerNormFwdOp, RMSNormFwdOp, SoftmaxFwdOp
from tileops.registry import REGISTRY
from tileops.testing import isolated_registry
from tileops_triton import target


def test_the_target_is_registered() -> None:
    assert target.NAME in registered_targets()


@pytest.mark.parametrize(("hip", "claimed"), [(None, False), ("6.2.41133", True)])
def test_the_detector_claims_cuda_devices_of_rocm_builds_only(monkeypatch, hip, claimed):
    monkeypatch.setattr(torch.version, "hip", hip)
    assert target.claims_device(torch.device("cuda:0")) is claimed
    assert not target.claims_device(torch.device("cpu"))
    assert not target.claims_device(torch.device("meta"))


@pytest.mark.parametrize(
    ("build", "specs", "params"),
    [
        (target.build_layer_norm, 3, {"normalized_shape": (8,), "eps": 1e-5}),
        (target.build_rms_norm, 2, {"normalized_shape": (8,), "eps": None}),
        (target.build_softmax, 1, {"dim": -1}),
        (target.build_gemm, 3, {"trans_a": False, "trans_b": True}),
    ],
)
def test_builders_raise_for_devices_triton_cannot_run_on(build, specs, params) -> None:
    spec = TensorSpec(torch.device("meta"), torch.float32, (8, 8))
    with pytest.raises(OpNotAvailableError, match="not 'meta'"):
        build(*[spec] * specs, **params)


def test_builders_raise_for_float64() -> None:
    spec = TensorSpec(torch.device("cuda", 0), torch.float64, (4, 4))
    with pytest.raises(OpNotAvailableError, match="not torch.float64"):
        target.build_softmax(spec, dim=0)


def test_importing_the_backend_does_not_import_triton() -> None:
    code = (
        "import sys, tileops_triton; from tileops.ops import LayerNormFwdOp; LayerNormFwdOp(8); "
        "assert 'triton' not in sys.modules, sorted(m for m in sys.modules if 'triton' in m)"
    )
    env = {"TILEOPS_BACKENDS": "triton", "PATH": ""}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


@interpreted
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ops_opting_in_are_served_by_the_target(dtype) -> None:
    x = torch.randn(2, 3, 40).to(dtype)
    w, b = torch.randn(40).to(dtype), torch.randn(40).to(dtype)
    cases = [
        (LayerNormFwdOp(40, target="triton"), (x, w, b),
         F.layer_norm(x.double(), (40,), w.double(), b.double())),
        (RMSNormFwdOp((3, 40), target="triton"), (x, None),
         F.rms_norm(x.double(), (3, 40))),
        (SoftmaxFwdOp(dim=1, target="triton"), (x,), torch.softmax(x.double(), 1)),
        (GemmOp(target="triton"), (x[0], x[1].T), x[0].double() @ x[1].T.double()),
    ]  # fmt: skip
    for op, args, ref in cases:
        assert rel_error(op(*args), ref) < TOLERANCE[dtype]
        assert op.settled_target == "triton"


@interpreted
def test_the_process_default_routes_every_op_to_the_target() -> None:
    with isolated_registry():
        set_default_target("triton")
        ops = [LayerNormFwdOp(16), RMSNormFwdOp(16), SoftmaxFwdOp(), GemmOp()]
        x = torch.randn(4, 16)
        for op, args in zip(ops, [(x, None, None), (x, None), (x,), (x, x.T)], strict=True):
            op(*args)
            assert op.settled_target == "triton"


@interpreted
@pytest.mark.parametrize(("shape", "dim"), [((4, 7), -1), ((2, 3, 5), 0), ((2, 3, 5), 1), ((), 0)])
def test_the_softmax_kernel_writes_the_output_buffer(shape, dim) -> None:
    x = torch.randn(shape)
    kernel = target.build_softmax(TensorSpec.of(x), dim=dim)
    out = torch.full_like(x, float("nan"))
    assert kernel(x, out=out) is None
    torch.testing.assert_close(out, torch.softmax(x, dim))


@interpreted
def test_the_norm_and_gemm_kernels_write_the_output_buffers() -> None:
    x, w = torch.randn(3, 2, 6), torch.randn(2, 6)
    specs = (TensorSpec.of(x), TensorSpec.of(w))
    out = torch.full_like(x, float("nan"))
    target.build_layer_norm(*specs, None, normalized_shape=(2, 6), eps=1e-5)(x, w, None, out=out)
    torch.testing.assert_close(out, F.layer_norm(x, (2, 6), w))
    target.build_rms_norm(*specs, normalized_shape=(2, 6), eps=None)(x, w, out=out)
    torch.testing.assert_close(out, F.rms_norm(x, (2, 6), w))
    a, b = torch.randn(5, 0), torch.randn(0, 4)
    product = torch.full((5, 4), float("nan"))
    layout = {"trans_a": False, "trans_b": False}
    target.build_gemm(TensorSpec.of(a), TensorSpec.of(b), None, **layout)(a, b, None, out=product)
    assert torch.equal(product, torch.zeros(5, 4))


@interpreted
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_the_target_reads_every_gemm_layout_with_a_bias(trans_a, trans_b) -> None:
    a, b, bias = torch.randn(6, 10), torch.randn(10, 7), torch.randn(7)
    given = (a.t().contiguous() if trans_a else a, b.t().contiguous() if trans_b else b)
    op = GemmOp(trans_a, trans_b, target="triton")
    got = op(*given, bias)
    assert op.settled_target == "triton"
    torch.testing.assert_close(got, torch.addmm(bias, a, b), rtol=1e-5, atol=1e-5)


def test_on_rocm_the_target_builds_every_op_of_the_catalogue_its_detector_claims(monkeypatch):
    """The detector claims ROCm's cuda devices for every op, and a call settled on a target
    without a builder for its op raises: so the target must build them all (BatchNorm too)."""
    from tileops.cli import claims

    monkeypatch.setattr(torch.version, "hip", "6.2.41133")
    catalogue = [name for name in REGISTRY.known_ops if name.startswith("tileops::")]
    assert "tileops::BatchNormFwdOp" in catalogue
    cuda = torch.device("cuda:0")
    assert REGISTRY.detectors[target.NAME].claims(cuda)
    found = claims.check([(cuda, None)], catalogue)
    assert found.unserved == [] and found.broken == {}


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("shape", [(4, 3, 5), (6, 3), (2, 3, 2, 2)])
def test_batch_norm_on_the_target_is_served_by_the_ops_reference(training, shape) -> None:
    x, weight, bias = torch.randn(shape), torch.randn(3), torch.randn(3)
    mean, var = torch.randn(3), torch.rand(3) + 0.5
    expected_mean, expected_var = mean.clone(), var.clone()
    expected = F.batch_norm(x, expected_mean, expected_var, weight, bias, training, 0.2, 1e-3)
    op = BatchNormFwdOp(3, eps=1e-3, momentum=0.2, training=training, target=target.NAME)
    torch.testing.assert_close(op(x, weight, bias, mean, var), expected)
    assert op.settled_target == target.NAME
    torch.testing.assert_close((mean, var), (expected_mean, expected_var))


def test_batch_norm_on_the_target_without_values_leaves_the_running_stats() -> None:
    mean, var = torch.zeros(3), torch.ones(3)
    out = BatchNormFwdOp(3, target=target.NAME)(torch.randn(0, 3, 4), None, None, mean, var)
    assert out.shape == (0, 3, 4)
    assert torch.equal(mean, torch.zeros(3)) and torch.equal(var, torch.ones(3))


def test_an_attention_op_settled_on_the_target_runs_its_torch_definition():
    """Triton has no attention kernel: the target builds the op's own reference, so the ROCm
    devices its detector claims are served for attention too, with the op's own results."""
    from tileops.ops import AttentionFwdOp

    q, k, v = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    out, lse = AttentionFwdOp(causal=True, target="triton")(q, k, v)
    want_out, want_lse = AttentionFwdOp(causal=True)(q, k, v)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(lse, want_lse)


def test_gemm_fwd_op_is_built_by_the_target_as_gemm_without_bias() -> None:
    from tileops import GemmFwdOp

    a, b = torch.randn(33, 48), torch.randn(80, 48)  # NT by default: b is (n, k)
    op = GemmFwdOp(target="triton")
    got = op(a, b)
    assert op.serving_target == "triton"
    torch.testing.assert_close(got, a @ b.t(), rtol=1e-5, atol=1e-5)
