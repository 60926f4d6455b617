"""Every workflow of the repository: `nox -s tests`, `nox -s demo`, `nox -s wheels`, `nox -s lint`.

Each session builds its own virtualenv. torch is pinned to the 2.13.0 CPU build first, so that
nothing later pulls a multi-GB CUDA build.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

TORCH = "torch==2.13.0"
DISTRIBUTIONS = ["./tileops-core", "./tileops-cuda", "./tileops-triton-backend"]
TEST_TOOLS = ["pytest>=8", "hypothesis>=6", "setuptools>=61", "wheel"]


def _install_project(session: nox.Session, *extra: str) -> None:
    session.install(TORCH, "numpy")  # torch warns on every import without numpy
    session.install(*extra, *[f"-e{d}" for d in DISTRIBUTIONS])


@nox.session
def tests(session: nox.Session) -> None:
    """The whole test suite on CPU: core, integration and TileLang compile checks; then the
    Triton kernels under the interpreter; then the example backend's own tests."""
    _install_project(session, *TEST_TOOLS)
    pytest = ("pytest", "-q", "-p", "no:cacheprovider")
    session.run(*pytest, "tests", "--ignore=tests/triton", *session.posargs)
    # Under TRITON_INTERPRET=1 the Triton backend also serves CPU tensors: its own process.
    session.run(*pytest, "tests/triton", *session.posargs, env={"TRITON_INTERPRET": "1"})
    # A separate process: importing the example backend registers its kernels for good.
    session.run(*pytest, "examples/acme-backend/tests")


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: run every op through the dispatcher and show how each call was served."""
    _install_project(session)
    session.run("python", "examples/quickstart.py")
    session.run("tileops", "list")


@nox.session
def bench(session: nox.Session) -> None:
    """Dispatch-overhead benchmark (CPU); GPU kernel benchmarks run on the GPU machine."""
    _install_project(session)
    session.run("python", "benchmarks/dispatch_overhead.py", *session.posargs)


@nox.session
def wheels(session: nox.Session) -> None:
    """Build the three distributions and the example backend as wheels into dist/."""
    session.install("build")
    for path in [*DISTRIBUTIONS, "./examples/acme-backend"]:
        session.run("python", "-m", "build", "--wheel", "--outdir", "dist", path)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
