"""`launching.launch`: a key seen before launches the compiled kernel directly, with every
argument Triton would pass; a key that may specialize differently, hooks and foreign kernels
take Triton's own path. On CPU a stand-in program records both paths; `gpu` tests run real
programs over aligned and misaligned views."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from triton_kit import TOLERANCE, rel_error

from tileops_triton import launching
from tileops_triton.declare import INTERPRETING


def stand_in_source(X, Y, n, scale, BLOCK, FLAG=False):  # noqa: ANN001, N803
    """The parameters of a Triton program: runtime ones, a constexpr, a defaulted one."""


class StandInKernel:
    function, packed_metadata = "function", "metadata"

    def __init__(self) -> None:
        self.direct: list[tuple] = []

    def run(self, *args: object) -> None:
        self.direct.append(args)


class StandInProgram:
    """What `launch` reads of a JITFunction: `fn`, `pre_run_hooks` and `[grid](...)`."""

    fn = staticmethod(stand_in_source)

    def __init__(self, kernel: object) -> None:
        self.kernel, self.pre_run_hooks, self.through_triton = kernel, [], []

    def __getitem__(self, grid: tuple) -> object:
        def run(*args: object, **options: object) -> object:
            self.through_triton.append((grid, args, options))
            return self.kernel

        return run


@pytest.fixture
def compiled_path(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """`launch` as on a GPU without hooks: device 0, stream 77."""
    hooks = SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)
    monkeypatch.setattr(launching, "INTERPRETING", False)
    monkeypatch.setattr(launching, "_runtime", lambda: hooks)
    monkeypatch.setattr(launching, "_direct", {})
    monkeypatch.setattr(launching, "_current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 77, raising=False)
    return hooks


def test_a_key_seen_before_launches_directly_with_every_parameter(compiled_path) -> None:
    program = StandInProgram(StandInKernel())
    x, y = torch.zeros(8), torch.zeros(8)
    launching.launch(program, (3, 2), x, y, 8, 0.5, BLOCK=16, num_warps=4)
    assert len(program.through_triton) == 1 and not program.kernel.direct
    launching.launch(program, (3, 2), x, y, 8, 0.5, BLOCK=16, num_warps=4)
    assert len(program.through_triton) == 1
    assert program.kernel.direct == [
        (3, 2, 1, 77, "function", "metadata", None, None, None, x, y, 8, 0.5, 16, False)
    ]


@pytest.mark.parametrize(
    "change",
    ["misaligned", "dtype", "int", "float", "constexpr", "option"],
)
def test_anything_triton_may_specialize_on_takes_its_path(compiled_path, change: str) -> None:
    program = StandInProgram(StandInKernel())
    base = torch.zeros(16)
    args = {"X": base[:8], "Y": base[:8], "n": 8, "scale": 0.5}
    options = {"BLOCK": 16, "num_warps": 4}
    launching.launch(program, (1,), *args.values(), **options)
    if change == "misaligned":
        args["Y"] = base[1:9]  # 4 bytes past a 16-byte boundary
    elif change == "dtype":
        args["X"] = torch.zeros(8, dtype=torch.float16)
    elif change == "int":
        args["n"] = 16
    elif change == "float":
        args["scale"] = 0.25
    elif change == "constexpr":
        options["BLOCK"] = 32
    else:
        options["num_warps"] = 8
    launching.launch(program, (1,), *args.values(), **options)
    assert len(program.through_triton) == 2 and not program.kernel.direct


@pytest.mark.parametrize(("first", "then"), [(1.0, 1), (1, True), (0, False)])
def test_an_equal_value_of_another_type_takes_tritons_path(compiled_path, first, then) -> None:
    """1.0 == 1 == True as keys, but Triton compiles each type to another signature."""
    program = StandInProgram(StandInKernel())
    x = torch.zeros(8)
    for value in (first, then):
        launching.launch(program, (1,), x, x, value, 0.5, BLOCK=16)
    launching.launch(program, (1,), x, x, 8, 0.5, BLOCK=first)
    launching.launch(program, (1,), x, x, 8, 0.5, BLOCK=then)
    assert len(program.through_triton) == 4 and not program.kernel.direct


def test_hooks_take_tritons_path(compiled_path) -> None:
    program = StandInProgram(StandInKernel())
    x = torch.zeros(8)
    launching.launch(program, (1,), x, x, 8, 0.5, BLOCK=16)
    compiled_path.launch_enter_hook = SimpleNamespace(calls=[print])  # a chain with a hook
    launching.launch(program, (1,), x, x, 8, 0.5, BLOCK=16)
    compiled_path.launch_enter_hook = SimpleNamespace(calls=[])  # an empty chain
    program.pre_run_hooks.append(print)
    launching.launch(program, (1,), x, x, 8, 0.5, BLOCK=16)
    assert len(program.through_triton) == 3 and not program.kernel.direct


def test_a_kernel_without_the_launch_parts_always_takes_tritons_path(compiled_path) -> None:
    program = StandInProgram(SimpleNamespace(run=lambda *a: None))  # no function, no metadata
    x = torch.zeros(8)
    for _ in range(2):
        launching.launch(program, (1,), x, x, 8, 0.5, BLOCK=16)
    assert len(program.through_triton) == 2


def test_a_missing_parameter_is_never_launched_directly(compiled_path) -> None:
    program = StandInProgram(StandInKernel())
    x = torch.zeros(8)
    for _ in range(2):
        launching.launch(program, (1,), x, x, 8, 0.5)  # BLOCK not given: Triton says so
    assert len(program.through_triton) == 2 and not program.kernel.direct


def test_the_keys_of_a_program_are_bounded(compiled_path) -> None:
    program = StandInProgram(StandInKernel())
    x = torch.zeros(8)
    for n in range(launching.KEYS_PER_PROGRAM + 1):
        launching.launch(program, (1,), x, x, n, 0.5, BLOCK=16)
    assert len(launching._direct[program]) == 1


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRETING, reason="the direct path runs compiled programs only")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_direct_launches_compute_what_tritons_do_on_misaligned_views(dtype) -> None:
    from tileops_triton.fused import launch as fused

    base = torch.randn(2, 3 * 4096 + 8, device="cuda", dtype=dtype)
    for offset in (0, 1, 0, 3, 8, 1):  # aligned, misaligned, back: each key's kernel reused
        gate, up = base[:, offset : offset + 4096], base[:, offset + 4096 : offset + 8192]
        out = torch.empty(2, 4096, device="cuda", dtype=dtype)
        fused.glu("silu", gate, up, out)
        want = torch.nn.functional.silu(gate.double()) * up.double()
        assert rel_error(out, want) < TOLERANCE[dtype], offset
    from tileops_triton.fused import programs

    assert len(launching._direct[programs.glu_fwd]) >= 2  # the aligned and misaligned keys
