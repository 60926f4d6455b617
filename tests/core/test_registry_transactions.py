"""Transactions undo their own changes only, in a registry every thread shares; simulations keep
their selections apart and forget only those."""

from __future__ import annotations

import contextvars
import threading

import pytest
import torch
from dispatch_kit import INTERFACE, call, kernel, make_op

from tileops import SoftmaxFwdOp
from tileops.backend import BackendError, default_target, register_detector, set_default_target
from tileops.provenance import Source
from tileops.registry import REGISTRY, Detector
from tileops.testing import isolated_registry, simulate_device


def in_thread(action) -> None:
    worker = threading.Thread(target=action)
    worker.start()
    worker.join()


def test_isolated_registry_keeps_what_another_thread_registered_meanwhile():
    survivor = []
    try:
        with isolated_registry():
            register_detector(target="mine", detect=lambda device: False)
            in_thread(lambda: survivor.append(register_detector("theirs", lambda d: False)))
        assert "theirs" in REGISTRY.targets() and "mine" not in REGISTRY.targets()
    finally:
        REGISTRY.withdraw_source(REGISTRY.detectors["theirs"].source)
    assert "theirs" not in REGISTRY.targets()


def test_nested_transactions_undo_in_layers():
    installed = REGISTRY.targets()
    with isolated_registry():
        register_detector(target="outer", detect=lambda device: False)
        with isolated_registry():
            register_detector(target="inner", detect=lambda device: False)
            set_default_target("inner")
        assert REGISTRY.targets() == sorted([*installed, "outer"]) and default_target() is None
        with REGISTRY.transaction():  # kept by the inner one, undone by the outer
            register_detector(target="kept", detect=lambda device: False)
        assert REGISTRY.targets() == sorted([*installed, "kept", "outer"])
    assert REGISTRY.targets() == installed


def test_undo_leaves_a_slot_someone_else_changed_since():
    with isolated_registry():
        set_default_target(None)
        in_thread(lambda: REGISTRY.set_default_target("builtin", REGISTRY_SOURCE))
    assert default_target() == "builtin"
    REGISTRY.withdraw_source(REGISTRY_SOURCE)
    assert default_target() is None


REGISTRY_SOURCE = Source("another thread's library")


def test_a_simulation_keeps_its_selections_apart_and_forgets_only_those():
    op = make_op({"k": kernel("K", devices={"cpu", "cuda"})})()
    cpu_call = call("cpu")
    op.kernel_for(INTERFACE, cpu_call)
    softmax = SoftmaxFwdOp()
    softmax(torch.randn(2, 3))
    before = dict(softmax._table.hits)
    with simulate_device("cuda:3", arch=90, sm_count=132):
        op.kernel_for(INTERFACE, call("cuda:3"))
        assert (INTERFACE, cpu_call) in op._table.hits
        assert (INTERFACE, call("cuda:3")) not in op._table.hits  # not for other contexts
        assert len(op._table.scoped) == 1
    assert (INTERFACE, cpu_call) in op._table.hits
    assert not op._table.scoped  # stale once the simulation ends
    assert softmax._table.hits == before


def detector_of(source: Source, target: str) -> Detector:
    return Detector(target, lambda device: False, source)


def add_detector(source: Source, target: str) -> None:
    REGISTRY.add(("detector", target), detector_of(source, target), lambda e: AssertionError(e))


def test_a_transaction_for_one_source_undoes_that_sources_entries_only():
    """A backend whose import imported another backend's module and then failed undoes its own
    registrations; the other's stay (and an outer transaction still undoes them)."""
    mine, theirs = Source("failing-backend", "failing"), Source("imported-backend", "imported")
    with isolated_registry():
        with pytest.raises(RuntimeError, match="import failed"), REGISTRY.transaction(source=mine):
            add_detector(mine, "mine")
            add_detector(theirs, "theirs")
            raise RuntimeError("import failed")
        assert "theirs" in REGISTRY.targets() and "mine" not in REGISTRY.targets()
    assert "theirs" not in REGISTRY.targets()


def test_a_closed_source_loses_its_entries_and_is_refused_later():
    failed = Source("failed-backend", "failed")
    add_detector(failed, "failed")
    refused = []

    def refusal(slot):
        refused.append(slot)
        return BackendError(f"refused {slot}")

    assert REGISTRY.close_source(failed, refusal) == 1
    assert "failed" not in REGISTRY.targets()
    with pytest.raises(BackendError, match=r"refused \('detector', 'late'\)"):
        in_thread_raising(lambda: add_detector(failed, "late"))
    with pytest.raises(BackendError, match=r"refused \('default',\)"):
        REGISTRY.set_default_target("builtin", failed)
    assert refused == [("detector", "late"), ("default",)] and "late" not in REGISTRY.targets()


def in_thread_raising(action) -> None:
    """Run `action` in another thread; re-raise here what it raised."""
    raised = []

    def run():
        try:
            action()
        except Exception as exc:
            raised.append(exc)

    in_thread(run)
    if raised:
        raise raised[0]


def test_isolated_registry_is_process_wide_while_it_lasts():
    """What the block registers, every thread sees until the block ends (it isolates a test
    from the next, not from threads beside it)."""
    seen = []
    with isolated_registry():
        register_detector(target="shared", detect=lambda device: False)
        in_thread(lambda: seen.append("shared" in REGISTRY.targets()))
    in_thread(lambda: seen.append("shared" in REGISTRY.targets()))
    assert seen == [True, False]


def test_isolated_registry_undoes_what_threads_in_a_copy_of_its_context_registered():
    with isolated_registry():
        copied = contextvars.copy_context()
        in_thread(lambda: copied.run(register_detector, "copied", lambda device: False))
        assert "copied" in REGISTRY.targets()
    assert "copied" not in REGISTRY.targets()
