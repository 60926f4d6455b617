"""Construction-time validation of an op's kernels: each error names the class and the problem."""

from __future__ import annotations

import pytest
from dispatch_kit import INTERFACE, Binary, Unary, call, kernel, make_op

from tileops import BackendError, KernelDeclarationError
from tileops.backend import register_kernel_type


def construct(**kernel_types):
    return make_op(kernel_types)()


def test_validation_errors_are_backend_and_type_errors():
    assert issubclass(KernelDeclarationError, BackendError)
    assert issubclass(KernelDeclarationError, TypeError)


def test_a_class_implementing_none_of_the_interfaces():
    with pytest.raises(KernelDeclarationError, match=r"'Stray'.*implements none of the op's"):
        construct(ok=kernel("Fine"), stray=kernel("Stray", base=Binary))


def test_a_class_that_is_not_a_kernel():
    class Loose(Unary):
        pass

    with pytest.raises(KernelDeclarationError, match=r"Loose.*is not a subclass of tileops.Kernel"):
        construct(loose=Loose)


@pytest.mark.parametrize("method", ["entry_for", "refusal"])
@pytest.mark.parametrize("wrap", [lambda f: f, staticmethod])
def test_entry_for_and_refusal_must_be_classmethods(method, wrap):
    with pytest.raises(KernelDeclarationError, match=rf"Unbound.*: {method} must be a classmethod"):
        kernel("Unbound", **{method: wrap(lambda *args: None)})


@pytest.mark.parametrize(
    "forward",
    [lambda self: None, lambda self, y: None, lambda self, x, extra: None],
    ids=["too-few", "renamed", "too-many"],
)
def test_forward_must_take_the_interface_arguments(forward):
    with pytest.raises(
        KernelDeclarationError, match=r"Narrow.*does not take the arguments of Unary.forward"
    ):
        construct(k=kernel("Narrow", forward=forward))


@pytest.mark.parametrize(
    "forward", [lambda self, x, extra=None: None, lambda self, *args, **kwargs: None]
)
def test_forward_may_take_more_than_the_interface(forward, sm80):
    assert construct(k=kernel("Wide", forward=forward)).key_for(INTERFACE, call()) == "k"


def test_more_than_one_general_per_interface():
    with pytest.raises(
        KernelDeclarationError, match=r"more than one general implementation \(a \(GenA .*b \(GenB "
    ):
        construct(a=kernel("GenA", general=True), b=kernel("GenB", general=True))


def test_one_general_per_interface_is_counted_per_interface(sm80):
    op_cls = make_op(
        {"u": kernel("GenU", general=True), "b": kernel("GenB", base=Binary, general=True)},
        interfaces={"u": Unary, "b": Binary},
    )
    assert op_cls().key_for("b", call()) == "b"


def test_preferred_over_on_a_general_implementation():
    with pytest.raises(KernelDeclarationError, match=r"GenPref.*is general and declares pref"):
        construct(g=kernel("GenPref", general=True, preferred_over={"s"}), s=kernel("S"))


@pytest.mark.parametrize(
    ("preferences", "path"),
    [
        ({"a": {"a"}}, "a -> a"),
        ({"a": {"b"}, "b": {"a"}}, "a -> b -> a"),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, "a -> b -> c -> a"),
    ],
)
def test_preference_cycles(preferences, path):
    kernels = {
        key: kernel(f"Cyc{key.upper()}", preferred_over=prefs) for key, prefs in preferences.items()
    }
    with pytest.raises(KernelDeclarationError, match=rf"cycle: {path} \(a \(CycA "):
        construct(**kernels)


def test_preferring_an_absent_key_is_allowed_and_says_nothing(sm80):
    """Another distribution's key, not installed here: no warning on every explain."""
    op = construct(k=kernel("K", preferred_over={"gone"}))
    assert op.key_for(INTERFACE, call()) == "k"
    assert "gone" not in op.explain(INTERFACE, call()).text


def test_preferring_a_key_close_to_an_installed_one_is_flagged_as_a_likely_typo(sm80):
    op = construct(k=kernel("K", preferred_over={"other"}), othr=kernel("Othr"))
    text = op.explain(INTERFACE, call()).text
    assert "k is preferred over 'other', which is not installed" in text
    assert "did you mean 'othr'?" in text


@pytest.mark.parametrize(
    ("declarations", "problem"),
    [
        ({"devices": frozenset({1})}, "devices must be a set of device type names"),
        ({"supported_archs": frozenset({"sm_90"})}, "supported_archs must be None or a set"),
        ({"preferred_over": frozenset({3})}, "preferred_over must be a set of kernel keys"),
    ],
)
def test_malformed_declarations(declarations, problem):
    with pytest.raises(KernelDeclarationError, match=rf"Odd.*{problem}"):
        construct(k=kernel("Odd", **declarations))


def test_a_backend_cannot_reuse_an_in_tree_key(isolated):
    op_cls = make_op({"k": kernel("InTree")}, name="KeyClashOp")
    with pytest.raises(KernelDeclarationError, match=r"'k' \(FromBackend\).*already InTree"):
        register_kernel_type(op_cls, "k", kernel("FromBackend"))
    op_cls()  # the op is intact


@pytest.mark.parametrize(
    ("declarations", "problem"),
    [
        ({"supported_archs": 90}, r"supported_archs must be None or a set of integers .*got 90"),
        ({"supported_archs": "sm_90"}, r"supported_archs must be None or a set .*got 'sm_90'"),
        ({"devices": None}, r"devices must be a set of device type names .*got None"),
        ({"preferred_over": 3}, r"preferred_over must be a set of kernel keys, got 3"),
        ({"general": "yes"}, r"general must be True or False, got 'yes'"),
    ],
)
def test_malformed_declarations_fail_where_the_class_is_defined(declarations, problem):
    with pytest.raises(KernelDeclarationError, match=rf"kernel class 'Odd': {problem}"):
        kernel("Odd", **declarations)


@pytest.mark.parametrize("answer", [False, 0, "", "   ", 1.5])
def test_a_refusal_must_be_none_or_a_sentence(answer, sm80):
    op = construct(k=kernel("Vague", refuse=lambda call: answer))
    with pytest.raises(
        KernelDeclarationError,
        match=rf"refusal\(\) of kernel 'k' \(Vague from .*\) returned {answer!r} for "
        r"ShapeCall\(.*\); a refusal must return None \(serves the call\) or a non-empty sentence",
    ):
        op.kernel_for(INTERFACE, call())
