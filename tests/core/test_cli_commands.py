"""`tileops list --json`, `doctor`, `warmup`, `demo` and `python -m tileops`: output and exit
codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cli_kit import plant, rows_kernel, rows_op_known

from tileops.backend import register_detector, register_kernel_builder
from tileops.backend.plugins import LOADER, LoadFailure
from tileops.cli import main


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_list_json_has_backends_ops_keys_and_what_each_target_serves(capsys):
    code, out, _ = run(capsys, "list", "--json")
    data = json.loads(out)
    assert code == 0
    assert {b["distribution"] for b in data["backends"]} >= {"tileops-cuda"}
    assert all(b["protocol"] == 1 for b in data["backends"])
    rms = next(op for op in data["ops"] if op["name"] == "tileops::RMSNormFwdOp")
    iface = next(i for i in rms["interfaces"] if i["name"] == "rms_norm")
    assert iface["call_spec"] == "RMSNormCall" and "eps" in iface["call_fields"]
    reference = next(k for k in iface["keys"] if k["key"] == "reference")
    assert reference["general"] and reference["source"] == "tileops-core"
    triton = next(t for t in data["targets"] if t["name"] == "triton")
    assert "tileops::GemmOp" in triton["serves"]


def test_list_text_says_which_ops_a_target_serves(capsys, tileops_registry):
    register_detector("mine", lambda device: False)
    register_kernel_builder("SoftmaxFwdOp", "mine", lambda x, *, dim: None)
    code, out, _ = run(capsys, "list")
    assert code == 0 and "  mine: serves SoftmaxFwdOp; detector from " in out


def test_doctor_on_a_clean_install_reports_versions_and_no_problem(capsys):
    code, out, _ = run(capsys, "doctor")
    assert code == 0
    for line in ("Versions:", "  torch ", "  tileops-core 0.1.0", "GPUs:", "Settings:"):
        assert line in out
    assert "Problems: none" in out


def test_doctor_gives_a_remedy_for_a_load_failure_and_exits_1(capsys, monkeypatch):
    failure = LoadFailure("broken", "broken-backend", "ImportError: no module named x")
    monkeypatch.setattr(LOADER, "failures", [failure])
    code, out, _ = run(capsys, "doctor")
    assert code == 1
    assert "ERROR: backend not loaded: broken (broken-backend): ImportError" in out
    assert "TILEOPS_DISABLE_BACKENDS=broken skips it" in out


def test_doctor_warns_about_a_misspelt_preference(capsys, monkeypatch):
    monkeypatch.setenv("TILEOPS_LOG", "dispatch")
    with rows_op_known():
        from tileops.testing import isolated_registry

        with isolated_registry():
            plant(a=rows_kernel("A", preferred_over={"bb"}), b=rows_kernel("B"))
            code, out, _ = run(capsys, "doctor")
    assert code == 0  # warnings only
    assert "TILEOPS_LOG='dispatch'" in out
    assert "warning: cli_kit::RowsOp.rows: a is preferred over 'bb'" in out


def test_warmup_builds_entries_shows_progress_and_sums_up(capsys):
    args = ["warmup", "--op", "LayerNormFwdOp", "--shapes", "2,24;3,40", "--dtype", "float64"]
    code, out, err = run(capsys, *args)
    assert code == 0
    assert "[########################] 2/2 LayerNormFwdOp 3x40 float64" in err
    assert out.startswith("warmup: 2 call(s), ")
    assert "interface" in out and "build s" in out


def test_warmup_reports_a_call_it_cannot_build_and_exits_1(capsys):
    code, out, _ = run(capsys, "warmup", "--op", "GemmOp", "--shapes", "4,4")
    assert code == 1 and "FAILED GemmOp 4x4 float32: ValueError: " in out


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_demo_runs_every_op_on_the_best_device_and_explains_one_call(capsys):
    code, out, _ = run(capsys, "demo")
    assert code == 0
    head = "op              shape        dtype     device  served by"
    assert any(line.startswith(head[:40]) for line in out.splitlines())
    for op in ("LayerNormFwdOp", "RMSNormFwdOp", "SoftmaxFwdOp", "BatchNormFwdOp", "GemmOp"):
        assert f"\n{op} " in out
    assert "reference [tileops-core]" in out and "max |error|" in out
    assert "Why this kernel?" in out and "=> " in out


def test_python_dash_m_tileops_runs_the_command():
    result = subprocess.run(
        [sys.executable, "-m", "tileops", "explain", "SoftmaxFwdOp", "--shape", "2,3", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["winner"] == "reference"
