"""Real models, eager against kernelized: what a user of `tileops.nn.kernelize` pays end to end.

Models nobody here wrote, built from configs with random weights (no downloads):

- `llama`: transformers' Llama architecture, d=4096, 4 layers, GQA 32/8, vocab 128,256,
  bfloat16; a training step on 2 x 1024 tokens (forward, loss, backward, SGD), prefill of
  4 x 2048 tokens, and cached greedy decode of 256 + 32 tokens at batch 1 and 32;
- `resnet50`: torchvision's ResNet-50, batch 128 at 224 x 224 under bfloat16 autocast, NCHW
  and channels_last: a training step (SGD) and eval;
- `encoder`: `torch.nn.TransformerEncoderLayer` d=1024, 16 heads, 8 x 512 tokens, bfloat16:
  a training step and inference.

Each work is timed for two contenders, each on a fresh model from the same seed (built on the
device, in its dtype): eager and kernelized (a causal LM in training also through
`kernelize_loss`, its loss without the logits); works named in `--compile-works` (default: the
prefill) also for `torch.compile` of eager and of kernelized; with `--attention`, Llama also
with its attention alone through tileops (`attn_implementation="tileops"`, against the SDPA
default that eager runs). The contenders are built side by side, each warmed up alone with
its peak memory (its weights included), then timed in turns, one step each per round: a
host-bound step (decode) follows the host's speed, which drifts during a run. Training works
also run 20 steps of eager and of kernelized on the same batches and report the largest loss
difference against the bfloat16 tolerance.

    python benchmarks/suites/models_h200.py [--models llama,resnet50,encoder]
        [--works train,prefill,decode,eval] [--compile-works prefill] [--attention]
        [--steps 20] [--tiny] [--out DIR]

`--tiny` shrinks every model so the script runs on a CPU in a minute (a smoke run; its figures
mean nothing). Writes `<out>/models_<device>.{md,json}` stamped with date, device and commit,
and `.png`, the ratios as bars (with matplotlib). `--replot A.json B.json ...` draws the table
and plot of saved runs together: `<out>/models_plot_<device>.{md,png}`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
import torch.nn.functional as F
from _harness.provenance import result_path, results_dir, run_stamp

import tileops.nn

BF16_LOSS_RTOL = 2e-2  # loss curves of two bf16 models agree to about 2% over 20 SGD steps


@dataclass
class Work:
    """One model at one kind of work: how to build it and how to run one timed step."""

    model: str
    work: str
    build: Callable[[], torch.nn.Module]
    batch: Callable[[int], Any]
    step: Callable[[torch.nn.Module, Any], torch.Tensor | None]
    training: bool


# ---- models ---------------------------------------------------------------------------------


def _llama_config(tiny: bool) -> Any:
    from transformers import LlamaConfig

    if tiny:
        return LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=512,
        )  # fmt: skip
    return LlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=4, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
    )  # fmt: skip


def _llama(device: str, tiny: bool) -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    with torch.device(device), _default_dtype(torch.bfloat16):
        model = LlamaForCausalLM(_llama_config(tiny))
    model.generation_config.eos_token_id = None  # random weights: decode every token asked
    model.generation_config.pad_token_id = 0
    return model


def _tokens(device: str, vocab: int, batch: int, seq: int) -> Callable[[int], Any]:
    def make(seed: int) -> torch.Tensor:
        generator = torch.Generator(device="cpu").manual_seed(seed)
        return torch.randint(0, vocab, (batch, seq), generator=generator).to(device)

    return make


def _lm_train(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    _sgd(model)
    return loss.detach()


def _lm_prefill(model: torch.nn.Module, ids: torch.Tensor) -> None:
    with torch.inference_mode():
        model(input_ids=ids, use_cache=False, logits_to_keep=1)


def _lm_decode(new_tokens: int) -> Callable[[torch.nn.Module, torch.Tensor], None]:
    def decode(model: torch.nn.Module, ids: torch.Tensor) -> None:
        with torch.inference_mode():
            out = model.generate(
                ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False
            )
        assert out.shape[1] == ids.shape[1] + new_tokens

    return decode


def _resnet50(device: str, tiny: bool, channels_last: bool) -> torch.nn.Module:
    import torchvision

    with torch.device(device):
        model = torchvision.models.resnet18() if tiny else torchvision.models.resnet50()
    return model.to(memory_format=torch.channels_last) if channels_last else model


def _images(device: str, batch: int, size: int, channels_last: bool) -> Callable[[int], Any]:
    def make(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator(device="cpu").manual_seed(seed)
        x = torch.randn(batch, 3, size, size, generator=generator).to(device)
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        return x, torch.randint(0, 1000, (batch,), generator=generator).to(device)

    return make


def _autocast(device: str) -> Any:
    return torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16)


def _image_train(device: str) -> Callable[[torch.nn.Module, Any], torch.Tensor]:
    def step(model: torch.nn.Module, batch: Any) -> torch.Tensor:
        x, labels = batch
        with _autocast(device):
            loss = F.cross_entropy(model(x), labels)
        loss.backward()
        _sgd(model)
        return loss.detach()

    return step


def _image_eval(device: str) -> Callable[[torch.nn.Module, Any], None]:
    def step(model: torch.nn.Module, batch: Any) -> None:
        with torch.inference_mode(), _autocast(device):
            model(batch[0])

    return step


def _encoder(device: str, tiny: bool) -> torch.nn.Module:
    width, heads = (64, 4) if tiny else (1024, 16)
    with torch.device(device), _default_dtype(torch.bfloat16):
        return torch.nn.TransformerEncoderLayer(
            width, heads, dim_feedforward=4 * width, dropout=0.0, batch_first=True
        )


def _hidden(device: str, batch: int, seq: int, width: int) -> Callable[[int], Any]:
    def make(seed: int) -> torch.Tensor:
        generator = torch.Generator(device="cpu").manual_seed(seed)
        return torch.randn(batch, seq, width, generator=generator).to(device, torch.bfloat16)

    return make


def _encoder_train(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    loss = model(x).float().square().mean()
    loss.backward()
    _sgd(model)
    return loss.detach()


def _encoder_infer(model: torch.nn.Module, x: torch.Tensor) -> None:
    with torch.inference_mode():
        model(x)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Build in `dtype` directly: a 2-billion-parameter float32 build would cost more than
    the measurements."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _sgd(model: torch.nn.Module, lr: float = 1e-3) -> None:
    """Plain SGD without state, in place: the optimizer costs the same for every contender."""
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)
                p.grad = None


def works(device: str, tiny: bool) -> list[Work]:
    """Every (model, work) this suite knows, at the issue's sizes (or tiny ones)."""
    vocab = _llama_config(tiny).vocab_size
    s = (lambda full, small: small) if tiny else (lambda full, small: full)
    found = [
        Work("llama", "train 2x1024", lambda: _llama(device, tiny),
             _tokens(device, vocab, 2, s(1024, 32)), _lm_train, True),
        Work("llama", "prefill 4x2048", lambda: _llama(device, tiny),
             _tokens(device, vocab, 4, s(2048, 32)), _lm_prefill, False),
    ]  # fmt: skip
    for batch in (1, 32):
        found.append(
            Work("llama", f"decode b{batch} 256+32", lambda: _llama(device, tiny),
                 _tokens(device, vocab, batch, s(256, 8)), _lm_decode(s(32, 4)), False)
        )  # fmt: skip
    for cl in (False, True):
        layout = "channels_last" if cl else "NCHW"
        images = _images(device, s(128, 4), s(224, 32), cl)
        build = functools.partial(_resnet50, device, tiny, cl)
        found.append(Work("resnet50", f"train {layout}", build, images, _image_train(device), True))
        found.append(Work("resnet50", f"eval {layout}", build, images, _image_eval(device), False))
    hidden = _hidden(device, s(8, 2), s(512, 16), s(1024, 64))
    found.append(Work("encoder", "train", lambda: _encoder(device, tiny), hidden,
                      _encoder_train, True))  # fmt: skip
    found.append(Work("encoder", "inference", lambda: _encoder(device, tiny), hidden,
                      _encoder_infer, False))  # fmt: skip
    return found


# ---- contenders and timing ------------------------------------------------------------------


def contender(
    work: Work, kernelized: bool, compiled: bool, attention: bool = False
) -> tuple[torch.nn.Module, str]:
    """A fresh model for `work` from the same seed, kernelized and compiled as asked, and the
    kernelize report's first line (what was swapped). `attention`: the transformers model's
    attention alone set to `attn_implementation="tileops"`, nothing else swapped."""
    torch.manual_seed(0)
    model = work.build()
    model.train(work.training)
    report = ""
    if attention:
        model.set_attn_implementation(tileops.nn.register_transformers_attention())
    if kernelized:
        report = str(tileops.nn.kernelize(model)).splitlines()[0]
        if work.training and hasattr(model, "lm_head"):  # the causal-LM loss without logits
            report += "; " + str(tileops.nn.kernelize_loss(model)).splitlines()[0]
    if compiled:
        model.forward = torch.compile(model.forward)
    return model, report


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def warm_up(work: Work, model: torch.nn.Module, device: str) -> None:
    """Three steps: compilation, selection, the allocator's first blocks."""
    batch = work.batch(0)
    for _ in range(3):
        work.step(model, batch)
    _sync(device)


def time_in_turns(
    work: Work, models: dict[str, torch.nn.Module], device: str, steps: int
) -> dict[str, float | str]:
    """Median milliseconds of one step per model, the models taking turns step by step, so a
    drift in the host's or the GPU's speed during the run hits every contender alike (a
    host-bound decode step follows the host's speed). A model whose step fails gets its error."""
    batch = work.batch(0)
    times: dict[str, list[float]] = {name: [] for name in models}
    failed: dict[str, str] = {}
    for _ in range(steps):
        for name, model in models.items():
            if name in failed:
                continue
            try:
                start = time.perf_counter()
                work.step(model, batch)
                _sync(device)
                times[name].append((time.perf_counter() - start) * 1e3)
            except Exception as error:
                failed[name] = _failure(error)
    return {name: failed.get(name) or statistics.median(times[name]) for name in models}


def _failure(error: Exception) -> str:
    return f"fails: {type(error).__name__}: {str(error)[:160]}"


def losses(work: Work, kernelized: bool, steps: int) -> list[float]:
    """The training losses of `steps` steps on batches 0..steps-1, from the shared seed."""
    model, _ = contender(work, kernelized, compiled=False)
    found = [float(work.step(model, work.batch(seed))) for seed in range(steps)]
    del model
    return found


def built(
    work: Work, device: str, variants: list[tuple[str, bool, bool, bool]], row: dict[str, Any]
) -> dict[str, torch.nn.Module]:
    """Each variant's model, built side by side and warmed up, its peak memory (beyond the
    models built before it) and kernelize's report written into `row`, or why it failed."""
    models: dict[str, torch.nn.Module] = {}
    for name, kernelized, compiled, attend in variants:
        before = _allocated_gib(device)
        try:
            model, report = contender(work, kernelized, compiled, attend)
            warm_up(work, model, device)
            peak = _peak_gib(device)
            row[f"{name} GiB"] = None if peak is None else peak - before
            models[name] = model
            if report:
                row["kernelize"] = report
        except Exception as error:  # a failure is a figure too: report it, go on
            row[f"{name} ms"] = _failure(error)
    return models


def measure(
    work: Work, device: str, steps: int, compile_too: bool, attention: bool
) -> dict[str, Any]:
    """Every contender's median step time and peak memory, and the loss check."""
    row: dict[str, Any] = {"model": work.model, "work": work.work}
    variants = [("eager", False, False, False), ("kernelized", True, False, False)]
    if compile_too:
        variants += [("compiled", False, True, False), ("compiled+kernelized", True, True, False)]
    if attention and work.model == "llama":
        variants.append(("tileops attention", False, False, True))
    _release(device)
    models = built(work, device, variants, row)
    for name, ms in time_in_turns(work, models, device, steps).items():
        row[f"{name} ms"] = ms
    del models
    if work.training:
        _release(device)
        try:
            eager, ours = losses(work, False, 20), losses(work, True, 20)
            worst = max(abs(a - b) / max(abs(a), 1e-6) for a, b in zip(eager, ours, strict=True))
            row["loss max rel diff"] = worst
            row["losses agree"] = worst <= BF16_LOSS_RTOL
        except Exception as error:
            row["losses agree"] = _failure(error)
    return row


def _release(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        torch._dynamo.reset()


def _allocated_gib(device: str) -> float | None:
    """GiB allocated now, the peak statistic reset to it."""
    if not device.startswith("cuda"):
        return None
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated() / 2**30


def _peak_gib(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None


# ---- report ---------------------------------------------------------------------------------


# (baseline, contender) pairs: baseline ms / contender ms, above 1 when the contender is faster
RATIOS = (("eager", "kernelized"), ("compiled", "compiled+kernelized"),
          ("eager", "tileops attention"))  # fmt: skip


def _speedup(row: dict[str, Any], base: str, ours: str) -> float | None:
    a, b = row.get(f"{base} ms"), row.get(f"{ours} ms")
    return a / b if isinstance(a, float) and isinstance(b, float) else None


def _ratio(row: dict[str, Any], base: str, ours: str) -> str:
    found = _speedup(row, base, ours)
    return "—" if found is None else f"{found:.2f}"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return "—" if value is None else str(value)


def table(rows: list[dict[str, Any]], stamp: dict[str, Any]) -> list[str]:
    """The rows as markdown: times, ratios (eager / kernelized: above 1 means we are faster),
    peak memory and the loss check."""
    lines = [f"# Models, eager against kernelized ({stamp['device']})", "",
             "  ".join(f"{k}: {v}" for k, v in stamp.items()), "",
             "| model | work | eager ms | kernelized ms | ratio | compiled ms | compiled+k ms | "
             "ratio | tileops attention ms | ratio | eager GiB | kernelized GiB | "
             "losses agree (max rel diff) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in rows:
        agree = row.get("losses agree", "—")
        if "loss max rel diff" in row:
            agree = f"{agree} ({row['loss max rel diff']:.4f})"
        cells, shown = [row["model"], row["work"]], set()
        for base, ours in RATIOS:  # each contender's ms (its baseline's once), then the ratio
            cells += [_cell(row.get(f"{n} ms")) for n in (base, ours) if n not in shown]
            cells.append(_ratio(row, base, ours))
            shown |= {base, ours}
        cells += [_cell(row.get("eager GiB")), _cell(row.get("kernelized GiB")), str(agree)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "What kernelize swapped:", ""]
    lines += sorted({f"- {r['model']}: {r['kernelize']}" for r in rows if r.get("kernelize")})
    return lines


def plot(rows: list[dict[str, Any]], stamp: dict[str, Any], path: Path) -> None:
    """The table's ratios as grouped bars per (model, work), a line at 1.0 (as fast as the
    baseline); a work not timed for a pair, or failed, has no bar there."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['model']}\n{r['work']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(rows)), 4.5))
    width = 0.8 / len(RATIOS)
    for k, (base, ours) in enumerate(RATIOS):
        found = [(i, _speedup(r, base, ours)) for i, r in enumerate(rows)]
        found = [(i + (k - (len(RATIOS) - 1) / 2) * width, v) for i, v in found if v is not None]
        if found:
            ax.bar(*zip(*found, strict=True), width, label=f"{ours} / {base}")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("speed-up (baseline ms / contender ms)")
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title("  ".join(f"{k}: {v}" for k, v in stamp.items()), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def replot(files: list[str], out: str) -> None:
    """The table and plot of saved results (`models_*.json`, their rows in the order given):
    `<out>/models_plot_<device>.{md,png}`, stamped by the first file."""
    saved = [json.loads(Path(f).read_text()) for f in files]
    stamp, rows = saved[0]["stamp"], [row for one in saved for row in one["rows"]]
    stamp = {**stamp, "commit": ",".join(dict.fromkeys(one["stamp"]["commit"] for one in saved))}
    result_path(out, "models_plot", stamp["device"], ".md").write_text(
        "\n".join(table(rows, stamp)) + "\n"
    )
    plot(rows, stamp, result_path(out, "models_plot", stamp["device"], ".png"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="llama,resnet50,encoder")
    parser.add_argument("--works", default="", help="substrings of work names (default: all)")
    parser.add_argument(
        "--compile-works", default="prefill", help="substrings of works also timed compiled"
    )
    parser.add_argument(
        "--attention", action="store_true",
        help='also time llama with attn_implementation="tileops" alone (the SDPA default beside)',
    )  # fmt: skip
    parser.add_argument("--steps", type=int, default=20, help="timed steps per contender")
    parser.add_argument("--tiny", action="store_true", help="small models: a CPU smoke run")
    parser.add_argument("--out", default=str(results_dir("models")))
    parser.add_argument(
        "--replot", nargs="+", metavar="JSON", help="only draw the table and plot of saved results"
    )
    args = parser.parse_args()
    if args.replot:
        replot(args.replot, args.out)
        return
    device = "cuda" if torch.cuda.is_available() else "cpu"
    wanted_works = [w for w in args.works.split(",") if w]
    rows = []
    for work in works(device, args.tiny):
        if work.model not in args.models.split(","):
            continue
        if wanted_works and not any(w in work.work for w in wanted_works):
            continue
        compile_too = any(w and w in work.work for w in args.compile_works.split(","))
        rows.append(measure(work, device, args.steps, compile_too, args.attention))
        print(json.dumps(rows[-1], default=str), flush=True)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    stamp = run_stamp() if device == "cuda" else {"device": "cpu"}
    prefix = "models_tiny" if args.tiny else "models"
    result_path(args.out, prefix, name, ".json").write_text(
        json.dumps({"stamp": stamp, "rows": rows}, indent=1, default=str)
    )
    text = table(rows, stamp)
    result_path(args.out, prefix, name, ".md").write_text("\n".join(text) + "\n")
    print("\n".join(text))
    try:
        plot(rows, stamp, result_path(args.out, prefix, name, ".png"))
    except ImportError:
        print("matplotlib is not installed: no plot (draw it later with --replot)")


if __name__ == "__main__":
    main()
