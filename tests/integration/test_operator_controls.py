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


GRADIENT = """
warned = load_backends()
import torch
from tileops.backend import load_failures
from tileops.ops import RMSNormFwdOp
op = RMSNormFwdOp(64)
x = torch.randn(4, 64, requires_grad=True)
op(x, torch.ones(64)).sum().backward()
emit(failures=load_failures(), grad=list(x.grad.shape), key=op.key_for("rms_norm",
     op.call_for(x.detach(), torch.ones(64))))
"""


def test_a_pin_without_interface_pins_only_the_interfaces_its_key_implements(
    sites: Sites,
) -> None:
    result = sites.python(GRADIENT, dists=["acme"], env={"TILEOPS_PIN": "RMSNormFwdOp=reference"})
    assert result == {"failures": [], "grad": [4, 64], "key": "reference"}


def test_a_pin_on_an_interface_is_checked_against_that_interfaces_keys(sites: Sites) -> None:
    env = {"TILEOPS_PIN": "RMSNormFwdOp.backward=reference"}
    result = sites.python(SETTLE, dists=["acme"], env=env)
    assert result["failures"] == [
        "TILEOPS_PIN (operator setting): TILEOPS_PIN RMSNormFwdOp.backward=reference names key "
        "'reference', which does not implement tileops::RMSNormFwdOp.backward (its keys there: "
        "reference_backward, tilelang_row_backward, triton_backward)"
    ]


def test_conflicting_pins_are_reported_and_none_applies(sites: Sites) -> None:
    env = {"TILEOPS_PIN": "RMSNormFwdOp.rms_norm=acme,RMSNormFwdOp=reference"}
    result = sites.python(SETTLE, dists=["acme"], env=env)
    assert result["failures"] == [
        "TILEOPS_PIN (operator setting): TILEOPS_PIN pins tileops::RMSNormFwdOp.rms_norm to "
        "'acme' (TILEOPS_PIN RMSNormFwdOp.rms_norm=acme) and 'reference' (TILEOPS_PIN "
        "RMSNormFwdOp=reference); none applies there: keep one"
    ]
    assert result["key"] == "acme"  # acme outranks the reference on its own, unpinned


def test_an_unknown_log_name_is_reported_at_load_and_by_doctor_once(sites: Sites) -> None:
    env = {"TILEOPS_LOG": "dispatch,everything"}
    result = sites.python(SETTLE, env=env)
    problem = "TILEOPS_LOG names 'everything', which is no tileops log; use one of: dispatch"
    assert result["failures"] == [f"TILEOPS_LOG (operator setting): {problem}"]
    doctor = sites.cli("doctor", env=env, check=False)
    assert doctor.returncode == 1 and doctor.stdout.count(problem) == 1
