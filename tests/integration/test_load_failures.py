"""Backends that cannot load: each leaves no registration behind, warns once, is recorded with
its entry point, distribution and exception, and is mentioned by later dispatch errors."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conftest import Sites

# Loads, then reports what survived and the errors of a few dispatches that must fail.
AFTERMATH = """
warned = load_backends()
import torch
from tileops import TileOpsError
from tileops.backend import backends, load_failures, registered_targets, set_default_target
from tileops.ops import RMSNormCall, RMSNormFwdOp, SoftmaxFwdOp

def call(device="cpu"):
    return RMSNormCall(device=torch.device(device), n=64, eps=1e-6, dtype=torch.float32,
                       has_weight=True)

def error_of(action):
    try:
        action()
    except TileOpsError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None

rms_norm, softmax = RMSNormFwdOp(64), SoftmaxFwdOp()
softmax(torch.ones(3))
emit(
    warned=warned,
    failures=load_failures(),
    loaded=[b.entry_point for b in backends()],
    modules=loaded_modules("tileops_"),
    targets=registered_targets(),
    softmax_settled=softmax.settled_target,
    explained=rms_norm.explain("rms_norm", call()).text,
    errors=[
        error_of(lambda: rms_norm.key_for("rms_norm", call("mps"))),
        error_of(lambda: set_default_target("halfbroken")),
    ],
    target_error=error_of(lambda: SoftmaxFwdOp(target="halfbroken")(torch.ones(3))),
)
"""
FAILURE_NOTE = "1 tileops backend(s) failed to load; see tileops.backend.load_failures()"


@pytest.fixture(scope="module")
def halfbroken(sites: Sites) -> dict[str, Any]:
    return sites.python(AFTERMATH, dists=["acme", "halfbroken"])


def test_a_backend_failing_halfway_through_its_import_leaves_nothing_behind(
    halfbroken: dict[str, Any],
) -> None:
    result = halfbroken
    expected = (
        "halfbroken (tileops-fixture-halfbroken): RuntimeError: halfbroken: simulated failure "
        "after two registrations"
    )
    assert result["failures"] == [expected]
    assert len(result["warned"]) == 1 and expected in result["warned"][0]
    # Its kernel type and its detector are gone; acme, loaded before it, is intact.
    assert "halfbroken" not in result["explained"]
    assert "acme [acme-backend, entry point 'acme']: chosen" in result["explained"]
    assert result["targets"] == ["acme"]
    assert result["softmax_settled"] == "builtin"
    assert "halfbroken" not in result["loaded"] and "acme" in result["loaded"]
    assert "tileops_fixture_halfbroken" not in result["modules"]
    for error in result["errors"]:
        assert FAILURE_NOTE in error, error


def test_an_unknown_target_error_mentions_the_failure(halfbroken: dict[str, Any]) -> None:
    """The target a user names may be unknown precisely because its backend failed to load."""
    assert halfbroken["target_error"].startswith("UnknownTargetError: ")
    assert FAILURE_NOTE in halfbroken["target_error"]


def test_tileops_list_reports_the_failure(sites: Sites) -> None:
    out = sites.cli("list", dists=["halfbroken"]).stdout
    assert "Load failures:\n  halfbroken (tileops-fixture-halfbroken): RuntimeError:" in out


def test_a_backend_for_another_protocol_is_refused_and_told_what_to_upgrade(sites: Sites) -> None:
    result = sites.python(AFTERMATH, dists=["future"])
    assert result["failures"] == [
        "future (tileops-fixture-future): BackendError: tileops-fixture-future was written for "
        "tileops backend protocol 99, but this tileops-core speaks protocol 1; upgrade "
        "tileops-core"
    ]
    assert len(result["warned"]) == 1
    assert "future" not in result["targets"] and "future" not in result["loaded"]
    assert result["softmax_settled"] == "builtin"  # its detector claimed cpu


def test_two_distributions_registering_one_key_are_both_named(sites: Sites) -> None:
    result = sites.python(AFTERMATH, dists=["acme", "sloppy"])
    [failure] = result["failures"]
    assert failure.startswith("sloppy (tileops-fixture-sloppy): BackendError: ")
    assert (
        "kernel key 'acme' of RMSNormFwdOp is registered twice: by acme-backend, entry point "
        "'acme' (AcmeRMSNorm) and by tileops-fixture-sloppy, entry point 'sloppy' (SloppyRMSNorm)"
    ) in failure
    assert "acme [acme-backend, entry point 'acme']: chosen" in result["explained"]
    assert "sloppy" not in result["targets"]
