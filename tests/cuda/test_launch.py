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
    launch.entry(1, 2)  # the first call through `entry` looks it up
    launch(3)
    launch.entry(4)
    assert calls == ["loaded", ("entry", (1, 2)), ("entry", (3,)), ("entry", (4,))]


def test_a_kernel_that_allocates_outputs_keeps_tilelangs_call():
    kernel = _kernel([2], [])
    assert entry_function(kernel) is kernel


def test_a_kernel_of_another_backend_launches_through_its_own_call():
    kernel = _Called()
    Launch(kernel)(4, 5)
    assert kernel.calls == [(4, 5)]


def test_a_kernel_from_the_disk_cache_launches_through_its_modules_entry(tilelang_cache):
    """A process that loads a kernel TileLang cached on disk (every process after the first)
    gets the loaded module, not an executable to JIT: its `main` is the entry function."""
    import torch
    from tilelang.cache import _dispatch_map

    from tileops.ops import AttentionCall
    from tileops_cuda._common.compile import build_program
    from tileops_cuda.attention.decode_program import combine_program
    from tileops_cuda.attention.plans import DecodePlan

    call = AttentionCall(
        device=torch.device("cuda:0"), batch=1, heads=4, kv_heads=1, q_len=1, kv_len=64,
        head_dim=64, v_dim=64, causal=False, scale=0.125, dtype=torch.bfloat16,
    )  # fmt: skip
    plan = DecodePlan(rows=4, block_h=16, block_n=64, splits=3, stages=1, threads=128)
    name = "test/launch/from-disk"
    build_program(name, lambda: combine_program(call, plan), 80)
    _dispatch_map[
        "tvm_ffi"
    ]._memory_cache.clear()  # the next build loads from disk, as a new process
    loaded = build_program(name, lambda: combine_program(call, plan), 80)
    entry = entry_function(loaded)
    assert entry is not loaded
    assert entry.same_as(loaded.adapter._get_executable().main)
