"""Selection (spec section 2): the hit path, availability, applicability, preference, entries."""

from __future__ import annotations

import pytest
from dispatch_kit import INTERFACE, Binary, Unary, call, kernel, make_op

from tileops import Kernel


def test_hit_reads_no_device_fact(sm80):
    k = kernel("k", supported_archs={80}, refuse=lambda c: None if c.sm_count > 0 else "no SMs")
    op = make_op({"k": k})()
    op.kernel_for(INTERFACE, call())
    assert sm80.reads > 0
    reads = sm80.reads
    for _ in range(50):
        op.kernel_for(INTERFACE, call())  # an equal, freshly built call spec
    assert sm80.reads == reads


def test_hit_consults_no_implementation(sm80):
    a = kernel("a", preferred_over={"b"})
    b = kernel("b", refuse=lambda c: "never")
    op = make_op({"a": a, "b": b})()
    entry = op.kernel_for(INTERFACE, call())
    before = (a.counts.copy(), b.counts.copy())
    for _ in range(50):
        assert op.kernel_for(INTERFACE, call()) is entry
    assert (a.counts, b.counts) == before


def test_default_declarations_run_on_cuda_of_every_arch_but_not_cpu(sm80, sm90):
    class Plain(Kernel, Unary):
        def forward(self, x):
            return "plain"

    op = make_op({"plain": Plain})()
    assert op.kernel_for(INTERFACE, call("cuda:0"))(1) == "plain"
    assert op.kernel_for(INTERFACE, call("cuda:1"))(1) == "plain"
    assert op.explain(INTERFACE, call("cpu")).verdict("plain") == "unavailable"


def test_devices_decide_availability(sm80):
    op = make_op({"host": kernel("host", devices={"cpu"}), "gpu": kernel("gpu")})()
    assert op.key_for(INTERFACE, call("cpu")) == "host"
    assert op.key_for(INTERFACE, call("cuda:0")) == "gpu"


def test_supported_archs_decide_availability(sm80, sm90):
    op = make_op(
        {
            "ampere": kernel("ampere", supported_archs={80}),
            "hopper": kernel("hopper", supported_archs={90}),
        }
    )()
    assert op.key_for(INTERFACE, call("cuda:0")) == "ampere"
    assert op.key_for(INTERFACE, call("cuda:1")) == "hopper"
    assert "supports sm_90; cuda:0 has sm_80" in op.explain(INTERFACE, call("cuda:0")).text


def test_refusal_decides_applicability(sm80):
    small = kernel("small", refuse=lambda c: "n is too large" if c.n >= 1024 else None)
    large = kernel("large", refuse=lambda c: "n is too small" if c.n < 1024 else None)
    op = make_op({"small": small, "large": large})()
    assert op.kernel_for(INTERFACE, call(n=8))(1) == "small"
    assert op.kernel_for(INTERFACE, call(n=4096))(1) == "large"


def test_refusal_is_asked_only_of_available_kernels(sm80):
    hopper = kernel("hopper", supported_archs={90})
    op = make_op({"hopper": hopper, "any": kernel("any")})()
    assert op.key_for(INTERFACE, call()) == "any"
    assert hopper.counts["refusal"] == 0


def test_general_ranks_below_every_other(sm80):
    fallback = kernel("fallback", general=True)
    special = kernel("special", refuse=lambda c: "odd n" if c.n % 2 else None)
    op = make_op({"fallback": fallback, "special": special})()
    assert op.key_for(INTERFACE, call(n=2)) == "special"
    assert op.key_for(INTERFACE, call(n=1)) == "fallback"


def test_preferred_over_decides_among_the_rest(sm80):
    op = make_op({"a": kernel("a"), "b": kernel("b", preferred_over={"a"})})()
    assert op.key_for(INTERFACE, call()) == "b"


def test_preferred_over_is_transitive(sm80):
    a = kernel("a", preferred_over={"b"})
    b = kernel("b", preferred_over={"c"}, refuse=lambda c: "odd n" if c.n % 2 else None)
    op = make_op({"a": a, "b": b, "c": kernel("c")})()
    assert op.key_for(INTERFACE, call(n=2)) == "a"
    assert op.key_for(INTERFACE, call(n=1)) == "a"  # a beats c through b, though b refused


def test_default_entry_is_a_kernel_instance_whose_call_runs_forward(sm80):
    class Doubler(Kernel, Unary):
        def forward(self, x):
            return 2 * x

    entry = make_op({"double": Doubler})().kernel_for(INTERFACE, call())
    assert isinstance(entry, Doubler)
    assert entry(21) == 42


def test_entry_is_what_entry_for_builds(sm80):
    class Custom(Kernel, Unary):
        def forward(self, x): ...

        @classmethod
        def entry_for(cls, call):
            return ("n", call.n), lambda: lambda x: (x, call.n)

    assert make_op({"custom": Custom})().kernel_for(INTERFACE, call(n=5))("x") == ("x", 5)


def test_key_for_names_the_winner_without_building(sm80):
    k = kernel("k")
    op = make_op({"k": k})()
    assert op.key_for(INTERFACE, call()) == "k"
    assert k.counts["entry_for"] == k.counts["build"] == 0
    op.kernel_for(INTERFACE, call())
    assert k.counts["build"] == 1


def test_the_op_picks_the_interface_and_keys_serve_the_interfaces_they_inherit(sm80):
    both = kernel("both", base=(Unary, Binary), general=True)
    op_cls = make_op(
        {"one": kernel("one"), "pair": kernel("pair", base=Binary), "both": both},
        interfaces={"one": Unary, "two": Binary},
    )
    op = op_cls()
    assert op.key_for("one", call()) == "one"
    assert op.key_for("two", call()) == "pair"
    assert [v.key for v in op.explain("one", call()).judgement.verdicts] == ["both", "one"]
    with pytest.raises(KeyError, match="no kernel interface 'three'"):
        op.kernel_for("three", call())
