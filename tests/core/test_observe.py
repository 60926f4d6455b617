"""Observability of the miss path: the `tileops.dispatch` log and the pluggy hooks fire once per
decision and per build, never on a hit; a failing observer never fails the call."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch
from cli_kit import RowsCall, RowsOp, plant, rows_kernel

from tileops import NoImplementationError, RMSNormFwdOp
from tileops.backend import hookimpl
from tileops.observe import add_observer, remove_observer


class Recorder:
    def __init__(self) -> None:
        self.decided: list[tuple] = []
        self.built: list[tuple] = []

    @hookimpl
    def tileops_dispatch_decided(self, op, interface, call, key, source, error):
        self.decided.append((op, interface, key, source, type(error).__name__ if error else None))

    @hookimpl
    def tileops_entry_built(self, op, interface, key, source, identity, seconds):
        self.built.append((op, key, identity, seconds))


@pytest.fixture
def recorder():
    observer = Recorder()
    add_observer(observer)
    yield observer
    remove_observer(observer)


def call(n: int) -> RowsCall:
    return RowsCall(device=torch.device("cpu"), n=n, dtype=torch.float32)


def test_hooks_fire_on_a_miss_and_a_build_never_on_a_hit(recorder, rows_op):
    plant(cpu=rows_kernel("Cpu", devices={"cpu"}))
    op = RowsOp()
    for _ in range(3):
        op.kernel_for("rows", call(7))
    assert recorder.decided == [("cli_kit::RowsOp", "rows", "cpu", recorder.decided[0][3], None)]
    assert recorder.decided[0][3].startswith("module ")  # the test registered it
    (built,) = recorder.built
    assert built[:3] == ("cli_kit::RowsOp", "cpu", ()) and built[3] >= 0
    op.kernel_for("rows", call(8))  # another call: a decision, but the entry is shared
    assert len(recorder.decided) == 2 and len(recorder.built) == 1


def test_a_failed_decision_is_reported_with_its_error(recorder, rows_op):
    plant(cpu=rows_kernel("Cpu", lambda c: "never", devices={"cpu"}))
    with pytest.raises(NoImplementationError):
        RowsOp().kernel_for("rows", call(1))
    assert recorder.decided[-1][2:] == (None, None, "NoImplementationError")


def test_a_raising_observer_warns_and_dispatch_goes_on(rows_op):
    class Broken:
        @hookimpl
        def tileops_dispatch_decided(self, op, interface, call, key, source, error):
            raise RuntimeError("telemetry is down")

    plant(cpu=rows_kernel("Cpu", devices={"cpu"}))
    broken = Broken()
    add_observer(broken)
    try:
        with pytest.warns(RuntimeWarning, match="telemetry is down; dispatch goes on"):
            assert RowsOp().kernel_for("rows", call(3))
    finally:
        remove_observer(broken)


def test_a_misspelt_hook_is_refused_at_registration():
    class Typo:
        @hookimpl
        def tileops_dispatch_decidde(self):
            pass

    with pytest.raises(Exception, match="tileops_dispatch_decidde"):
        add_observer(Typo())


def test_the_dispatch_logger_logs_each_decision_once(caplog, rows_op):
    op = RMSNormFwdOp(24)
    x, w = torch.randn(2, 24, dtype=torch.float64), torch.ones(24, dtype=torch.float64)
    with caplog.at_level(logging.INFO, logger="tileops.dispatch"):
        for _ in range(3):
            op(x, w)
    lines = [r.getMessage() for r in caplog.records if r.name == "tileops.dispatch"]
    assert len(lines) == 1
    assert lines[0].startswith("tileops::RMSNormFwdOp.rms_norm: reference [tileops-core] serves")


def test_tileops_log_prints_decisions_on_stderr():
    script = (
        "import torch, tileops\n"
        "op = tileops.SoftmaxFwdOp()\n"
        "for _ in range(4): op(torch.randn(3, 5))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={**__import__("os").environ, "TILEOPS_LOG": "dispatch"},
    )
    lines = result.stderr.splitlines()
    assert lines == [
        "tileops: tileops::SoftmaxFwdOp.softmax: reference [tileops-core] serves "
        "SoftmaxCall(device=device(type='cpu'), n=5, dtype=torch.float32)"
    ]
