"""A kernelized model under DDP and FSDP2: two ranks (processes) on the CPU with gloo over the
loopback train to the same losses as the eager model under the same engine; on a GPU machine,
one process per GPU with NCCL, both building kernels into one fresh compile cache at once."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("distributed_worker.py")
RANKS = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(engine: str, device: str = "cpu", **env: str) -> list[dict]:
    port = str(_free_port())
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    ranks = [
        subprocess.Popen(
            [sys.executable, str(WORKER), engine, device, str(rank), str(RANKS), port],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(RANKS)
    ]
    results = []
    try:
        for process in ranks:
            out, err = process.communicate(timeout=300)
            assert process.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
    return results


def _check(results: list[dict], **tolerance: float) -> None:
    for result in results:
        assert result["swapped"] == 7  # 3 Linear, LayerNorm, BatchNorm1d, RMSNorm, Softmax
        assert result["kernelized"] == pytest.approx(result["eager"], **tolerance)
    assert results[0] == results[1]  # the ranks agree: one all-reduced trajectory
    losses = results[0]["eager"]
    assert losses[-1] < losses[0]  # it trains


@pytest.mark.parametrize("engine", ["ddp", "fsdp2"])
def test_a_kernelized_model_trains_to_the_eager_losses(engine):
    _check(_run(engine), rel=1e-4, abs=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["ddp", "fsdp2"])
def test_one_process_per_gpu_trains_to_the_eager_losses_with_one_fresh_cache(engine, tmp_path):
    import torch

    if torch.cuda.device_count() < RANKS:
        pytest.skip(f"needs {RANKS} GPUs")
    cache = tmp_path / "tilelang-cache"  # both ranks compile the same kernels into it at once
    _check(_run(engine, "cuda", TILELANG_CACHE_DIR=str(cache)), rel=1e-3, abs=1e-4)
    assert any(cache.rglob("executable.so")), "no TileLang kernel was built into the cache"
