"""The `tileops` command: list what is installed, explain one call."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest
from dispatch_kit import Binary, kernel, make_op

import tileops
from tileops.cli import main
from tileops.registry import REGISTRY


def test_list_shows_ops_keys_sources_and_backends(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "RMSNormFwdOp.rms_norm" in out
    assert "reference" in out and "tileops-core" in out
    assert "tileops-cuda" in out and "Load failures: none" in out


def test_explain_simulates_the_device(capsys):
    code = main(
        [
            "explain",
            "GemmOp",
            "gemm",
            "m=64",
            "n=64",
            "k=64",
            "dtype=float64",
            "--device",
            "cuda:0",
            "--arch",
            "90",
        ]
    )
    out = capsys.readouterr().out
    # TileLang's kernels refuse float64; cuBLAS serves it on the GPU, not the CPU-style reference
    assert "tileops::GemmOp.gemm for GemmCall(device=device(type='cuda', index=0)" in out
    assert "=> cublas (chosen)" in out and code == 0


def test_explain_on_cpu_chooses_the_reference(capsys):
    assert main(["explain", "SoftmaxFwdOp", "softmax", "n=128", "dtype=bfloat16"]) == 0
    assert "=> reference (chosen)" in capsys.readouterr().out


def test_bad_field_names_the_known_ones(capsys):
    assert main(["explain", "SoftmaxFwdOp", "softmax", "rows=3"]) == 2
    assert "expected FIELD=VALUE with FIELD one of n, dtype" in capsys.readouterr().err


def test_unknown_op_suggests_the_closest(capsys):
    assert main(["explain", "RMSNormOp", "rms_norm"]) == 2
    assert "Did you mean RMSNormFwdOp" in capsys.readouterr().err


def test_console_script_is_installed():
    result = subprocess.run(
        [sys.executable, "-m", "tileops.cli", "list"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "GemmOp.gemm" in result.stdout


@pytest.fixture
def broken_op():
    """An op whose own kernel implements none of its interfaces: it cannot be constructed."""
    broken = make_op({"stray": kernel("Stray", base=Binary)}, name="BrokenOp")
    yield broken
    del REGISTRY.known_ops[broken.op_name]


def test_list_reports_an_op_that_cannot_be_constructed_and_goes_on(capsys, broken_op):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "dispatch_kit::BrokenOp: cannot be constructed:" in out
    assert "implements none of the op's interfaces" in out
    assert "tileops::SoftmaxFwdOp.softmax" in out


def test_explain_for_a_missing_gpu_asks_for_a_simulation(capsys, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    args = ["explain", "SoftmaxFwdOp", "softmax", "n=8", "dtype=float32", "--device", "cuda:0"]
    assert main(args) == 2
    assert "has no cuda:0; pass --arch (and --sm-count) to simulate" in capsys.readouterr().err


def test_version_prints_tileops_core_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    version = importlib.metadata.version("tileops-core")
    assert capsys.readouterr().out.strip() == f"tileops-core {version}"
    assert version == tileops.__version__


def test_explain_exits_1_when_dispatch_would_fail_and_still_prints_verdicts(capsys):
    args = ["explain", "GemmOp", "gemm", "m=4", "n=4", "k=4", "dtype=float32"]
    assert main(args) == 0
    capsys.readouterr()
    assert main([*args, "--device", "mps"]) == 1  # no installed kernel runs on mps
    out = capsys.readouterr().out
    assert "reference [tileops-core]: unavailable: runs on cpu, cuda, meta, not mps" in out
    assert "=> OpNotAvailableError:" in out


@pytest.mark.parametrize(
    "field, message",
    [
        (
            "has_weight=maybe",
            "field 'has_weight' expects a bool (true, 1, yes, false, 0, no), got 'maybe'",
        ),
        ("n=abc", "field 'n' expects an int, got 'abc'"),
        ("eps=tiny", "field 'eps' expects a float, got 'tiny'"),
        ("dtype=float8", "field 'dtype': 'float8' is not a torch dtype"),
    ],
)
def test_bad_field_values_name_the_field_and_what_it_takes(capsys, field, message):
    assert main(["explain", "RMSNormFwdOp", "rms_norm", "n=8", "dtype=float32", field]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("text, value", [("TRUE", True), ("1", True), ("no", False)])
def test_bool_fields_take_the_usual_spellings(capsys, text, value):
    args = ["explain", "RMSNormFwdOp", "rms_norm", "n=8", "eps=0.1", "dtype=float32"]
    args.append(f"has_weight={text}")
    assert main(args) == 0
    assert f"has_weight={value}" in capsys.readouterr().out


def test_a_bogus_device_is_a_one_line_error():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tileops.cli",
            "explain",
            "SoftmaxFwdOp",
            "softmax",
            "--device",
            "bogus",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr == (
        "tileops: --device 'bogus' is not a torch device (e.g. cpu, cuda, cuda:0); a device "
        "kind of its own reaches torch as privateuse1, once its backend names it with "
        "torch.utils.rename_privateuse1_backend('bogus') (docs/backends.md)\n"
    )
