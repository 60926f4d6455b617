"""Launch: the executable's entry function when TileLang's wrapper would only count and pass
the buffers; TileLang's own call otherwise; looked up at the first launch, never at build."""

from __future__ import annotations

from types import SimpleNamespace

from tileops_cuda._common.compile import Launch, entry_function


def _kernel(result_idx: list[int], calls: list[str]) -> SimpleNamespace:
    def main(*buffers):
        calls.append(("entry", buffers))

    executable = SimpleNamespace(jit=lambda: SimpleNamespace(main=main))

    def get_executable():
        calls.append("loaded")
        return executable

    adapter = SimpleNamespace(result_idx=result_idx, _get_executable=get_executable)
    kernel = SimpleNamespace(adapter=adapter)
    return kernel


class _Called:
    """A kernel whose own call is recorded (no TVM-FFI adapter)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, *buffers):
        self.calls.append(buffers)


def test_a_kernel_given_every_buffer_launches_through_the_entry_function():
    calls: list = []
    launch = Launch(_kernel([], calls))
    assert calls == []  # nothing loaded while building
    launch(1, 2)
    launch(3)
    assert calls == ["loaded", ("entry", (1, 2)), ("entry", (3,))]


def test_a_kernel_that_allocates_outputs_keeps_tilelangs_call():
    kernel = _kernel([2], [])
    assert entry_function(kernel) is kernel


def test_a_kernel_of_another_backend_launches_through_its_own_call():
    kernel = _Called()
    Launch(kernel)(4, 5)
    assert kernel.calls == [(4, 5)]
