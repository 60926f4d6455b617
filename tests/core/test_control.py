"""Trust and control: pins, preferences, determinism, strict fallbacks, records, readiness."""

from __future__ import annotations

import logging
import threading

import pytest
import torch
from dispatch_kit import INTERFACE, Binary, Unary, call, kernel, make_op

import tileops
import tileops.table
from tileops import (
    AmbiguousDispatchError,
    ControlError,
    KernelDeclarationError,
    NoImplementationError,
    Requirements,
)
from tileops.control import Rules, _installed_keys, env_flag
from tileops.registry import REGISTRY
from tileops.testing import simulate_device


@pytest.fixture
def op_cls(sm80):
    """fast (preferred), slow, and a general fallback; `odd` refuses odd n."""
    return make_op(
        {
            "fast": kernel("fast", preferred_over={"slow"}),
            "slow": kernel("slow"),
            "odd": kernel("odd", refuse=lambda c: None if c.n % 2 else "serves odd n only"),
            "fallback": kernel("fallback", general=True, devices={"cuda", "cpu"}),
        },
        name="ControlledOp",
    )


def test_a_pin_holds_inside_its_block_only(op_cls):
    op = op_cls()
    assert op.kernel_for(INTERFACE, call(n=2))() == "fast"
    with tileops.pinned(op_cls, INTERFACE, "slow"):
        assert op.kernel_for(INTERFACE, call(n=2))() == "slow"
        assert op.key_for(INTERFACE, call(n=2)) == "slow"
        explained = op.explain(INTERFACE, call(n=2)).text
        assert "slow [module dispatch_kit]: chosen: pinned by tileops.pinned()" in explained
        assert "fast [module dispatch_kit]: outranked: 'slow' is pinned by" in explained
    assert op.kernel_for(INTERFACE, call(n=2))() == "fast"


def test_hits_read_the_plain_cache_again_once_the_pin_ends():
    op_cls = make_op(
        {"a": kernel("a", devices={"cpu"}), "b": kernel("b", devices={"cpu"}, preferred_over="a")},
        name="PlainAgainOp",
    )
    op = op_cls()
    with tileops.pinned(op_cls, INTERFACE, "a"):
        assert not isinstance(op._hits, dict)  # a scope is active: hits consult it
        assert op.kernel_for(INTERFACE, call("cpu"))() == "a"
    assert isinstance(op._hits, dict) and op.kernel_for(INTERFACE, call("cpu"))() == "b"


def test_pins_are_per_thread(op_cls):
    op = op_cls()
    inside, outside = threading.Event(), threading.Event()
    seen = {}

    def pinned_worker():
        with tileops.pinned(op_cls, INTERFACE, "slow"):
            inside.set()
            outside.wait(5)
            seen["pinned"] = op.kernel_for(INTERFACE, call(n=4))()

    worker = threading.Thread(target=pinned_worker)
    worker.start()
    inside.wait(5)
    seen["free"] = op.kernel_for(INTERFACE, call(n=4))()
    outside.set()
    worker.join()
    assert seen == {"pinned": "slow", "free": "fast"}


def test_a_pinned_key_that_refuses_raises_with_its_reason_never_falls_back(op_cls):
    op = op_cls()
    with tileops.pinned(op_cls, INTERFACE, "odd"):
        assert op.kernel_for(INTERFACE, call(n=3))() == "odd"
        with pytest.raises(
            NoImplementationError,
            match=r"(?s)no implementation serves this call.*odd \[module dispatch_kit\]: refused: "
            r"serves odd n only",
        ):
            op.kernel_for(INTERFACE, call(n=2))


def test_a_pinned_key_unavailable_on_the_device_raises_with_its_reason(op_cls):
    op = op_cls()
    with tileops.pinned(op_cls, INTERFACE, "fast"):
        with pytest.raises(
            NoImplementationError, match=r"fast .*unavailable: runs on cuda, not cpu"
        ):
            op.kernel_for(INTERFACE, call("cpu"))


def test_pinning_something_that_does_not_exist_is_refused(op_cls):
    with pytest.raises(ControlError, match=r"ControlledOp has no kernel 'nope'; it has fallback"):
        with tileops.pinned(op_cls, INTERFACE, "nope"):
            pass
    with pytest.raises(ControlError, match=r"has no interface 'binary'; it has unary"):
        with tileops.pinned(op_cls, "binary", "fast"):
            pass


def test_prefer_settles_an_ambiguity_for_ops_constructed_afterwards(sm80, tileops_registry):
    tied_cls = make_op({"a": kernel("a"), "b": kernel("b")}, name="TiedOp")
    before = tied_cls()
    with pytest.raises(AmbiguousDispatchError, match=r"TILEOPS_PREFER='TiedOp.unary=a>b'"):
        before.kernel_for(INTERFACE, call())
    tileops.prefer(tied_cls, INTERFACE, "b", "a")
    after = tied_cls()
    assert after.kernel_for(INTERFACE, call())() == "b"
    text = after.explain(INTERFACE, call()).text
    assert (
        "a [module dispatch_kit]: outranked: b preferred over it (the operator's preference: "
        "tileops.prefer())" in text
    )


def test_an_operator_preference_closing_a_cycle_is_refused(op_cls, tileops_registry):
    tileops.prefer(op_cls, INTERFACE, "slow", "fast")
    with pytest.raises(
        KernelDeclarationError,
        match=r"the operator's preferences \(tileops.prefer\(\)\) and the kernels' "
        r"preferred_over form a cycle: fast -> slow -> fast",
    ):
        op_cls()


def test_preferring_an_unknown_key_is_refused(op_cls):
    with pytest.raises(ControlError, match="tileops.prefer: .*ControlledOp has no kernel 'x'"):
        tileops.prefer(op_cls, INTERFACE, "x", "fast")


def test_determinism_toggles_between_calls(sm80):
    op = make_op(
        {
            "atomic": kernel("atomic", deterministic=False, preferred_over={"ordered"}),
            "ordered": kernel("ordered"),
        },
        name="AtomicOp",
    )()
    try:
        assert op.kernel_for(INTERFACE, call())() == "atomic"
        torch.use_deterministic_algorithms(True)
        assert op.kernel_for(INTERFACE, call())() == "ordered"
        assert "atomic [module dispatch_kit]: unavailable: not deterministic" in (
            op.explain(INTERFACE, call()).text
        )
    finally:
        torch.use_deterministic_algorithms(False)
    assert op.kernel_for(INTERFACE, call())() == "atomic"


def test_deterministic_must_be_a_bool():
    with pytest.raises(KernelDeclarationError, match="deterministic must be True or False"):
        kernel("Odd", deterministic="no")


@pytest.fixture
def fallback_only(sm80):
    """Every specialised kernel refuses n=5: only the general fallback serves it."""
    return make_op(
        {
            "special": kernel("special", refuse=lambda c: "n=5 is odd" if c.n == 5 else None),
            "fallback": kernel("fallback", general=True),
        },
        name="FallbackOp",
    )()


def test_a_gpu_call_served_by_the_general_fallback_is_logged_once(fallback_only, caplog):
    with caplog.at_level(logging.WARNING, logger="tileops.dispatch"):
        for _ in range(3):
            fallback_only.kernel_for(INTERFACE, call(n=5))
            fallback_only._table.modes[False][0].clear()  # force misses: still logged once
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1
    assert "only the general fallback 'fallback' serves" in messages[0]
    assert "special [module dispatch_kit]: n=5 is odd" in messages[0]


@pytest.mark.parametrize("value", ["1", "true", "yes", "on", "TRUE", " On "])
def test_strict_mode_raises_instead_of_falling_back(fallback_only, monkeypatch, value):
    monkeypatch.setenv("TILEOPS_STRICT", value)
    with pytest.raises(NoImplementationError, match=r"^TILEOPS_STRICT is on: .*only the general"):
        fallback_only.kernel_for(INTERFACE, call(n=5))
    assert fallback_only.kernel_for(INTERFACE, call(n=4))() == "special"


@pytest.mark.parametrize("value", ["", " ", "0", "0 ", "false", "no", "off", "OFF", "False"])
def test_strict_mode_off_spellings_run_the_fallback(fallback_only, monkeypatch, value):
    monkeypatch.setenv("TILEOPS_STRICT", value)
    assert fallback_only.kernel_for(INTERFACE, call(n=5))() == "fallback"


@pytest.mark.parametrize("value", ["banana", "2", "tru", "1 0"])
def test_strict_mode_refuses_a_value_that_is_no_boolean(fallback_only, monkeypatch, value):
    monkeypatch.setenv("TILEOPS_STRICT", value)
    message = rf"^TILEOPS_STRICT={value!r} is not a boolean: use 1, true, yes or on"
    with pytest.raises(ControlError, match=message):
        fallback_only.kernel_for(INTERFACE, call(n=5))


@pytest.mark.parametrize(
    "value, default, expected",
    [(None, True, True), ("", True, True), (" ", False, False), ("No", True, False)],
)
def test_env_flag_reads_one_boolean_grammar(monkeypatch, value, default, expected):
    if value is None:
        monkeypatch.delenv("TILEOPS_SOME_FLAG", raising=False)
    else:
        monkeypatch.setenv("TILEOPS_SOME_FLAG", value)
    assert env_flag("TILEOPS_SOME_FLAG", default=default) is expected


def test_env_flag_problem_is_one_line_naming_the_variable(monkeypatch):
    monkeypatch.setenv("TILEOPS_SOME_FLAG", "banana\nrest")
    with pytest.raises(ControlError) as raised:
        env_flag("TILEOPS_SOME_FLAG")
    assert len(str(raised.value).splitlines()) == 1
    assert str(raised.value).startswith("TILEOPS_SOME_FLAG='banana\\nrest' is not a boolean")


def test_a_record_counts_every_call_hits_included():
    norm, softmax = tileops.RMSNormFwdOp(8), tileops.SoftmaxFwdOp()
    x = torch.randn(2, 8)
    norm(x)  # a hit later, inside the record
    with tileops.record() as record:
        for _ in range(3):
            softmax(norm(x))
    counts = {(s.op, s.key, s.distribution): n for s, n in record.counts.items()}
    assert counts == {
        ("tileops::RMSNormFwdOp", "reference", "tileops-core"): 3,
        ("tileops::SoftmaxFwdOp", "reference", "tileops-core"): 3,
    }
    summary = record.summary()
    assert "tileops::RMSNormFwdOp" in summary and "reference" in summary and "      3" in summary
    norm(x)
    assert sum(record.counts.values()) == 6  # nothing counted after the block


def test_unmet_requirements_make_a_kernel_unavailable_with_the_reason(sm80):
    op = make_op(
        {
            "needy": kernel("needy", requires=Requirements(modules=("surely_not_installed_mod",))),
            "old": kernel("old", requires=Requirements(torch=(99,))),
            "plain": kernel("plain", general=True),
        },
        name="NeedyOp",
    )()
    text = op.explain(INTERFACE, call()).text
    assert (
        "needy [module dispatch_kit]: unavailable: needs the Python module "
        "'surely_not_installed_mod', which is not installed"
    ) in text
    assert (
        f"old [module dispatch_kit]: unavailable: needs torch >= 99, this is {torch.__version__}"
        in text
    )
    assert op.kernel_for(INTERFACE, call())() == "plain"


def test_requires_must_be_a_requirements():
    with pytest.raises(KernelDeclarationError, match="requires must be a tileops.Requirements"):
        kernel("Odd", requires=("tilelang",))


# -- operator rules from the environment ---------------------------------------------------


@pytest.fixture
def operator_env(monkeypatch):
    """`load(**variables)`: read TILEOPS_* rules as backend loading does and put them in force
    for tables built afterwards; returns every problem loading reports. Undone after the test."""

    def load(**variables: str) -> list[str]:
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
        rules = Rules()
        problems = [p for _, p in rules.load_environment()]
        problems += rules.unmatched(REGISTRY.known_ops, _installed_keys)
        monkeypatch.setattr(tileops.table, "RULES", rules)
        REGISTRY.bump()
        return problems

    yield load
    monkeypatch.undo()
    REGISTRY.bump()


@pytest.fixture
def two_interfaces():
    """`plain` on `unary`, `pair` on `binary`, `both` on both (outranked by the other two)."""
    return make_op(
        {
            "plain": kernel("plain", devices={"cpu"}, preferred_over={"both"}),
            "pair": kernel("pair", base=Binary, devices={"cpu"}, preferred_over={"both"}),
            "both": kernel("both", base=(Unary, Binary), devices={"cpu"}),
        },
        interfaces={"unary": Unary, "binary": Binary},
        name="TwoInterfacesOp",
    )


def test_a_pin_without_interface_applies_only_where_the_key_implements_it(
    operator_env, two_interfaces
):
    assert operator_env(TILEOPS_PIN="TwoInterfacesOp=plain") == []
    rules = tileops.table.table_for(two_interfaces).rules
    assert rules["unary"].pin == ("plain", "TILEOPS_PIN")
    assert rules["binary"].pin is None
    op = two_interfaces()
    assert op.kernel_for("unary", call("cpu"))() == "plain"
    assert op.key_for("binary", call("cpu")) == "pair"


def test_pinning_the_forward_key_without_interface_leaves_gradients_alone(operator_env):
    assert operator_env(TILEOPS_PIN="RMSNormFwdOp=reference") == []
    op = tileops.RMSNormFwdOp(8)
    x = torch.randn(2, 8, requires_grad=True)
    op(x).sum().backward()
    assert x.grad is not None and x.grad.shape == (2, 8)
    assert tileops.table.table_for(tileops.RMSNormFwdOp).rules["backward"].pin is None


def test_a_rule_naming_an_interface_is_checked_against_that_interfaces_keys(operator_env):
    problems = operator_env(TILEOPS_PIN="RMSNormFwdOp.backward=reference")
    keys = sorted(
        c.key for c in tileops.table.table_for(tileops.RMSNormFwdOp).candidates["backward"]
    )
    assert "reference_backward" in keys and "reference" not in keys  # and backends' own
    assert problems == [
        "TILEOPS_PIN RMSNormFwdOp.backward=reference names key 'reference', which does not "
        f"implement tileops::RMSNormFwdOp.backward (its keys there: {', '.join(keys)})"
    ]


def test_a_rule_for_a_key_of_another_interface_of_a_test_op_is_reported(
    operator_env, two_interfaces
):
    problems = operator_env(TILEOPS_DENY="TwoInterfacesOp.binary=plain")
    assert problems == [
        "TILEOPS_DENY TwoInterfacesOp.binary=plain names key 'plain', which does not implement "
        "dispatch_kit::TwoInterfacesOp.binary (its keys there: both, pair)"
    ]


def test_conflicting_pins_for_one_interface_are_reported_and_neither_applies(
    operator_env, two_interfaces
):
    problems = operator_env(TILEOPS_PIN="TwoInterfacesOp.unary=plain,TwoInterfacesOp=both")
    assert problems == [
        "TILEOPS_PIN pins dispatch_kit::TwoInterfacesOp.unary to 'plain' (TILEOPS_PIN "
        "TwoInterfacesOp.unary=plain) and 'both' (TILEOPS_PIN TwoInterfacesOp=both); none "
        "applies there: keep one"
    ]
    rules = tileops.table.table_for(two_interfaces).rules
    assert rules["unary"].pin is None
    assert rules["binary"].pin == ("both", "TILEOPS_PIN")  # no conflict on binary


def test_the_same_pin_twice_is_no_conflict(operator_env, two_interfaces):
    problems = operator_env(
        TILEOPS_PIN="TwoInterfacesOp.unary=plain, dispatch_kit::TwoInterfacesOp.unary=plain"
    )
    assert problems == []
    assert tileops.table.table_for(two_interfaces).rules["unary"].pin == ("plain", "TILEOPS_PIN")


def test_unknown_log_names_are_reported_with_the_known_ones(operator_env):
    problems = operator_env(TILEOPS_LOG="dispatch, everything,dispach")
    assert problems == [
        "TILEOPS_LOG names 'everything', which is no tileops log; use one of: dispatch",
        "TILEOPS_LOG names 'dispach', which is no tileops log; use one of: dispatch",
    ]


def test_a_record_inside_a_simulation_counts_its_hits_with_the_key_that_served(sm80):
    op = make_op({"ampere": kernel("ampere", supported_archs={80})}, name="RecordedSimOp")()
    op.kernel_for(INTERFACE, call())  # selected before the record: the calls inside are hits
    with tileops.record() as record:
        for _ in range(3):
            op.kernel_for(INTERFACE, call())
    assert [(s.key, n) for s, n in record.counts.items()] == [("ampere", 3)]


def test_a_fallback_warned_under_one_simulation_is_warned_again_under_another(caplog):
    op = make_op(
        {
            "special": kernel("special", refuse=lambda c: "refuses all"),
            "fallback": kernel("fallback", general=True),
        },
        name="FallbackPerBoardOp",
    )()
    with caplog.at_level(logging.WARNING, logger="tileops.dispatch"):
        for arch in (80, 90, 80):
            with simulate_device("cuda:0", arch=arch, sm_count=1):
                op.kernel_for(INTERFACE, call(n=5))
    assert len(caplog.records) == 3  # each simulation is a board of its own
