"""Real distributions, installed with pip, seen by fresh interpreters.

Each backend distribution (the example backend and the fixture backends under `fixtures/`) is
installed once per session with pip into a site directory of its own. A test chooses which of
them a subprocess sees by putting their directories on PYTHONPATH, so every scenario starts
from a fresh interpreter and a fresh entry-point scan, as users get. The distributions of this
environment (tileops-core and the first-party backends) are visible to every subprocess.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
FAKE_COMPILERS = HERE / "fake_compilers"
DISTRIBUTIONS = {
    "acme": REPO / "examples" / "acme-backend",
    "halfbroken": HERE / "fixtures" / "halfbroken",
    "future": HERE / "fixtures" / "future-protocol",
    "sloppy": HERE / "fixtures" / "sloppy",
    "interrupting": HERE / "fixtures" / "interrupting",
    "threaded": HERE / "fixtures" / "threaded",
    "fastnorm": HERE / "fixtures" / "fastnorm",
    "borrower": HERE / "fixtures" / "borrower",
    "late": HERE / "fixtures" / "late",
    "setup": HERE / "fixtures" / "setup",
    "torch_cpu": REPO / "tests" / "fixtures" / "upstream-style-backend",
}
"""Short name -> source tree of every distribution the tests install."""

ENV_CONTROLS = (
    "TILEOPS_BACKENDS",
    "TILEOPS_DISABLE_BACKENDS",
    "TILEOPS_DENY",
    "TILEOPS_PIN",
    "TILEOPS_PREFER",
    "TILEOPS_STRICT",
    "TILEOPS_TRITON_AUTOTUNE",
    "TILEOPS_LOG",
    "TILEOPS_TARGET",
)
RESULT = "RESULT "

# Prepended to every script: helpers the scripts share.
PRELUDE = f'''
import json, sys, warnings

def emit(**values):
    """Hand `values` back to the test (JSON on one marked line)."""
    print({RESULT!r} + json.dumps(values, default=str), flush=True)

def load_backends():
    """Load the backends now; return the RuntimeWarnings loading emitted, as strings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import tileops.backend
        tileops.backend.backends()
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]

def loaded_modules(*prefixes):
    """Top-level modules imported so far whose names start with one of `prefixes`."""
    return sorted(m for m in sys.modules if "." not in m and m.startswith(prefixes))
'''


class Sites:
    """The installed distributions, and ways to run Python that sees a chosen few of them."""

    fake_compilers = FAKE_COMPILERS

    def __init__(self, directories: Mapping[str, Path], workdir: Path) -> None:
        self.directories = dict(directories)
        self.workdir = workdir  # empty: `python -c` puts the working directory on sys.path

    def env(
        self, dists: Iterable[str], paths: Iterable[Path], variables: Mapping[str, str]
    ) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ENV_CONTROLS}
        entries = [*map(str, paths), *(str(self.directories[d]) for d in dists)]
        if env.get("PYTHONPATH"):
            entries.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(entries)
        env.update(variables)
        return env

    def run(
        self,
        argv: list[str],
        *,
        dists: Iterable[str] = (),
        paths: Iterable[Path] = (),
        env: Mapping[str, str] | None = None,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, *argv],
            env=self.env(dists, paths, env or {}),
            capture_output=True,
            text=True,
            timeout=120,
            cwd=self.workdir,
        )
        if check and proc.returncode != 0:
            pytest.fail(
                f"{argv[:2]} exited {proc.returncode}\n--- stdout\n{proc.stdout}\n"
                f"--- stderr\n{proc.stderr}",
                pytrace=False,
            )
        return proc

    def python(self, script: str, **options: Any) -> dict[str, Any]:
        """Run `script` (after PRELUDE) and return what it passed to `emit`."""
        proc = self.run(["-c", PRELUDE + textwrap.dedent(script)], **options)
        lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
        assert len(lines) == 1, f"script emitted {len(lines)} results:\n{proc.stdout}{proc.stderr}"
        return json.loads(lines[0][len(RESULT) :])

    def cli(self, *args: str, **options: Any) -> subprocess.CompletedProcess[str]:
        """Run the `tileops` command line."""
        return self.run(["-m", "tileops.cli", *args], **options)


@pytest.fixture(scope="session")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Sites:
    """Install every distribution of DISTRIBUTIONS once, in parallel, each into its own site."""
    root = tmp_path_factory.mktemp("sites")
    pending = {}
    for name, source in DISTRIBUTIONS.items():
        # Build from a copy: an in-tree build would leave build/ and *.egg-info in the repo.
        tree = shutil.copytree(
            source,
            root / "sources" / name,
            ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests"),
        )
        command = [
            sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            "--no-deps", "--no-build-isolation", "--no-index",
            "--target", str(root / name), str(tree),
        ]  # fmt: skip
        env = {**os.environ, "PIP_ROOT_USER_ACTION": "ignore"}
        pending[name] = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    for name, proc in pending.items():
        output, _ = proc.communicate(timeout=300)
        if proc.returncode != 0:
            pytest.fail(f"pip could not install {DISTRIBUTIONS[name]}:\n{output}", pytrace=False)
    workdir = root / "work"
    workdir.mkdir()
    return Sites({name: root / name for name in DISTRIBUTIONS}, workdir)
