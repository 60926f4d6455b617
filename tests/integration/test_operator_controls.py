"""The operator settles what backends cannot: TILEOPS_PREFER / TILEOPS_DENY / TILEOPS_PIN, in
fresh interpreters with real distributions installed."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conftest import Sites

# acme and fastnorm both serve a float32 RMSNorm call with a weight on the CPU.
SETTLE = """
warned = load_backends()
import torch
from tileops import TileOpsError
from tileops.backend import load_failures
from tileops.ops import RMSNormCall, RMSNormFwdOp
call = RMSNormCall(device=torch.device("cpu"), n=64, eps=1e-6, dtype=torch.float32,
                   has_weight=True)
op = RMSNormFwdOp(64)
try:
    key, error = op.key_for("rms_norm", call), None
except TileOpsError as exc:
    key, error = None, f"{type(exc).__name__}: {exc}"
emit(key=key, error=error, failures=load_failures(), explained=op.explain("rms_norm", call).text)
"""


def test_two_overlapping_backends_are_ambiguous_and_the_error_says_how_to_settle_it(
    sites: Sites,
) -> None:
    result = sites.python(SETTLE, dists=["acme", "fastnorm"])
    assert result["key"] is None
    error = result["error"]
    assert error.startswith(
        "AmbiguousDispatchError: tileops::RMSNormFwdOp.rms_norm: dispatch is ambiguous between "
        "'acme' [acme-backend, entry point 'acme'], 'fastnorm_rms' [tileops-fixture-fastnorm, "
        "entry point 'fastnorm']"
    )
    assert "TILEOPS_PREFER='RMSNormFwdOp.rms_norm=acme>fastnorm_rms'" in error
    assert "TILEOPS_DENY='RMSNormFwdOp.rms_norm=fastnorm_rms'" in error
    assert "TILEOPS_DISABLE_BACKENDS=" in error


def test_tileops_prefer_settles_it(sites: Sites) -> None:
    env = {"TILEOPS_PREFER": "RMSNormFwdOp.rms_norm=fastnorm_rms>acme"}
    result = sites.python(SETTLE, dists=["acme", "fastnorm"], env=env)
    assert result["key"] == "fastnorm_rms" and result["failures"] == []
    assert (
        "acme [acme-backend, entry point 'acme']: outranked: fastnorm_rms preferred over it "
        "(the operator's preference: TILEOPS_PREFER)"
    ) in result["explained"]


def test_tileops_deny_removes_a_key_and_explain_says_by_what(sites: Sites) -> None:
    env = {"TILEOPS_DENY": "RMSNormFwdOp=fastnorm_rms"}  # every interface of the op
    result = sites.python(SETTLE, dists=["acme", "fastnorm"], env=env)
    assert result["key"] == "acme"
    assert (
        "fastnorm_rms [tileops-fixture-fastnorm, entry point 'fastnorm']: denied: denied by "
        "TILEOPS_DENY"
    ) in result["explained"]


def test_tileops_pin_pins_process_wide_and_never_falls_back(sites: Sites) -> None:
    result = sites.python(
        SETTLE, dists=["acme", "fastnorm"], env={"TILEOPS_PIN": "RMSNormFwdOp.rms_norm=acme"}
    )
    assert result["key"] == "acme"
    assert (
        "acme [acme-backend, entry point 'acme']: chosen: pinned by TILEOPS_PIN"
        in (result["explained"])
    )


def test_names_that_match_nothing_are_reported_like_unknown_backends(sites: Sites) -> None:
    env = {
        "TILEOPS_DENY": "RMSNormFwdOp.rms_norm=nosuchkey,NoSuchOp=acme",
        "TILEOPS_PREFER": "RMSNormFwdOp.rms_nrm=acme>reference,garbage",
    }
    result = sites.python(SETTLE, dists=["acme"], env=env)
    failures = result["failures"]
    assert (
        "TILEOPS_DENY (operator setting): TILEOPS_DENY RMSNormFwdOp.rms_norm=nosuchkey names key "
        "'nosuchkey', which no installed kernel of tileops::RMSNormFwdOp has"
    ) in failures
    assert any("names op 'NoSuchOp', which no installed op has" in f for f in failures)
    assert any(
        "names interface 'rms_nrm', which tileops::RMSNormFwdOp lacks" in f for f in failures
    )
    assert any(
        "entry 'garbage' is not of the form OP[.INTERFACE]=WINNER>LOSER" in f for f in failures
    )
    assert result["key"] == "acme"
