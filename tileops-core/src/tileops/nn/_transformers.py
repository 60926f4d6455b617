"""The built-in declarations: transformers' norm classes, by dotted path (nothing is imported).

Each family's forward was read in transformers 5.x and is checked against these declarations,
class by class, in tests/core/test_kernelize_models.py. Left out, because they compute something
else: T5LayerNorm (casts to the weight's dtype, not the input's), Gemma3nRMSNorm (its weight is
optional per instance), the gated norms (`RMSNormGated`: a second input).
"""

from __future__ import annotations

_MODELS = "transformers.models"

# weight * norm(x.float()).to(x.dtype)
LLAMA = {
    "kind": "rms_norm",
    "eps": "variance_epsilon",
    "weight": "weight",
    "order": "cast_then_scale",
}
LLAMA_FAMILY = {
    "llama": "LlamaRMSNorm",
    "mistral": "MistralRMSNorm",
    "mixtral": "MixtralRMSNorm",
    "ministral": "MinistralRMSNorm",
    "qwen2": "Qwen2RMSNorm",
    "qwen2_moe": "Qwen2MoeRMSNorm",
    "qwen2_5_vl": "Qwen2_5_VLRMSNorm",
    "qwen3": "Qwen3RMSNorm",
    "qwen3_moe": "Qwen3MoeRMSNorm",
    "qwen3_vl": "Qwen3VLTextRMSNorm",
    "phi3": "Phi3RMSNorm",
    "granite": "GraniteRMSNorm",
    "granitemoe": "GraniteMoeRMSNorm",
    "deepseek_v2": "DeepseekV2RMSNorm",
    "deepseek_v3": "DeepseekV3RMSNorm",
    "glm": "GlmRMSNorm",
    "glm4": "Glm4RMSNorm",
    "glm4_moe": "Glm4MoeRMSNorm",
    "smollm3": "SmolLM3RMSNorm",
    "olmoe": "OlmoeRMSNorm",
    "exaone4": "Exaone4RMSNorm",
    "ernie4_5": "Ernie4_5RMSNorm",
    "hunyuan_v1_dense": "HunYuanDenseV1RMSNorm",
    "jamba": "JambaRMSNorm",
    "bamba": "BambaRMSNorm",
    "arcee": "ArceeRMSNorm",
    "seed_oss": "SeedOssRMSNorm",
    "diffllama": "DiffLlamaRMSNorm",
    "minimax": "MiniMaxRMSNorm",
}

# (weight.float() * norm(x.float())).to(x.dtype)
OLMO2 = {**LLAMA, "order": "scale_then_cast"}
OLMO2_FAMILY = {
    "olmo2": "Olmo2RMSNorm",
    "olmo3": "Olmo3RMSNorm",
    "flex_olmo": "FlexOlmoRMSNorm",
    "gpt_oss": "GptOssRMSNorm",
    "nemotron_h": "NemotronHRMSNorm",
    "helium": "HeliumRMSNorm",
}

# (norm(x.float()) * (1.0 + weight.float())).type_as(x)
GEMMA = {**OLMO2, "eps": "eps", "weight_offset": 1.0}
GEMMA_FAMILY = {
    "gemma": "GemmaRMSNorm",
    "gemma2": "Gemma2RMSNorm",
    "gemma3": "Gemma3RMSNorm",
    "qwen3_next": "Qwen3NextRMSNorm",
    "qwen3_5": "Qwen3_5RMSNorm",
}

# (weight.float() * layer_norm(x.float())).to(x.dtype); Cohere's q/k norms (a 2-D weight
# broadcast over heads) are refused per instance.
COHERE = {**OLMO2, "kind": "layer_norm"}
# F.layer_norm(x.float(), eps=1e-5).to(x.dtype), no affine parameters.
OLMO = {"kind": "layer_norm", "eps": 1e-5}


FAMILIES = [
    (LLAMA, LLAMA_FAMILY),
    (OLMO2, OLMO2_FAMILY),
    (GEMMA, GEMMA_FAMILY),
    (COHERE, {"cohere": "CohereLayerNorm"}),
    (OLMO, {"olmo": "OlmoLayerNorm"}),
]

BUILTIN: dict[str, dict] = {
    f"{_MODELS}.{module}.modeling_{module}.{name}": declaration
    for declaration, family in FAMILIES
    for module, name in family.items()
}


# -- fused ops ---------------------------------------------------------------------------------
# Gated MLPs whose forward is `down_proj(act_fn(gate_proj(x)) * up_proj(x))`, and modeling
# modules whose `apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)` is Llama's (rotate_half,
# tables as given) or Phi-3's (the same over the tables' width, the rest of head_dim passed
# through): read in transformers 5.x and checked against Llama's and Phi-3's source, entry by
# entry, in tests/core/test_kernelize_fused.py.
GATED_MLP_FAMILY = {
    "llama": "LlamaMLP",
    "mistral": "MistralMLP",
    "ministral": "MinistralMLP",
    "qwen2": "Qwen2MLP",
    "qwen2_moe": "Qwen2MoeMLP",
    "qwen3": "Qwen3MLP",
    "qwen3_moe": "Qwen3MoeMLP",
    "gemma": "GemmaMLP",
    "gemma2": "Gemma2MLP",
    "gemma3": "Gemma3MLP",
    "granite": "GraniteMLP",
    "olmo": "OlmoMLP",
    "olmo2": "Olmo2MLP",
    "olmo3": "Olmo3MLP",
    "olmoe": "OlmoeMLP",
    "cohere": "CohereMLP",
    "deepseek_v3": "DeepseekV3MLP",
    "smollm3": "SmolLM3MLP",
    "exaone4": "Exaone4MLP",
    "helium": "HeliumMLP",
    "glm4_moe": "Glm4MoeMLP",
    "ernie4_5": "Ernie4_5MLP",
    "hunyuan_v1_dense": "HunYuanDenseV1MLP",
}
ROTARY_FAMILY = (
    "llama",
    "mistral",
    "ministral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "gemma",
    "gemma2",
    "gemma3",
    "granite",
    "granitemoe",
    "olmoe",
    "smollm3",
    "exaone4",
    "hunyuan_v1_dense",
    "minimax",
    "diffllama",
    "seed_oss",
    "deepseek_v3",
)

GATED_MLPS = frozenset(
    f"{_MODELS}.{module}.modeling_{module}.{name}" for module, name in GATED_MLP_FAMILY.items()
)
PARTIAL_ROTARY_FAMILY = ("phi3", "phi4_multimodal")

ROTARY_FUNCTIONS: dict[str, bool] = {
    f"{_MODELS}.{module}.modeling_{module}.apply_rotary_pos_emb": partial
    for modules, partial in ((ROTARY_FAMILY, False), (PARTIAL_ROTARY_FAMILY, True))
    for module in modules
}
"""Each declared `apply_rotary_pos_emb` by dotted path: whether it rotates tables narrower than
head_dim (partial rotary) rather than failing on them."""
