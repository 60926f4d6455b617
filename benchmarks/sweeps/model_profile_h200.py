"""Where a kernelized model's step spends its time, beside eager: the profile behind a ratio.

For each (model, work) of `benchmarks/suites/models_h200.py` asked, one step of eager and one
of kernelized run under `torch.profiler` (after three warm-up steps) and the GPU kernels are
summed by name: total GPU time, host time of the step, and the kernels whose time differs most
between the two, largest first. From the same traces: how long the GPU idled inside the step
and how much of that it starved (waited for the host's next launch); and from one more step
recorded with Python stacks, which functions were running while it starved.

    python benchmarks/sweeps/model_profile_h200.py --models resnet50,encoder --works train
        [--compiled] [--top 25] [--out DIR]

`--compiled` profiles `torch.compile` of eager against that of kernelized (without the host
profile).

Writes `<out>/model_profile_<device>.md`.
"""

from __future__ import annotations

import argparse
import collections
import functools
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "suites"))

import torch
from _harness import timeline
from _harness.provenance import result_path, results_dir, run_stamp
from _harness.timing import host_profile
from models_h200 import Work, contender, warm_up, works


def kernel_times(
    work: Work, kernelized: bool, trace: Path, compiled: bool = False
) -> tuple[dict[str, float], float, dict[str, float]]:
    """GPU microseconds by kernel name over one profiled step, the step's wall ms and its
    timeline summary (`timeline.starved_gaps`); then one more step with Python stacks,
    its trace left at `trace`. `compiled`: the model's forward through torch.compile."""
    model, _ = contender(work, kernelized, compiled=compiled)
    batch = work.batch(0)
    warm_up(work, model, "cuda")
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        start = time.perf_counter()
        work.step(model, batch)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) * 1e3
    prof.export_chrome_trace(str(trace))
    gaps = timeline.summary(trace)
    totals: dict[str, float] = collections.defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name[:90]] += event.device_time
    with torch.profiler.profile(activities=activities, with_stack=True) as prof:
        work.step(model, batch)
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace))
    del model
    torch.cuda.empty_cache()
    return totals, wall, gaps


def kernelized_host_profile(work: Work, top: int) -> str:
    """cProfile of one kernelized step (after warm-up): the host functions by own time."""
    model, _ = contender(work, True, compiled=False)
    batch = work.batch(0)
    warm_up(work, model, "cuda")
    found = host_profile(functools.partial(work.step, model, batch), 1, top)
    del model
    torch.cuda.empty_cache()
    return found


def report(work: Work, top: int, traces: Path, compiled: bool = False) -> list[str]:
    stem = f"{work.model}_{work.work}".replace(" ", "_") + ("_compiled" if compiled else "")
    eager_trace = traces / f"{stem}_eager.json"
    eager, eager_wall, eager_gaps = kernel_times(work, False, eager_trace, compiled)
    ours_trace = traces / f"{stem}_kernelized.json"
    ours, ours_wall, ours_gaps = kernel_times(work, True, ours_trace, compiled)
    lines = [
        f"## {work.model} {work.work}" + (" (both through torch.compile)" if compiled else ""),
        "",
        f"step wall ms (profiled): eager {eager_wall:.2f}, kernelized {ours_wall:.2f}; "
        f"GPU kernel ms: eager {sum(eager.values()) / 1e3:.2f}, "
        f"kernelized {sum(ours.values()) / 1e3:.2f}; kernels launched: eager "
        f"{len(eager)} names, kernelized {len(ours)} names",
        "",
        "GPU timeline of the profiled step, ms (starved: idle until the host's next launch):",
        "",
        "| | busy | idle | starved | span |",
        "|---|---|---|---|---|",
        *(
            f"| {name} | " + " | ".join(f"{g[k] / 1e3:.2f}" for k in timeline.SUMMARY) + " |"
            for name, g in (("eager", eager_gaps), ("kernelized", ours_gaps))
        ),
        "",
        "Python functions on a stack while the kernelized step's GPU starved (with stacks, "
        "which slow the host; inclusive ms):",
        "",
        *(f"- {ms / 1e3:.2f} `{name}`" for name, ms in timeline.functions(ours_trace, top)),
        "",
        "| kernel | eager us | kernelized us | difference |",
        "|---|---|---|---|",
    ]
    names = set(eager) | set(ours)
    ranked = sorted(names, key=lambda n: -abs(ours.get(n, 0.0) - eager.get(n, 0.0)))
    for name in ranked[:top]:
        a, b = eager.get(name, 0.0), ours.get(name, 0.0)
        lines.append(f"| `{name}` | {a:.0f} | {b:.0f} | {b - a:+.0f} |")
    if compiled:  # a compiled step's host functions are the graph's: its profile says little
        return [*lines, ""]
    lines += ["", "Host functions of one kernelized step (cProfile, by own time):", "", "```"]
    return [*lines, kernelized_host_profile(work, top), "```", ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet50,encoder,llama")
    parser.add_argument("--works", default="train")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", default=str(results_dir("models")))
    parser.add_argument("--traces", default=None, help="keep the chrome traces here")
    parser.add_argument(
        "--compiled", action="store_true", help="torch.compile of eager against of kernelized"
    )
    args = parser.parse_args()
    traces = Path(args.traces or tempfile.mkdtemp())
    traces.mkdir(parents=True, exist_ok=True)
    wanted = [w for w in args.works.split(",") if w]
    lines = ["# Model step profiles, eager against kernelized", ""]
    lines += ["  ".join(f"{k}: {v}" for k, v in run_stamp().items()), ""]
    path = result_path(args.out, "model_profile", torch.cuda.get_device_name(), ".md")
    for work in works("cuda", tiny=False):
        if work.model in args.models.split(",") and any(w in work.work for w in wanted):
            lines += report(work, args.top, traces, args.compiled)
            path.write_text("\n".join(lines) + "\n")  # each work as it ends
            print(f"{work.model} {work.work}: done", flush=True)


if __name__ == "__main__":
    main()
