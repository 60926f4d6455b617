"""The disk cache under one process per GPU: 8 processes build the same kernel at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

PROCESSES = 8
BUILD = """
import hashlib, json, time, torch
from tileops.testing import simulate_device
from tileops.ops import RMSNormCall
from tileops_cuda.rows.kernels import RMSNormBlockRow
call = RMSNormCall(device=torch.device("cuda:0"), n=5000, eps=1e-6, dtype=torch.bfloat16,
                   has_weight=True)
start = time.perf_counter()
with simulate_device("cuda:0", arch=90, sm_count=132, smem_budget=232448):
    kernel = RMSNormBlockRow.entry_for(call)[1]()
source = kernel.compiled.get_kernel_source()
print(json.dumps({"path": kernel.compiled._tilelang_cache_path,
                  "source": hashlib.sha256(source.encode()).hexdigest(),
                  "seconds": time.perf_counter() - start}))
"""


def _start(cache: str) -> subprocess.Popen:
    env = {**os.environ, "TILELANG_CACHE_DIR": cache}
    return subprocess.Popen(
        [sys.executable, "-c", BUILD],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


def test_eight_processes_build_one_kernel_into_a_fresh_cache(tmp_path):
    cache = str(tmp_path / "cache")
    results = [_result(p) for p in [_start(cache) for _ in range(PROCESSES)]]
    assert len({r["path"] for r in results}) == 1
    assert len({r["source"] for r in results}) == 1
    entry = results[0]["path"]
    assert {"manifest.json", "device_kernel.cu", "executable.so"} <= set(os.listdir(entry))
    # One complete entry, no staging or temporary files left behind.
    kernels = os.path.dirname(entry)
    assert os.listdir(kernels) == [os.path.basename(entry)]
    leftovers = [
        os.path.join(root, name)
        for root, _, names in os.walk(cache)
        for name in names
        if name.endswith(".tmp") or ".tmp." in name
    ]
    assert leftovers == []
    # A later process loads the entry instead of compiling it.
    start = time.perf_counter()
    again = _result(_start(cache))
    assert again["path"] == entry and again["source"] == results[0]["source"]
    assert again["seconds"] < max(r["seconds"] for r in results)
    assert time.perf_counter() - start < 120
