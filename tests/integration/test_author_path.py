"""What a backend author meets beyond their own backend (issue 34): other installed backends,
overlapping targets, operator typos, a device kind of their own; fresh interpreters each."""

from __future__ import annotations

import sys
import textwrap
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conftest import Sites

# A second target claiming the CPU beside torch_cpu (the upstream-style fixture backend).
OVERLAP = """
warned = load_backends()
import torch
from tileops import TileOpsError
from tileops.backend import default_target, load_failures
from tileops.backend import register_detector, register_kernel_builder
from tileops.ops import RMSNormFwdOp
register_detector("other_cpu", lambda device: device.type == "cpu")
register_kernel_builder("RMSNormFwdOp", "other_cpu", lambda x, w, **p: lambda x, w: x)
op = RMSNormFwdOp(8)
try:
    op(torch.randn(2, 8))
    error = None
except TileOpsError as exc:
    error = f"{type(exc).__name__}: {exc}"
emit(settled=op.serving_target, error=error, default=default_target(), failures=load_failures(),
     warned=warned)
"""


def test_overlapping_targets_are_ambiguous_until_tileops_target_settles_them(sites: Sites):
    result = sites.python(OVERLAP, dists=["torch_cpu"])
    assert result["error"].startswith("AmbiguousTargetError: tileops::RMSNormFwdOp: several")
    settled = sites.python(OVERLAP, dists=["torch_cpu"], env={"TILEOPS_TARGET": "torch_cpu"})
    assert settled["settled"] == "torch_cpu" and settled["default"] == "torch_cpu"
    assert settled["error"] is None and settled["failures"] == []
    builtin = sites.python(OVERLAP, dists=["torch_cpu"], env={"TILEOPS_TARGET": "builtin"})
    assert builtin["settled"] == "builtin" and builtin["error"] is None


def test_a_typo_in_tileops_target_is_a_typo_with_its_close_match(sites: Sites):
    result = sites.python(OVERLAP, dists=["torch_cpu"], env={"TILEOPS_TARGET": "torch_cup"})
    assert result["failures"] == [
        "TILEOPS_TARGET (operator setting): TILEOPS_TARGET='torch_cup' names no registered "
        "target; known targets: torch_cpu, triton (and 'builtin' for the ops' own kernels) "
        "(a typo? did you mean 'torch_cpu'?)"
    ]
    assert result["warned"] == [
        f"tileops: an operator setting is ignored: {result['failures'][0].split(': ', 1)[1]}"
    ]


def test_a_typo_in_tileops_prefer_is_worded_as_a_typo_not_a_failed_backend(sites: Sites):
    env = {"TILEOPS_PREFER": "RMSNormFwdOp.rms_norm=acme>refrence"}
    result = sites.python(OVERLAP, dists=["acme"], env=env)
    problem = (
        "TILEOPS_PREFER RMSNormFwdOp.rms_norm=acme>refrence names key 'refrence', which no "
        "installed kernel of tileops::RMSNormFwdOp has (a typo? did you mean 'reference'?)"
    )
    assert result["failures"] == [f"TILEOPS_PREFER (operator setting): {problem}"]
    assert result["warned"] == [f"tileops: an operator setting is ignored: {problem}"]
    doctor = sites.cli("doctor", dists=["acme"], env=env, check=False)
    assert f"ERROR: operator setting ignored: {problem}" in doctor.stdout
    assert "backend not loaded" not in doctor.stdout


def test_doctor_fails_on_the_ambiguity_audit_finds(sites: Sites):
    doctor = sites.cli("doctor", dists=["acme", "fastnorm"], check=False)
    audit = sites.cli("audit", "RMSNormFwdOp", dists=["acme", "fastnorm"], check=False)
    assert audit.returncode == doctor.returncode == 1
    assert "ERROR: AMBIGUITY tileops::RMSNormFwdOp.rms_norm on cpu" in doctor.stdout
    assert "declare `preferred_over` on one of the kernels" in doctor.stdout


ISOLATED = """
load_backends()
from tileops.backend import registered_targets
from tileops.testing import isolated_registry
before = registered_targets()
with isolated_registry(backends=["acme"]):
    inside = registered_targets()
emit(before=before, inside=inside, after=registered_targets())
"""


def test_isolated_registry_keeps_only_the_named_backends(sites: Sites):
    result = sites.python(ISOLATED, dists=["acme", "torch_cpu"])
    assert {"acme", "torch_cpu", "triton"} <= set(result["before"])
    assert result["inside"] == ["acme"]
    assert result["after"] == result["before"]


def test_the_tileops_registry_fixture_isolates_to_the_ini_option(sites: Sites, tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\ntileops_backends = acme\n")
    (tmp_path / "test_mine.py").write_text(
        textwrap.dedent(
            """
            from tileops.backend import registered_targets

            def test_only_mine(tileops_registry):
                assert registered_targets() == ["acme"]

            def test_unfixtured_sees_all():
                assert "torch_cpu" in registered_targets()
            """
        )
    )
    proc = sites.run(
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        dists=["acme", "torch_cpu"],
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout


PRIVATEUSE1 = """
import torch
from tileops import Kernel, SoftmaxFwdOp
from tileops.backend import register_kernel_type
from tileops.cli import main
from tileops.ops import SoftmaxInterface
from tileops.plugins import LOADER, BackendInfo

LOADER.ensure_loaded()
if RENAME:
    torch.utils.rename_privateuse1_backend("vendorx")
else:  # a backend declares the device type but left the renaming to others
    LOADER.infos["vx"] = BackendInfo("vx", "vendorx-backend", "0.1", ("vendorx",), 1)

class VendorSoftmax(Kernel, SoftmaxInterface):
    devices = {"vendorx"}
    def forward(self, x):
        return x

register_kernel_type(SoftmaxFwdOp, "vendorx_softmax", VendorSoftmax)
code = main(["explain", "SoftmaxFwdOp", "--shape", "4,8", "--dtype", "float32",
             "--device", "vendorx"])
emit(code=code, name=torch._C._get_privateuse1_backend_name())
"""


def test_a_device_kind_of_its_own_through_privateuse1(sites: Sites):
    for rename in (True, False):
        proc = sites.run(["-c", f"RENAME = {rename}\n" + _script(sites, PRIVATEUSE1)])
        assert "vendorx_softmax [" in proc.stdout and "chosen" in proc.stdout
        assert '"code": 0' in proc.stdout and '"name": "vendorx"' in proc.stdout


def _script(sites: Sites, body: str) -> str:
    # the prelude of the conftest that made `sites` (another folder's conftest may be the
    # module named "conftest" when several test folders run in one session)
    prelude = sys.modules[type(sites).__module__].PRELUDE
    return prelude + textwrap.dedent(body)
