"""Backends that cannot load: each leaves no registration behind, warns once, is recorded with
its entry point, distribution and exception, and is mentioned by later dispatch errors."""

from __future__ import annotations

import json
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
        "after four registrations"
    )
    assert result["failures"] == [expected]
    assert len(result["warned"]) == 1 and expected in result["warned"][0]
    # Its kernel type and its detector are gone; acme, loaded before it, is intact.
    assert "halfbroken" not in result["explained"]
    assert "acme [acme-backend, entry point 'acme']: chosen" in result["explained"]
    assert "halfbroken" not in result["targets"] and "acme" in result["targets"]
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
        "kernel key 'acme' of tileops::RMSNormFwdOp is registered twice: by acme-backend, "
        "entry point 'acme' (AcmeRMSNorm) and by tileops-fixture-sloppy, entry point 'sloppy' "
        "(SloppyRMSNorm)"
    ) in failure
    assert "acme [acme-backend, entry point 'acme']: chosen" in result["explained"]
    assert "sloppy" not in result["targets"]


# The user imports the backend module before tileops loads it: its import fails halfway.
DIRECT_IMPORT = """
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        import tileops_fixture_halfbroken
    except RuntimeError as exc:
        raised = str(exc)
    import torch
    from tileops.backend import default_target, load_failures, registered_targets
    from tileops.ops import SoftmaxFwdOp
    x = torch.tensor([1.0, 2.0, 3.0])
    op = SoftmaxFwdOp()
    values = op(x).tolist()
emit(
    raised=raised,
    failures=load_failures(),
    warned=[str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)],
    targets=registered_targets(),
    default=default_target(),
    settled=op.settled_target,
    right=torch.allclose(torch.tensor(values), torch.softmax(x, -1)),
)
"""


def test_a_backend_imported_directly_that_fails_halfway_leaves_nothing_behind(
    sites: Sites,
) -> None:
    result = sites.python(DIRECT_IMPORT, dists=["halfbroken"])
    assert result["raised"] == "halfbroken: simulated failure after four registrations"
    assert result["failures"] == [
        "halfbroken (tileops-fixture-halfbroken): BackendError: importing "
        "tileops_fixture_halfbroken (directly, before tileops loaded it) failed"
    ]
    assert len(result["warned"]) == 1
    # Its detector, builder and default target are gone: softmax runs the op's own kernels.
    assert "halfbroken" not in result["targets"] and result["default"] is None
    assert result["settled"] == "builtin" and result["right"]


INTERRUPTED = """
import torch
from tileops.backend import backends, load_failures, registered_targets
try:
    warned = load_backends()
    interrupted = False
except KeyboardInterrupt:
    interrupted = True
emit(
    interrupted=interrupted,
    failures=load_failures(),  # asking again resumes loading after an interrupt
    loaded=[b.entry_point for b in backends()],
    targets=registered_targets(),
)
"""


@pytest.mark.parametrize(
    ("mode", "error"),
    [
        ("exit", "SystemExit: interrupting: simulated sys.exit() during import"),
        ("interrupt", "KeyboardInterrupt: interrupting: simulated Ctrl-C during import"),
    ],
)
def test_exit_or_interrupt_in_a_backend_import_does_not_stop_the_others(
    sites: Sites, mode: str, error: str
) -> None:
    result = sites.python(
        INTERRUPTED, dists=["interrupting", "acme"], env={"TILEOPS_FIXTURE_RAISE": mode}
    )
    assert result["interrupted"] == (mode == "interrupt")  # re-raised, once the registry is clean
    assert result["failures"] == [f"aa_interrupting (tileops-fixture-interrupting): {error}"]
    assert "acme" in result["loaded"]
    assert "interrupting" not in result["targets"] and "acme" in result["targets"]


THREADED = """
warned = load_backends()
import torch
from tileops.backend import load_failures
from tileops.ops import SoftmaxCall, SoftmaxFwdOp
call = SoftmaxCall(device=torch.device("cpu"), n=4, dtype=torch.float32)
emit(failures=load_failures(), key=SoftmaxFwdOp().key_for("softmax", call))
"""


def test_a_backend_registering_from_worker_threads_during_its_import_loads(sites: Sites) -> None:
    result = sites.python(THREADED, dists=["threaded"])
    assert result == {"failures": [], "key": "threaded"}


def test_a_failed_backend_loses_what_its_worker_threads_registered(sites: Sites) -> None:
    result = sites.python(THREADED, dists=["threaded"], env={"TILEOPS_FIXTURE_FAIL": "1"})
    assert result["key"] == "reference"
    [failure] = result["failures"]
    assert "threaded: simulated failure after a worker thread registered" in failure


def test_a_backend_failing_after_importing_another_backend_undoes_only_its_own(
    sites: Sites,
) -> None:
    """borrower (loaded first) imports acme's module, then fails: acme's kernel type and target,
    registered inside borrower's load, are acme's, so they stay, and acme loads as usual."""
    result = sites.python(AFTERMATH, dists=["acme", "borrower"], env={"TILEOPS_FIXTURE_FAIL": "1"})
    assert result["failures"] == [
        "aa_borrower (tileops-fixture-borrower): RuntimeError: borrower: simulated failure "
        "after importing acme"
    ]
    assert "acme [acme-backend, entry point 'acme']: chosen" in result["explained"]
    assert "borrower" not in result["explained"]
    assert "acme" in result["targets"] and "acme" in result["loaded"]
    assert "aa_borrower" not in result["loaded"]


def test_keys_of_a_backend_another_one_imported_are_listed_as_its_own(sites: Sites) -> None:
    listed = json.loads(sites.cli("list", "--json", dists=["acme", "borrower"]).stdout)
    assert listed["load_failures"] == []
    rms = next(op for op in listed["ops"] if op["name"] == "tileops::RMSNormFwdOp")
    sources = {k["key"]: k["source"] for i in rms["interfaces"] for k in i["keys"]}
    assert sources["acme"] == "acme-backend, entry point 'acme'"
    assert sources["borrower"] == "tileops-fixture-borrower, entry point 'aa_borrower'"
    [acme] = [t for t in listed["targets"] if t["name"] == "acme"]
    assert acme["detector"] == "acme-backend, entry point 'acme'"
    assert acme["serves"] == {"tileops::SoftmaxFwdOp": "acme-backend, entry point 'acme'"}


LATE = """
import threading
raised = []
threading.excepthook = lambda args: raised.append(f"{args.exc_type.__name__}: {args.exc_value}")
warned = load_backends()
for thread in threading.enumerate():
    if thread is not threading.current_thread():
        thread.join(timeout=20)
import torch
from tileops.backend import load_failures
from tileops.ops import SoftmaxCall, SoftmaxFwdOp
call = SoftmaxCall(device=torch.device("cpu"), n=4, dtype=torch.float32)
emit(failures=load_failures(), raised=raised, key=SoftmaxFwdOp().key_for("softmax", call))
"""


def test_a_failed_backends_thread_registering_afterwards_is_refused_and_recorded(
    sites: Sites,
) -> None:
    result = sites.python(LATE, dists=["late"])
    assert result["key"] == "reference"  # LateSoftmax would win every CPU softmax
    refusal = (
        "BackendError: tileops-fixture-late, entry point 'late' failed to load (RuntimeError: "
        "late: simulated failure; a thread of mine registers afterwards); its later "
        "registration of kernel key 'late' of tileops::SoftmaxFwdOp is refused"
    )
    assert [r[: len(refusal)] for r in result["raised"]] == [refusal]
    failure, refused = result["failures"]
    assert failure.startswith("late (tileops-fixture-late): RuntimeError: late: simulated")
    assert refused.startswith(f"late (tileops-fixture-late): {refusal}")
