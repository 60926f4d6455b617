"""The `tileops` command: list what is installed, explain one call."""

from __future__ import annotations

import subprocess
import sys

from tileops import RMSNormFwdOp
from tileops.backend import register_kernel_type
from tileops.cli import main
from tileops.ops.norm.rms_norm import RMSNormReference


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
            "dtype=float16",
            "--device",
            "cuda:0",
            "--arch",
            "90",
        ]
    )
    out = capsys.readouterr()
    assert "reference [tileops-core]: unavailable: runs on cpu, meta, not cuda" in out.out + out.err
    assert code in (0, 2)


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


def test_list_reports_an_op_that_cannot_be_constructed_and_goes_on(capsys, tileops_registry):
    register_kernel_type(RMSNormFwdOp, "reference", RMSNormReference)
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "RMSNormFwdOp: cannot be constructed:" in out and "reuse keys it has" in out
    assert "SoftmaxFwdOp.softmax" in out


def test_explain_for_a_missing_gpu_asks_for_a_simulation(capsys, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    args = ["explain", "SoftmaxFwdOp", "softmax", "n=8", "dtype=float32", "--device", "cuda:0"]
    assert main(args) == 2
    assert "has no cuda:0; pass --arch (and --sm-count) to simulate" in capsys.readouterr().err
