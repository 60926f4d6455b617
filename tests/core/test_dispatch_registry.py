"""`isolated_registry` undoes registrations; `import tileops` stays light."""

from __future__ import annotations

import subprocess
import sys

import pytest
from dispatch_kit import INTERFACE, call, kernel, make_op

from tileops.backend import (
    default_target,
    register_detector,
    register_kernel_type,
    registered_targets,
    set_default_target,
)
from tileops.testing import isolated_registry


def test_isolated_registry_undoes_kernel_types_and_default_target(sm80):
    op_cls = make_op({"in_tree": kernel("in_tree", general=True)}, name="IsolationOp")
    before = default_target()
    with isolated_registry():
        register_kernel_type(op_cls, "plugged", kernel("plugged"))
        register_detector("isolation-target", lambda device: False)
        set_default_target("isolation-target")
        assert op_cls().key_for(INTERFACE, call()) == "plugged"
        assert default_target() == "isolation-target"
    assert op_cls().key_for(INTERFACE, call()) == "in_tree"
    assert default_target() == before
    assert "isolation-target" not in registered_targets()


def test_isolated_registry_undoes_registrations_when_the_block_raises(sm80):
    op_cls = make_op({"in_tree": kernel("in_tree", general=True)}, name="IsolationRaisesOp")
    with pytest.raises(RuntimeError), isolated_registry():
        register_kernel_type(op_cls, "plugged", kernel("plugged"))
        raise RuntimeError
    assert op_cls().key_for(INTERFACE, call()) == "in_tree"


def test_import_tileops_and_backend_discovery_import_no_backend_compiler():
    code = (
        "import sys, tileops, tileops.backend, tileops.testing; "
        "tileops.backend.backends(); "  # discovery imports every installed backend module
        "print(sorted(m for m in ('tilelang', 'triton') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
