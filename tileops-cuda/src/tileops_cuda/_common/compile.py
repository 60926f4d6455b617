"""Compiling TileLang programs, shared by every kernel family, and the disk cache.

tilelang is imported here, inside the functions, never at module import: `import tileops_cuda`
stays cheap and works where tilelang's native libraries cannot load. Compiled kernels land in
TileLang's own disk cache (`TILELANG_CACHE_DIR`, default `~/.tilelang/cache`), which publishes
each entry by an atomic directory rename, so a second process loads instead of compiling.

Processes that build the same kernel at once (one process per GPU) take an exclusive file lock
per kernel in `<cache dir>/tileops-locks/`: the first compiles and publishes, the others wait
and then load the published entry. The lock files are empty and may be deleted at any time.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Callable
from typing import Any

LOCK_DIR = "tileops-locks"


def cuda_target(arch: int, features: str = "") -> dict[str, str]:
    """TileLang's target for compute capability `arch` (80 -> sm_80); it refuses strings.

    `features` "a" names the architecture-specific target (sm_90a): wgmma and register
    reconfiguration exist only there, and code built for it runs on that architecture only.
    """
    return {"kind": "cuda", "arch": f"sm_{arch}{features}"}


def cache_dir() -> str:
    """Where TileLang caches compiled kernels in this process."""
    from tilelang.env import env

    return os.path.expanduser(env.TILELANG_CACHE_DIR)


def build_program(
    name: str,
    program: Callable[[], Any],
    arch: int,
    *,
    features: str = "",
    pass_configs: dict[str, Any] | None = None,
) -> Any:
    """Compile `program()` (a TileLang prim_func factory) for sm_`arch``features`, once across
    processes, with TileLang `pass_configs` (None: TileLang's defaults).

    `name` identifies the kernel (family and build identity); it names the lock only, the cache
    key is TileLang's own (the program text, target, pass configs and compiler versions).
    """
    import tilelang

    lock_dir = os.path.join(cache_dir(), LOCK_DIR)
    os.makedirs(lock_dir, exist_ok=True)
    target = cuda_target(arch, features)
    digest = hashlib.sha256(f"{name}/{target['arch']}/{pass_configs}".encode()).hexdigest()[:24]
    with open(os.path.join(lock_dir, f"{digest}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return tilelang.compile(program(), target=target, pass_configs=pass_configs)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class Launch:
    """Launches one compiled program on every buffer it takes, at the least host cost.

    TileLang's call wraps the executable's entry function in Python that counts the arguments
    and allocates the outputs it is not given; our kernels pass every buffer, so at decode sizes
    that wrapper is host time for nothing (rows/TUNING.md#launch). The entry function is
    looked up at the first launch, which loads the module onto the GPU: building, which CPU
    machines do, never loads it. A program TileLang built otherwise launches through its own
    call. `entry` is that function once looked up: a plain call, no Python frame of ours.
    """

    __slots__ = ("kernel", "entry")

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.entry: Callable[..., Any] = self._first  # hot callers call `launch.entry(...)`

    def _first(self, *buffers: Any) -> Any:
        self.entry = entry_function(self.kernel)
        return self.entry(*buffers)

    def __call__(self, *buffers: Any) -> Any:
        return self.entry(*buffers)


def entry_function(kernel: Any) -> Callable[..., Any]:
    """The executable's entry function of a TVM-FFI kernel that allocates no output itself;
    else the kernel's own call. A kernel compiled in this process holds an executable to JIT;
    one loaded from TileLang's disk cache (every process after the first) holds the loaded
    module, whose `main` it is."""
    adapter = getattr(kernel, "adapter", None)
    try:
        if adapter.result_idx:
            return kernel
        executable = adapter._get_executable()
        module = executable.jit() if hasattr(executable, "jit") else executable
        return module.main
    except AttributeError:  # another execution backend, or another TileLang version
        return kernel
