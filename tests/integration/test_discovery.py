"""Discovery: an installed distribution's entry point is found, loaded once, in a fixed order,
described by its hook, listed by the CLI, and loading it imports no compiler."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conftest import Sites

LOAD = """
warned = load_backends()
from tileops.backend import backends, load_failures, registered_targets
described = dict(
    backends={b.entry_point: [b.distribution, b.version, list(b.devices), b.protocol]
              for b in backends()},
    order=[b.entry_point for b in backends()],
    failures=load_failures(),
    warned=warned,
    targets=registered_targets(),
)
"""
DESCRIBE = LOAD + "emit(**described)"


def test_an_installed_backend_is_discovered_and_described_by_its_hook(sites: Sites) -> None:
    result = sites.python(DESCRIBE, dists=["acme"])
    assert result["backends"]["acme"] == ["acme-backend", "0.1.0", ["cpu"], 1]
    assert result["failures"] == [] and result["warned"] == []
    assert "acme" in result["targets"]


def test_a_backend_without_hook_or_protocol_loads_and_errors_name_it(sites: Sites) -> None:
    """Described from its distribution's metadata; its raising detector is reported with it."""
    script = """
import torch
from tileops import BackendError, SoftmaxFwdOp
try:
    SoftmaxFwdOp()(torch.ones(3))
    detector_error = None
except BackendError as exc:
    detector_error = str(exc)
emit(**described, detector_error=detector_error)
"""
    result = sites.python(LOAD + script, dists=["sloppy"])
    assert result["backends"]["sloppy"] == ["tileops-fixture-sloppy", "0.2.0", [], None]
    assert result["failures"] == []
    assert (
        "the detector of target 'sloppy' (tileops-fixture-sloppy, entry point 'sloppy') raised "
        "RuntimeError: sloppy cannot probe devices"
    ) in result["detector_error"]


def test_tileops_list_shows_the_backend_its_kernel_and_its_target(sites: Sites) -> None:
    out = sites.cli("list", dists=["acme"]).stdout
    assert "acme (acme-backend 0.1.0, protocol 1) devices: cpu" in out
    assert re.search(r"RMSNormFwdOp\.rms_norm .*\n(    .*\n)*    acme +cpu +acme-backend", out), out
    assert "  acme: serves SoftmaxFwdOp; detector from acme-backend, entry point 'acme'" in out
    assert "Load failures: none" in out


def test_load_order_is_entry_point_name_order_whatever_the_path_order(sites: Sites) -> None:
    """sloppy registers acme's key: which of the two fails must not depend on sys.path."""
    dists = ["sloppy", "future", "acme"]
    forward = sites.python(DESCRIBE, dists=dists)
    backward = sites.python(DESCRIBE, dists=dists[::-1])
    assert forward["order"] == backward["order"] == sorted(forward["order"])
    assert forward["failures"] == backward["failures"]
    assert [f.split(" ")[0] for f in forward["failures"]] == ["future", "sloppy"]


def test_import_tileops_loads_no_backend_and_loading_imports_no_compiler(sites: Sites) -> None:
    """Fake `triton` and `tilelang` packages are importable: importing one would show."""
    result = sites.python(
        """
        import importlib.util
        import tileops
        after_import = loaded_modules("tileops_", "triton", "tilelang")
        load_backends()
        tileops.RMSNormFwdOp(64)
        tileops.SoftmaxFwdOp(target="acme")
        emit(
            fakes_importable=all(importlib.util.find_spec(m) for m in ("triton", "tilelang")),
            after_import=after_import,
            after_load=loaded_modules("tileops_", "triton", "tilelang"),
        )
        """,
        dists=["acme"],
        paths=[sites.fake_compilers],
    )
    assert result["fakes_importable"]
    assert result["after_import"] == []
    assert result["after_load"] == ["tileops_acme", "tileops_cuda", "tileops_triton"]


def test_a_backend_imported_directly_first_still_loads_once_with_provenance(sites: Sites) -> None:
    """`import tileops_acme` registers, which starts discovery from inside acme's own import."""
    result = sites.python(
        """
        import tileops_acme
        import torch
        from tileops.backend import backends, load_failures
        from tileops.ops import RMSNormCall, RMSNormFwdOp
        call = RMSNormCall(device=torch.device("cpu"), n=64, eps=1e-6, dtype=torch.float32,
                           has_weight=True)
        emit(
            order=[b.entry_point for b in backends()],
            devices=[list(b.devices) for b in backends() if b.entry_point == "acme"],
            failures=load_failures(),
            explained=RMSNormFwdOp(64).explain("rms_norm", call).text,
        )
        """,
        dists=["acme"],
    )
    assert result["order"].count("acme") == 1 and result["devices"] == [["cpu"]]
    assert result["failures"] == []
    assert "acme [acme-backend, entry point 'acme']: chosen" in result["explained"]


SETUP = """
warned = load_backends()
import torch
from tileops.backend import backends, load_failures
from tileops.ops import SoftmaxCall, SoftmaxFwdOp
call = SoftmaxCall(device=torch.device("cpu"), n=4, dtype=torch.float32)
emit(
    failures=load_failures(),
    loaded=[b.entry_point for b in backends()],
    key=SoftmaxFwdOp().key_for("softmax", call),
    source=SoftmaxFwdOp().explain("softmax", call).winner_source,
)
"""


def test_an_entry_point_naming_a_function_has_it_called(sites: Sites) -> None:
    """`setup = "pkg:setup"`: the module registers nothing at import; its setup() does."""
    result = sites.python(SETUP, dists=["setup"])
    assert result["key"] == "setup"
    assert result["source"] == "tileops-fixture-setup, entry point 'setup'"
    assert "setup" in result["loaded"] and "notcallable" not in result["loaded"]


def test_an_entry_point_naming_something_not_callable_fails_to_load(sites: Sites) -> None:
    result = sites.python(SETUP, dists=["setup"])
    assert result["failures"] == [
        "notcallable (tileops-fixture-setup): BackendError: entry point 'notcallable' = "
        "'tileops_fixture_setup.settings:SETUP' names SETUP, a str, which tileops cannot call; "
        "name the module ('tileops_fixture_setup.settings') or a function in it that registers "
        "the backend"
    ]
