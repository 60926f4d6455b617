"""`tileops list --json`, `doctor`, `warmup`, `demo` and `python -m tileops`: output and exit
codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cli_kit import plant, rows_kernel, rows_op_known

from tileops import Kernel, SoftmaxFwdOp, table
from tileops.backend import register_detector, register_kernel_builder, register_kernel_type
from tileops.cli import main
from tileops.ops import SoftmaxInterface
from tileops.plugins import LOADER, LoadFailure


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
    assert "TILEOPS_LOG='dispatch'" in out
    assert "warning: cli_kit::RowsOp.rows: a is preferred over 'bb'" in out
    # The typo left a and b tied: audit's sweep finds it, and doctor fails on it.
    assert code == 1 and "ERROR: AMBIGUITY cli_kit::RowsOp.rows on cuda:0 sm_80" in out


def test_warmup_builds_entries_shows_progress_and_sums_up(capsys, monkeypatch):
    """On fresh tables: earlier tests in the process may have built the same entries."""
    monkeypatch.setattr(table, "_tables", {})
    monkeypatch.setattr(table, "_shared", {})
    args = ["warmup", "--op", "LayerNormFwdOp", "--shapes", "2,24;3,40", "--dtype", "float64"]
    code, out, err = run(capsys, *args)
    assert code == 0
    assert "[########################] 2/2 LayerNormFwdOp 3x40 float64" in err
    assert out.startswith("warmup: 2 call(s), ")
    assert "interface" in out and "build s" in out


def test_warmup_reports_a_call_it_cannot_build_and_exits_1(capsys, tileops_registry):
    class Unbuildable(Kernel, SoftmaxInterface):
        devices = {"cpu"}
        preferred_over = {"reference"}

        @classmethod
        def entry_for(cls, call):
            def build():
                raise RuntimeError("no compiler here")

            return (), build

    register_kernel_type(SoftmaxFwdOp, "unbuildable", Unbuildable)
    code, out, _ = run(capsys, "warmup", "--op", "SoftmaxFwdOp", "--shapes", "4,4")
    assert code == 1 and "FAILED SoftmaxFwdOp 4x4 float32: RuntimeError: no compiler here" in out


def usage_error(capsys, *args: str) -> str:
    """Run the command, which must fail with exit 2 and one line on stderr; return that line."""
    code, out, err = run(capsys, *args)
    assert (code, out) == (2, ""), err
    assert err.startswith("tileops: ") and err.count("\n") == 1, err
    return err.strip()


def test_warmup_shapes_an_op_cannot_take_are_a_usage_error_naming_the_flag(capsys):
    err = usage_error(
        capsys, "warmup", "--op", "SoftmaxFwdOp", "--op", "GemmOp", "--shapes", "8,4096"
    )
    assert err == "tileops: --shapes 8,4096: tileops::GemmOp takes M,N,K, got [8, 4096]"
    # one line on stderr: no progress line, so nothing (not SoftmaxFwdOp's call) was built


def test_warmup_refuses_a_bad_dtype_before_building(capsys):
    err = usage_error(
        capsys, "warmup", "--op", "LayerNormFwdOp", "--shapes", "2,8", "--dtype", "int64"
    )
    assert err.startswith("tileops: LayerNormFwdOp 2x8 int64: tileops::LayerNormFwdOp(): ")
    assert "argument 'x'" in err and "int64" in err  # the op's own message


def test_demo_on_a_gpu_this_machine_lacks_is_a_one_line_error(capsys, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    err = usage_error(capsys, "demo", "--device", "cuda:0")
    assert err == (
        "tileops: demo --device cuda:0: this machine has no cuda:0; leave --device out to run "
        "on the best device here"
    )


def test_demo_on_meta_is_a_one_line_error(capsys):
    err = usage_error(capsys, "demo", "--device", "meta")
    assert err == (
        "tileops: demo --device meta: meta tensors hold no data, so nothing can run or be "
        "checked; pass cpu or cuda"
    )


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


def test_doctor_reports_a_target_claiming_this_machines_cpu_for_ops_it_cannot_build(
    capsys, tileops_registry
):
    register_detector("greedy", lambda device: device.type == "cpu")
    register_kernel_builder("SoftmaxFwdOp", "greedy", lambda x, *, dim: None)
    code, out = run(capsys, "doctor")[:2]
    assert code == 1
    [line] = [line for line in out.splitlines() if "target 'greedy'" in line]
    assert line.startswith(
        "  ERROR: target 'greedy' (module test_cli_commands) claims cpu but has no kernel "
        "builder for "
    )
    assert "tileops::GemmOp" in line and "tileops::SoftmaxFwdOp" not in line
    assert "construct such ops with target=BUILTIN" in out
