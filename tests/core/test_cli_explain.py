"""`tileops explain`: by inputs or by call-spec fields, real or simulated device, text or JSON,
and the target an op instance would settle on."""

from __future__ import annotations

import json

import pytest

from tileops.backend import register_detector, register_kernel_builder
from tileops.cli import main

H200 = ["--device", "cuda:0", "--arch", "90"]


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_by_inputs_on_a_simulated_h200_builds_the_ops_own_call(capsys):
    code, out, _ = run(
        capsys, "explain", "RMSNormFwdOp", "--shape", "8,4096", "--dtype", "bfloat16", *H200
    )
    assert code == 0
    assert (
        "call: RMSNormFwdOp(normalized_shape=(4096,), eps=None) on x [8, 4096], weight [4096]"
        in out
    )
    assert "device: cuda:0 (simulated: sm_90, 132 SMs, NVIDIA H200" in out
    assert "target: builtin (no target's detector claims cuda:0)" in out
    # eps=None resolves to float32's epsilon for 16-bit inputs, as F.rms_norm does
    assert "n=4096, eps=1.1920928955078125e-07, dtype=torch.bfloat16, has_weight=True" in out
    assert "=> tilelang_block_row (chosen)" in out


def test_json_names_the_winner_its_distribution_and_every_verdict(capsys):
    code, out, _ = run(
        capsys,
        "explain",
        "LayerNormFwdOp",
        "--shape",
        "2,16,1000",
        "--dtype",
        "float16",
        "--json",
        *H200,
    )
    data = json.loads(out)
    assert code == 0
    assert data["op"] == "tileops::LayerNormFwdOp" and data["interface"] == "layer_norm"
    assert data["winner"] == "tilelang_warp_rows"
    assert data["winner_distribution"] == "tileops-cuda"
    assert data["verdicts"]["reference"].startswith("outranked: general")
    assert data["verdicts"]["tilelang_smem_row"].startswith("refused: ")
    assert data["error"] is None and data["target"] == "builtin" and data["target_serves"]


@pytest.mark.parametrize(
    "params, shapes, layout",
    [
        ([], "a [64, 16], b [16, 32]", "trans_a=False, trans_b=False"),
        (["--param", "trans_b=True"], "a [64, 16], b [32, 16]", "trans_a=False, trans_b=True"),
        (["--param", "trans_a=True"], "a [16, 64], b [16, 32]", "trans_a=True, trans_b=False"),
    ],
)
def test_gemm_takes_m_n_k_in_its_layout(capsys, params, shapes, layout):
    args = ["explain", "GemmOp", "--shape", "64,32,16", *params, "--omit", "bias", "--json"]
    code, out, _ = run(capsys, *args)
    data = json.loads(out)
    assert code == 0 and "m=64, n=32, k=16" in data["call"]
    assert f"{layout}, has_bias=False" in data["call"]
    assert data["request"] == f"GemmOp({layout}) on {shapes}"


def test_gemm_takes_its_bias_unless_omitted(capsys):
    code, out, _ = run(capsys, "explain", "GemmOp", "--shape", "64,32,16", "--json")
    data = json.loads(out)
    assert code == 0 and "has_bias=True" in data["call"]
    assert data["request"].endswith("on a [64, 16], b [16, 32], bias [32]")


def test_batch_norm_takes_its_channels_from_dim_1_and_params_by_name(capsys):
    args = ["explain", "BatchNormFwdOp", "--shape", "8,3,5,5", "--param", "training=False"]
    code, out, _ = run(capsys, *args)
    assert code == 0
    assert (
        "batch_norm_fwd_infer for BatchNormCall(device=device(type='cpu'), batch=8, channels=3, "
        "spatial=25" in out
    )


def test_omit_leaves_an_optional_input_out(capsys):
    code, out, _ = run(capsys, "explain", "LayerNormFwdOp", "--shape", "4,8", "--omit", "bias")
    assert code == 0 and "has_weight=True, has_bias=False" in out


def test_bad_inputs_are_the_ops_own_usage_errors(capsys):
    code, _, err = run(capsys, "explain", "GemmOp", "--shape", "4,4")
    assert code == 2 and "--shape 4,4: tileops::GemmOp takes M,N,K, got [4, 4]" in err
    code, _, err = run(capsys, "explain", "RMSNormFwdOp", "--shape", "4,a")
    assert code == 2 and "a shape is integers separated by ',' or 'x'" in err
    code, _, err = run(
        capsys, "explain", "LayerNormFwdOp", "--shape", "4,8", "--param", "normalized_shape=(3,)"
    )
    assert code == 2 and "LayerNormFwdOp(): argument 'x' has shape [4, 8], expected [..., 3]" in err
    code, _, err = run(capsys, "explain", "RMSNormFwdOp", "rms_norm", "--shape", "4,8")
    assert code == 2 and "either --shape" in err


def test_a_target_asked_for_serves_the_call(capsys):
    code, out, _ = run(
        capsys, "explain", "GemmOp", "--shape", "64,64,64", "--target", "triton", *H200
    )
    assert code == 0
    assert (
        "target: triton [tileops-triton-backend, entry point 'triton'] (asked for with target=)"
        in out
    )
    assert "its builder serves every call of this op instance" in out


def test_a_target_without_a_builder_for_the_op_fails(capsys, tileops_registry):
    register_detector("nobuild", lambda device: False)
    code, out, _ = run(
        capsys, "explain", "SoftmaxFwdOp", "--shape", "4,8", "--target", "nobuild", "--json"
    )
    data = json.loads(out)
    assert code == 1 and data["target"] == "nobuild" and not data["target_serves"]
    assert "registered no builder for tileops::SoftmaxFwdOp" in data["target_text"]


def test_a_detector_that_claims_the_device_is_named(capsys, tileops_registry):
    register_detector("claims", lambda device: device.type == "cuda")
    register_kernel_builder("SoftmaxFwdOp", "claims", lambda x, *, dim: None)
    code, out, _ = run(capsys, "explain", "SoftmaxFwdOp", "--shape", "4,8", *H200)
    assert code == 0 and "target: claims [" in out and "(its detector claims cuda:0)" in out
    code, out, _ = run(capsys, "explain", "SoftmaxFwdOp", "--shape", "4,8")
    assert "target: builtin (no target's detector claims cpu)" in out


def test_the_field_form_still_explains_any_interface(capsys):
    code, out, _ = run(
        capsys,
        "explain",
        "RMSNormFwdOp",
        "rms_norm",
        "n=4096",
        "dtype=float16",
        "eps=1e-6",
        "has_weight=true",
        *H200,
        "--calibration",
        "h200",
    )
    assert code == 0 and "=> tilelang_block_row (chosen)" in out
    assert "target: not shown: pass --shape" in out  # RMSNormFwdOp needs normalized_shape


@pytest.mark.parametrize("calibration, board", [("h200", "NVIDIA H200"), ("B200", "B200")])
def test_calibration_takes_short_board_names(capsys, calibration, board):
    code, out, _ = run(
        capsys, "explain", "SoftmaxFwdOp", "--shape", "4,8", *H200, "--calibration", calibration
    )
    assert code == 0 and f"132 SMs, {board}, 232448 B" in out


def usage_error(capsys, *args: str) -> str:
    """Run the command, which must fail with exit 2 and one line on stderr; return that line."""
    code, out, err = run(capsys, *args)
    assert (code, out) == (2, ""), err
    assert err.startswith("tileops: ") and err.count("\n") == 1, err
    return err.strip()


def test_an_input_dtype_the_op_does_not_take_is_its_usage_error(capsys):
    err = usage_error(capsys, "explain", "RMSNormFwdOp", "--shape", "8,4096", "--dtype", "int32")
    assert "RMSNormFwdOp(): argument 'x'" in err and "int32" in err


@pytest.mark.parametrize(
    "shape, message",
    [
        (
            "99999999999999999999,4096",
            "--shape 99999999999999999999,4096: a size is at most 9223372036854775807, "
            "got 99999999999999999999",
        ),
        (
            "9223372036854775807,4096",
            "--shape 9223372036854775807,4096: input 'x' of shape [9223372036854775807, 4096] "
            "would hold more elements than a tensor can (9223372036854775807)",
        ),
    ],
)
def test_a_shape_no_tensor_can_have_is_a_one_line_error(capsys, shape, message):
    assert usage_error(capsys, "explain", "RMSNormFwdOp", "--shape", shape) == f"tileops: {message}"


def test_an_arch_without_a_known_board_needs_its_facts_given(capsys):
    err = usage_error(
        capsys, "explain", "SoftmaxFwdOp", "--shape", "4,8", "--device", "cuda", "--arch", "75"
    )
    assert err == (
        "tileops: --arch 75: no typical board of sm_75 is known (known: 80, 86, 89, 90); pass "
        "--sm-count and --smem-budget (and --calibration to name a board) to simulate it"
    )
    code, out, _ = run(
        capsys, "explain", "SoftmaxFwdOp", "--shape", "4,8", "--device", "cuda", "--arch", "75",
        "--sm-count", "40", "--smem-budget", "65536",
    )  # fmt: skip
    assert code == 0
    assert "device: cuda (simulated: sm_75, 40 SMs, no board model, 65536 B shared memory" in out
    assert "A100" not in out


def test_simulated_facts_need_a_cuda_device(capsys):
    err = usage_error(
        capsys, "explain", "SoftmaxFwdOp", "--shape", "4,8", "--device", "cpu", "--arch", "90"
    )
    assert err == (
        "tileops: --arch simulates a GPU: pass --device cuda (or cuda:N) with it, not --device cpu"
    )
    err = usage_error(capsys, "explain", "SoftmaxFwdOp", "--shape", "4,8", "--sm-count", "10")
    assert (
        err
        == "tileops: --sm-count is a simulated GPU fact: pass --arch (and --device cuda) with it"
    )


@pytest.mark.parametrize(
    ("op", "shown"),
    [
        ("AddRMSNormFwdOp", "on x [8, 4096], residual [8, 4096], weight [4096]"),
        ("GLUFwdOp", "on gate [8, 4096], up [8, 4096]"),
    ],
)
def test_inputs_with_batch_dims_take_the_first_inputs(capsys, op, shown):
    code, out, _ = run(capsys, "explain", op, "--shape", "8,4096", "--dtype", "bfloat16")
    assert code == 0 and shown in out
