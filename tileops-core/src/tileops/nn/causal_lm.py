"""`kernelize_loss`: transformers causal-LM models compute their training loss through the
fused linear + cross-entropy op, never building the (tokens, vocab) logits.

A causal LM is recognised by structure, not by name: a module with a `.model` (the decoder,
returning `last_hidden_state`), an `nn.Linear` `.lm_head`, and a `loss_function` that is
transformers' own `ForCausalLMLoss`. Its class is swapped in place (as `kernelize` swaps
modules: parameters, hooks and references stay) for a generated subclass whose forward, in
training mode with labels, runs `.model` with the caller's arguments, keeps the last
`logits_to_keep` positions, and hands the hidden states and `lm_head`'s weight and bias to
`linear_cross_entropy` with the labels shifted as `ForCausalLMLoss` shifts them (or the
caller's `shift_labels`), its `ignore_index`, and `num_items_in_batch` as the mean's divisor.
The output then has `logits=None`. Without labels, or in eval mode, the original forward runs.

Skipped, with the reason: models that post-process the logits (soft-capping, logit scales),
whose forward takes arguments that change the loss (MoE router losses), with a custom
`loss_function`, or whose lm_head is not a plain linear layer.
"""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

from ..errors import ArgumentError
from .kernelize import KernelizeReport, Skipped, Swapped
from .loss import linear_cross_entropy

LOGIT_CONFIG = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier")
"""Config attributes of models whose forward transforms the logits before the loss."""

KNOWN_ARGUMENTS = frozenset(
    {
        "input_ids", "attention_mask", "position_ids", "past_key_values", "cache",
        "inputs_embeds", "labels", "use_cache", "logits_to_keep", "cache_position",
        "output_attentions", "output_hidden_states", "return_dict", "kwargs", "self",
    }
)  # fmt: skip
"""The arguments of transformers' generic causal-LM forward; any other may change the loss."""

FUSED = "causal-LM loss through LinearCrossEntropyGradOp"
_SUBCLASSES: dict[type, type] = {}


def kernelize_loss(model: nn.Module, *, chunk_rows: int | None = None) -> KernelizeReport:
    """Make every causal LM in `model` (itself included) compute its training loss through
    the fused op; returns what was swapped and what was skipped, and why."""
    if not isinstance(model, nn.Module):
        raise ArgumentError(f"kernelize_loss: expected an nn.Module, got {type(model).__name__}")
    report = KernelizeReport()
    for name, module in model.named_modules():
        if not _looks_causal(module):
            continue
        label = name or type(module).__name__
        if getattr(type(module), "_tileops_fused_loss", False):
            continue  # swapped before
        reason = _refusal(module)
        if reason is not None:
            report.skipped.append(Skipped(label, type(module), reason))
            continue
        source = type(module)
        module.__class__ = _subclass(source)
        module._tileops_chunk_rows = chunk_rows
        report.swapped.append(Swapped(label, source, module.__class__, FUSED))
    return report


def _looks_causal(module: nn.Module) -> bool:
    return (
        isinstance(getattr(module, "model", None), nn.Module)
        and hasattr(module, "lm_head")
        and hasattr(type(module), "loss_function")
    )


def _refusal(module: nn.Module) -> str | None:
    from transformers.loss.loss_utils import ForCausalLMLoss

    head = module.lm_head
    if not isinstance(head, nn.Linear):
        return f"lm_head is a {type(head).__name__}, not an nn.Linear"
    if module.loss_function is not ForCausalLMLoss:
        found = getattr(module.loss_function, "__name__", module.loss_function)
        return f"its loss_function is {found}, not transformers' ForCausalLMLoss"
    config = getattr(module, "config", None)
    for attr in LOGIT_CONFIG:
        value = getattr(config, attr, None)
        if value not in (None, 1, 1.0):
            return f"its config sets {attr}={value!r}: the forward transforms the logits"
    if "forward" in vars(module):
        return "its forward was replaced on the instance"
    extra = sorted(set(inspect.signature(type(module).forward).parameters) - KNOWN_ARGUMENTS)
    if extra:
        return f"its forward takes {', '.join(map(repr, extra))}, which may change the loss"
    return None


def _subclass(source: type) -> type:
    found = _SUBCLASSES.get(source)
    if found is None:
        original = source.forward
        positional = [
            p.name
            for p in list(inspect.signature(original).parameters.values())[1:]
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]

        def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            arguments = dict(zip(positional, args, strict=False))
            arguments.update(kwargs)
            if not self.training or arguments.get("labels") is None:
                return original(self, *args, **kwargs)
            return _fused_forward(self, arguments)

        found = _SUBCLASSES[source] = type(
            source.__name__, (source,), {"forward": forward, "_tileops_fused_loss": True}
        )
        found.__module__ = __name__  # shown as tileops.nn.causal_lm.<the model's class>
    return found


def _fused_forward(module: nn.Module, arguments: dict[str, Any]) -> Any:
    from transformers.modeling_outputs import CausalLMOutputWithPast

    labels = arguments.pop("labels")
    keep = arguments.pop("logits_to_keep", 0)
    return_dict = arguments.pop("return_dict", None)  # the causal LM's to honour, as its own
    outputs = module.model(**arguments)
    hidden = outputs[0]
    hidden = hidden[:, slice(-keep, None) if isinstance(keep, int) else keep, :]
    ignore_index = arguments.get("ignore_index", -100)
    shifted = arguments.get("shift_labels")
    if shifted is None:
        padded = nn.functional.pad(labels, (0, 1), value=ignore_index)
        shifted = padded[..., 1:]
    head = module.lm_head
    loss = linear_cross_entropy(
        hidden, head.weight, shifted.to(hidden.device), head.bias, ignore_index=ignore_index,
        normalizer=arguments.get("num_items_in_batch"), chunk_rows=module._tileops_chunk_rows,
    )  # fmt: skip
    if isinstance(outputs, tuple):  # a config with return_dict=False
        return (loss, *outputs[1:])
    fields = set(CausalLMOutputWithPast.__dataclass_fields__)
    rest = {k: v for k, v in outputs.items() if k in fields and k != "logits"}
    result = CausalLMOutputWithPast(loss=loss, logits=None, **rest)
    return result.to_tuple() if return_dict is False else result
