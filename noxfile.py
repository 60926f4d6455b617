"""Every workflow of the repository: `nox -s tests`, `nox -s demo`, `nox -s docs`, `nox -s wheels`,
`nox -s lint`.

Each session builds its own virtualenv once and reuses it on later runs; with uv on the PATH nox
builds it with uv (much faster), else with virtualenv. torch is pinned to the 2.13.0 CPU build
first, so that nothing later pulls a multi-GB CUDA build.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True
nox.options.default_venv_backend = "uv|virtualenv"

TORCH = "torch==2.13.0"
DISTRIBUTIONS = ["./tileops-core", "./tileops-cuda", "./tileops-triton-backend"]
# transformers: kernelize is tested on its models (tiny configs, random weights, no downloads).
# import-linter: the import contracts (pyproject.toml), checked before the tests.
TEST_TOOLS = [
    "pytest>=8",
    "hypothesis>=6",
    "setuptools>=61",
    "wheel",
    "transformers>=5.17,<6",
    "import-linter>=2.17",
]
UPSTREAM_STYLE_BACKEND = "tests/fixtures/upstream-style-backend"
"""A backend written only to upstream TileOPs' protocol (issue 34): pip-installed for its own
test run, into a folder of its own, since its detector claims the CPU."""
SOURCES = [f"{d}/src" for d in DISTRIBUTIONS] + ["./examples/acme-backend/src"]
"""Where lint-imports finds the packages it checks (it reads them, it imports nothing)."""


def _install_project(session: nox.Session, *extra: str) -> None:
    """Install torch, `extra` and the distributions (editable), unless this virtualenv already
    has exactly these requirements: a repeat run then starts at once, and code changes need no
    reinstall (editable). A changed pyproject.toml or pin installs again."""
    stamp = Path(session.virtualenv.location) / ".tileops-requirements"
    wanted = _requirements(extra)
    if stamp.is_file() and stamp.read_text() == wanted:
        session.log("requirements unchanged since this virtualenv was set up: not reinstalling")
        return
    session.install(TORCH, "numpy", *_pip_settings(session))  # numpy: torch warns without it
    session.install(*extra, *[f"-e{d}" for d in DISTRIBUTIONS])
    stamp.write_text(wanted)


def _pip_settings(session: nox.Session) -> list[str]:
    """uv ignores pip's configuration: hand it the local wheel folders pip is configured with
    (where the CPU build of torch lies), so it does not fetch another build."""
    links = os.environ.get("PIP_FIND_LINKS", "")
    if session.venv_backend != "uv" or not links:
        return []
    return [arg for link in links.split() for arg in ("--find-links", link)]


def _requirements(extra: tuple[str, ...]) -> str:
    """A digest of everything `_install_project` installs."""
    digest = hashlib.sha256(" ".join([TORCH, *extra]).encode())
    for distribution in DISTRIBUTIONS:
        digest.update((Path(distribution) / "pyproject.toml").read_bytes())
    return digest.hexdigest()


@nox.session
def tests(session: nox.Session) -> None:
    """The import contracts; then the whole test suite on CPU: core, integration and TileLang
    compile checks; then the Triton kernels under the interpreter and compiled for sm_90; then
    the example backend's own tests; then those of a backend written to upstream TileOPs'
    protocol, pip-installed for that run alone; then `tileops audit`."""
    _install_project(session, *TEST_TOOLS)
    _lint_imports(session)
    pytest = ("pytest", "-q", "-p", "no:cacheprovider")
    session.run(*pytest, "tests", "--ignore=tests/triton", *session.posargs)
    # Under TRITON_INTERPRET=1 the Triton backend also serves CPU tensors: its own process.
    session.run(*pytest, "tests/triton", *session.posargs, env={"TRITON_INTERPRET": "1"})
    # The Triton programs compiled offline for sm_90 (the interpreter compiles nothing).
    compiled = ("tests/triton/test_compile.py", "tests/triton/test_fused_compile.py")
    session.run(*pytest, *compiled, *session.posargs)
    # A separate process: importing the example backend registers its kernels for good.
    session.run(*pytest, "examples/acme-backend/tests")
    _upstream_style_backend(session, pytest)
    # Every op's calls on simulated GPUs: a gap or an ambiguity between kernels fails CI.
    session.run("tileops", "audit")


def _upstream_style_backend(session: nox.Session, pytest: tuple[str, ...]) -> None:
    """Install the upstream-style backend with pip into a folder outside the virtualenv and run
    its own tests, unchanged, with only that folder added to the path: its entry point is found
    there, and the core tests and `tileops audit` never see its CPU-claiming target."""
    folder = Path(session.create_tmp()) / "upstream-style-backend"
    shutil.rmtree(folder, ignore_errors=True)
    options = ["--no-deps", "--no-build-isolation", "--target", str(folder)]
    if session.venv_backend == "uv":  # uv's virtualenvs have no pip
        python = str(Path(session.bin) / "python")
        session.run(
            "uv", "pip", "install", "--python", python, *options, UPSTREAM_STYLE_BACKEND,
            external=True,
        )  # fmt: skip
    else:
        session.run("python", "-m", "pip", "install", "--quiet", *options, UPSTREAM_STYLE_BACKEND)
    session.run(*pytest, f"{UPSTREAM_STYLE_BACKEND}/tests", env={"PYTHONPATH": str(folder)})


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: run every op through the dispatcher and show how each call was served."""
    _install_project(session)
    session.run("tileops", "demo")


@nox.session
def docs(session: nox.Session) -> None:
    """The API reference and guides as a static site in build/site; warnings are errors."""
    session.install("mkdocs>=1.6", "mkdocstrings[python]>=0.26")
    session.run("mkdocs", "build", "--strict")


@nox.session
def bench(session: nox.Session) -> None:
    """Dispatch-overhead benchmark (CPU); GPU kernel benchmarks run on the GPU machine."""
    _install_project(session)
    session.run("python", "benchmarks/suites/dispatch_overhead.py", *session.posargs)


@nox.session
def wheels(session: nox.Session) -> None:
    """Build the three distributions and the example backend as wheels into dist/."""
    session.install("build")
    for path in [*DISTRIBUTIONS, "./examples/acme-backend"]:
        session.run("python", "-m", "build", "--wheel", "--outdir", "dist", path)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff", "import-linter>=2.17")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    _lint_imports(session)


def _lint_imports(session: nox.Session) -> None:
    """The import contracts of pyproject.toml: the core's layers, no cycles, backends apart."""
    session.run("lint-imports", env={"PYTHONPATH": os.pathsep.join(SOURCES)})
