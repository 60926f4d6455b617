"""`tileops audit`: planted gaps and ambiguities are found at their boundaries; the installed
catalogue has none."""

from __future__ import annotations

from cli_kit import plant, rows_kernel

from tileops.backend import register_detector, register_kernel_builder
from tileops.cli import main


def audit(capsys, *args: str) -> tuple[int, str]:
    code = main(["audit", *args])
    return code, capsys.readouterr().out


def test_the_installed_catalogue_has_no_gap_and_no_ambiguity(capsys):
    code, out = audit(capsys)
    assert code == 0, out
    assert "OK: every probed call is served by exactly one kernel" in out
    assert "on cpu, cuda:0 sm_80, cuda:0 sm_86, cuda:0 sm_89, cuda:0 sm_90" in out


def test_a_gap_at_a_region_boundary_is_found_and_fails(capsys, rows_op):
    plant(
        short=rows_kernel("Short", lambda c: None if c.n <= 1024 else "long rows"),
        long=rows_kernel("Long", lambda c: None if c.n > 1025 else "short rows"),
    )
    code, out = audit(capsys, "RowsOp", "--arch", "90")
    assert code == 1
    assert "GAP cli_kit::RowsOp.rows on cuda:0 sm_90: 4 call(s)" in out  # n=1025, 4 dtypes
    assert "e.g. RowsCall(device=device(type='cuda', index=0), n=1025" in out
    assert "short [" in out and "refused: long rows" in out
    assert "note: cli_kit::RowsOp.rows has no kernel for cpu (not a gap)" in out
    assert out.splitlines()[-1] == "FAILED: 1 gap(s)"


def test_an_ambiguity_is_found_and_fails(capsys, rows_op):
    plant(
        a=rows_kernel("A", lambda c: None if c.n <= 4096 else "too long"),
        b=rows_kernel("B", lambda c: None if c.n >= 4096 else "too short"),
    )
    code, out = audit(capsys, "RowsOp", "--arch", "80,90")
    assert code == 1
    assert "AMBIGUITY cli_kit::RowsOp.rows on cuda:0 sm_80: 4 call(s)" in out
    assert "n=4096" in out and "tied: available and applicable; no preference decides" in out
    assert out.splitlines()[-1] == "FAILED: 2 ambiguity(s)"  # one per simulated arch


def test_declared_boundaries_are_probed(capsys, rows_op):
    plant(
        low=rows_kernel(
            "Low", lambda c: None if c.n < 1000 else "n >= 1000", boundaries={"n": (1000,)}
        ),
        high=rows_kernel("High", lambda c: None if c.n > 1000 else "n <= 1000"),
    )
    code, out = audit(capsys, "RowsOp", "--arch", "90")
    assert code == 1 and "n=1000," in out  # 1000 is no power of two: only the declaration finds it


def test_suspicious_declarations_are_warned_about(capsys, rows_op):
    plant(
        main=rows_kernel("Main", preferred_over={"fallbak"}),
        fallback=rows_kernel("Fallback", general=True),
    )
    code, out = audit(capsys, "RowsOp", "--arch", "90")
    assert code == 0
    assert (
        "warning: cli_kit::RowsOp.rows: main is preferred over 'fallbak', which is not installed"
        in out
    )
    assert "did you mean 'fallback'?" in out
    assert "warning: cli_kit::RowsOp.rows: fallback [" in out and "is never chosen" in out


def test_audit_numerics_runs_every_key_here_and_fails_on_a_wrong_one(capsys, tileops_registry):
    from test_numerics_audit import SloppySoftmax

    from tileops import SoftmaxFwdOp
    from tileops.backend import register_kernel_type

    assert main(["audit", "--numerics", "SoftmaxFwdOp", "GemmOp"]) == 0
    out = capsys.readouterr().out
    assert "numerics on cpu" in out and "tileops::GemmOp.gemm" in out and "reference" in out
    register_kernel_type(SoftmaxFwdOp, "sloppy", SloppySoftmax)
    assert main(["audit", "--numerics", "SoftmaxFwdOp"]) == 1
    out = capsys.readouterr().out
    assert "sloppy" in out and "over tolerance" in out


def test_a_target_claiming_a_device_for_ops_it_cannot_build_is_a_finding(capsys, isolated):
    """Every GemmOp on the CPU would settle on 'greedy' and raise: audit fails on it."""
    register_detector("greedy", lambda device: device.type == "cpu")
    register_kernel_builder("SoftmaxFwdOp", "greedy", lambda x, *, dim: None)
    register_detector("wishy", lambda device: "no")
    code, out = audit(capsys, "SoftmaxFwdOp", "GemmOp", "--arch", "90")
    assert code == 1
    assert (
        "UNSERVED CLAIM target 'greedy' (module test_cli_audit): claims cpu but has no kernel "
        "builder for tileops::GemmOp: every call of those ops there settles on it and raises "
        "OpNotAvailableError"
    ) in out
    assert (
        "BROKEN target 'wishy': the detector of target 'wishy' (module test_cli_audit) returned "
        "'no' (str) for cpu; a detector must return a bool"
    ) in out
    assert out.splitlines()[-1] == "FAILED: 1 unserved claim(s), 1 broken(s)"


def test_an_arch_audit_cannot_simulate_is_a_one_line_error(capsys):
    for archs, part in (("80,75", "75"), ("9O", "9O")):
        assert main(["audit", "SoftmaxFwdOp", "--arch", archs]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err == (
            f"tileops: audit --arch {archs}: {part!r} is no arch audit simulates; it knows "
            "80, 86, 89, 90\n"
        )
