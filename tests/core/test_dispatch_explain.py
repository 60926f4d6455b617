"""`Op.explain`: every key with its verdict and why; it builds nothing and never raises."""

from __future__ import annotations

from dispatch_kit import INTERFACE, call, kernel, make_op

from tileops import AmbiguousDispatchError, NoImplementationError


def test_explain_lists_every_key_with_its_verdict_and_reason(sm80):
    chosen = kernel("chosen", preferred_over={"beaten"})
    op = make_op(
        {
            "beaten": kernel("beaten"),
            "chosen": chosen,
            "fallback": kernel("fallback", general=True),
            "hopper": kernel("hopper", supported_archs={90}),
            "picky": kernel("picky", refuse=lambda c: "needs n >= 1024"),
        }
    )()
    report = op.explain(INTERFACE, call())
    lines = report.text.splitlines()
    assert lines[0].startswith(
        "dispatch_kit::TestOp.unary for ShapeCall(device=device(type='cuda', index=0)"
    )
    expectations = {
        "beaten": "outranked: chosen preferred over it",
        "chosen": "chosen: available, serves this call, and ranks above beaten, fallback",
        "fallback": "outranked: general; ranks below beaten, chosen",
        "hopper": "unavailable: supports sm_90; cuda:0 has sm_80",
        "picky": "refused: needs n >= 1024",
    }
    for key, verdict in expectations.items():
        assert any(line.startswith(f"  {key} [") and line.endswith(verdict) for line in lines), key
        assert report.verdict(key) == verdict.partition(":")[0]
    assert lines[-1] == "=> chosen (chosen)"
    assert report.chosen == op.key_for(INTERFACE, call()) == "chosen"
    assert chosen.counts["entry_for"] == chosen.counts["build"] == 0


def test_explain_reports_the_error_dispatch_would_raise(sm80):
    op = make_op({"a": kernel("a"), "b": kernel("b")})()
    report = op.explain(INTERFACE, call())
    assert isinstance(report.error, AmbiguousDispatchError)
    assert report.chosen is None and report.verdict("a") == report.verdict("b") == "tied"
    assert report.text.splitlines()[-1].startswith(
        "=> AmbiguousDispatchError: dispatch_kit::TestOp.unary: dispatch is ambiguous "
        "between 'a' [module dispatch_kit], 'b' [module dispatch_kit]"
    )
    refused = make_op({"a": kernel("a", refuse=lambda c: "no")})().explain(INTERFACE, call())
    assert isinstance(refused.error, NoImplementationError)


def test_explain_names_where_each_key_came_from(sm80):
    text = make_op({"k": kernel("k")})().explain(INTERFACE, call()).text
    assert "  k [module " in text
