"""Operators' controls: TILEOPS_BACKENDS (allow list; empty loads none) and
TILEOPS_DISABLE_BACKENDS (deny list). A backend kept out is not even imported; a name that no
installed distribution provides is reported, not ignored."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Sites

INSTALLED = ["acme", "future", "sloppy"]  # plus the first-party cuda and triton backends

SCRIPT = """
warned = load_backends()
import torch
from tileops.backend import backends, load_failures
from tileops.ops import RMSNormCall, RMSNormFwdOp

call = RMSNormCall(device=torch.device("cpu"), n=64, eps=1e-6, dtype=torch.float32,
                   has_weight=True)
emit(
    loaded=[b.entry_point for b in backends()],
    imported=loaded_modules("tileops_"),
    failures=load_failures(),
    warned=len(warned),
    key=RMSNormFwdOp(64).key_for("rms_norm", call),
)
"""


def unknown(variable: str, name: str) -> str:
    return (
        f"{name} (not installed): {variable} names {name!r}, but no installed distribution "
        "provides an entry point of that name in group 'tileops.backends' (installed: acme, "
        "cuda, future, sloppy, triton)"
    )


@pytest.mark.parametrize(
    ("env", "loaded", "failures", "key"),
    [
        ({"TILEOPS_BACKENDS": "acme,cuda"}, ["acme", "cuda"], [], "acme"),
        ({"TILEOPS_BACKENDS": ""}, [], [], "reference"),
        ({"TILEOPS_DISABLE_BACKENDS": "future, sloppy"}, ["acme", "cuda", "triton"], [], "acme"),
        (
            {"TILEOPS_BACKENDS": "acme,sloppy", "TILEOPS_DISABLE_BACKENDS": "sloppy"},
            ["acme"],
            [],
            "acme",
        ),
        (
            {"TILEOPS_BACKENDS": "cuda,nosuch", "TILEOPS_DISABLE_BACKENDS": "ghost"},
            ["cuda"],
            [unknown("TILEOPS_BACKENDS", "nosuch"), unknown("TILEOPS_DISABLE_BACKENDS", "ghost")],
            "reference",
        ),
    ],
    ids=["allow", "allow-none", "deny", "deny-beats-allow", "unknown-names"],
)
def test_only_allowed_and_not_denied_backends_are_imported(
    sites: Sites, env: dict[str, str], loaded: list[str], failures: list[str], key: str
) -> None:
    result = sites.python(SCRIPT, dists=INSTALLED, env=env)
    assert result["loaded"] == loaded
    assert result["imported"] == [f"tileops_{name}" for name in loaded]
    assert result["failures"] == failures
    assert result["warned"] == len(failures)
    assert result["key"] == key


FLAGS = """
warned = load_backends()
from tileops.backend import load_failures
import tileops_triton.compile
emit(failures=load_failures(), warned=warned, autotune=tileops_triton.compile.AUTOTUNE)
"""


def not_a_boolean(variable: str, value: str) -> str:
    return (
        f"{variable}={value!r} is not a boolean: use 1, true, yes or on; 0, false, no or off; "
        "or leave it empty"
    )


@pytest.mark.parametrize(
    ("value", "autotune"), [("off", False), ("No", False), (" 0 ", False), ("on", True), ("", True)]
)
def test_tileops_triton_autotune_reads_the_boolean_words(
    sites: Sites, value: str, autotune: bool
) -> None:
    result = sites.python(FLAGS, env={"TILEOPS_TRITON_AUTOTUNE": value})
    assert result["autotune"] is autotune and result["failures"] == []


def test_a_flag_that_is_no_boolean_is_reported_at_load_naming_the_variable(sites: Sites) -> None:
    script = """
    warned = load_backends()
    from tileops.backend import backends, load_failures
    emit(failures=load_failures(), warned=warned, loaded=[b.entry_point for b in backends()])
    """
    env = {"TILEOPS_STRICT": "banana", "TILEOPS_TRITON_AUTOTUNE": "yes please"}
    result = sites.python(script, env=env)
    strict = f"TILEOPS_STRICT (operator setting): {not_a_boolean('TILEOPS_STRICT', 'banana')}"
    triton = "triton (tileops-triton-backend): ControlError: " + not_a_boolean(
        "TILEOPS_TRITON_AUTOTUNE", "yes please"
    )
    assert result["failures"] == [triton, strict]
    assert len(result["warned"]) == 2 and "triton" not in result["loaded"]
