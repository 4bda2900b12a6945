"""Model architecture: a ``ModelSpec`` built from a Hugging Face ``config.json``.

This is the one place that knows architectures. ``FAMILIES`` reads like a table: for each
supported ``model_type``, the config defaults that transformers' config class would fill in, and
the structural facts (norms per layer, fused projections, bias rules) of its modeling code.

Parameter counts are derived from the module structure transformers builds (checked exactly,
category by category, against ``AutoModelForCausalLM.from_config`` on the meta device for every
bundled model, see ``tests/test_model_params.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any

from .errors import ConfigError

__all__ = [
    "FAMILIES",
    "AttentionSpec",
    "GatedDeltaNetSpec",
    "ShortConvSpec",
    "MlpSpec",
    "MoeSpec",
    "LayerGroup",
    "LinearSpec",
    "ParamCounts",
    "ModelSpec",
    "model_from_config",
    "nope_layer_count",
    "nope_layer_indices",
    "layer_group_order",
    "layer_linears",
]

CATEGORIES = ("embedding", "attention", "mlp", "experts", "router", "norms", "lm_head")


# --------------------------------------------------------------------------------------------
# The family table. Defaults are those of transformers' config classes (5.x); a test compares
# them with the installed transformers so that drift is caught.
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Family:
    model_type: str
    defaults: Mapping[str, Any]
    norms_per_layer: int = 2  # hidden-size norms inside each decoder layer
    qk_norm: bool = False  # per-head RMSNorm on q and k (head_dim weights each)
    qk_norm_key: str | None = None  # config key that turns the q/k norms on (glm4_moe: use_qk_norm)
    fused_qkv: bool = False  # phi3: one qkv_proj
    fused_gate_up: bool = False  # phi3: one gate_up_proj
    qkv_bias_key: str | None = "attention_bias"  # config key that turns q/k/v biases on
    o_bias_key: str | None = "attention_bias"  # config key that turns the o_proj bias on
    always_qkv_bias: bool = False  # qwen2: q/k/v always have a bias, o_proj never
    mlp_bias_key: str | None = None
    #: None | "mixtral" | "qwen3_moe" | "deepseek_v3" | "gpt_oss" | ...; "deepseek_v3" is the
    #: DeepSeek-V3 MoE block (sigmoid group-limited router with e_score_correction_bias, shared
    #: experts, first_k_dense_replace dense layers), which glm4_moe's modeling code repeats verbatim;
    #: "mistral4" is that block with DeepSeek-V2's softmax router (router "mistral4")
    moe: str | None = None
    mla: bool = False
    #: per-head learned attention sinks (gpt_oss: ``self_attn.sinks``, one logit per head joined to
    #: every softmax row); transformers has no sdpa path for them (``_supports_sdpa = False``)
    attention_sinks: bool = False
    #: PEFT's ``all-linear`` also wraps the fused routed experts and the router with
    #: ``ParamWrapper`` (PEFT maps the family's per-expert checkpoint names onto the fused
    #: transformers-5 tensors: ``_MOE_TARGET_MODULE_MAPPING``); gpt_oss's checkpoint is fused
    #: already and has no such mapping, so ``all-linear`` there adapts the attention only
    peft_wraps_experts: bool = True
    #: rotary embedding on the first ``int(head_dim * partial_rotary_factor)`` features of each head
    #: only (the rest passes through): the family's default factor, read from the config's
    #: ``rope_parameters`` / ``rope_scaling`` / top-level ``partial_rotary_factor`` (glm4_moe:
    #: ``Glm4MoeConfig`` sets 0.5); None: the rope covers the whole head
    partial_rotary_factor: float | None = None
    activation_key: str = "hidden_act"
    #: "llama": RMSNorm upcasts to fp32 and casts the normalised tensor back before the weight;
    #: "gemma": computes entirely in fp32 with a (1 + weight) scale, casting only the result;
    #: "gpt_oss": fp32 throughout too (``(weight * x_normed_fp32).to(input_dtype)``), plain weight
    norm_style: str = "llama"
    #: first transformers release with this family's modeling code (the exported setup asks for it)
    min_transformers: str = "5.0"
    #: hybrid token mixers (qwen3_5): ``layer_types`` mixes ``linear_attention`` layers (a Gated
    #: DeltaNet, ``GatedDeltaNetSpec``) with ``full_attention`` layers (gated attention: q_proj
    #: also emits a per-feature sigmoid gate on the attention output); without ``layer_types``
    #: every ``full_attention_interval``-th layer (default 4) is full attention
    hybrid_linear: bool = False
    #: gated attention: q_proj emits a sigmoid gate for the attention output (qwen3_5)
    output_gate: bool = False
    #: multimodal rope (qwen3_5's interleaved mrope): the cos/sin tables are built per batch row
    #: (``position_ids`` expanded to ``(3, b, s)``), ``(b, s, rotary_dim)`` each
    mrope: bool = False
    #: the Gated DeltaNet's input projections are fused (qwen3_next): ``in_proj_qkvz`` (q, k, v and
    #: the output gate z, interleaved per key head) and ``in_proj_ba`` (beta and the decay input),
    #: where qwen3_5 has ``in_proj_qkv`` / ``in_proj_z`` / ``in_proj_b`` / ``in_proj_a``
    gdn_fused_proj: bool = False
    #: olmo2 / olmo3: no norm before attention or MLP; RMSNorms on the attention output (after
    #: o_proj) and on the MLP output, before each residual add (``post_attention_layernorm``,
    #: ``post_feedforward_layernorm``): q/k/v and gate/up read the residual stream itself
    post_norms: bool = False
    #: q/k RMSNorm over the whole q / k projection (olmo2: ``heads * head_dim`` and
    #: ``kv_heads * head_dim`` weights, one rsqrt per token) instead of per head
    qk_norm_whole: bool = False
    #: the rotary embedding returns fp32 cos/sin (OlmoRotaryEmbedding does not cast them to the
    #: input dtype): the shared tables are fp32, q/k rotated in fp32 and cast back
    fp32_rope: bool = False
    #: NoPE layers (smollm3): ``no_rope_layers`` (1 = rope) or every ``no_rope_layer_interval``-th
    #: layer without rotary embedding
    nope_layers: bool = False
    #: PEFT's ``target_modules="all-linear"`` runs on this family. Not on llama4_text: PEFT 0.21
    #: wraps ``Llama4Router`` (an ``nn.Linear`` subclass whose forward returns a tuple) and the
    #: LoRA forward fails (``'tuple' object has no attribute 'dtype'``); ftplan plans all-linear
    #: there as every other ``nn.Linear`` and exports that list (:func:`job.peft_target_modules`)
    peft_all_linear: bool = True
    #: transformers has a flash-attention path for the architecture (Llama 4: ``Llama4PreTrainedModel
    #: ._supports_flash_attn = False``, transformers 5.24)
    supports_flash: bool = True
    #: gemma4: full-attention layers have their own attention shape (``global_head_dim``; with
    #: ``attention_k_eq_v`` also ``num_global_key_value_heads`` and no v_proj: v is k_proj's
    #: output), every layer a weightless RMSNorm on v (``v_norm``); see :func:`_gemma4_groups`
    gemma4: bool = False
    #: the dense / MoE pattern is ``mlp_layer_types`` ("dense" / "sparse" per layer; default: layer
    #: 0 dense, the rest sparse), not ``first_k_dense_replace`` (glm4_moe_lite: Glm4MoeLiteConfig
    #: keeps a checkpoint's first_k_dense_replace but its decoder layers never read it)
    mlp_layer_types: bool = False
    #: a legacy config key giving the rotary width in features (minimax_m2: ``rotary_dim``), which
    #: the config class turns into ``partial_rotary_factor = rotary_dim / head_dim`` when neither
    #: ``rope_parameters`` nor a top-level ``partial_rotary_factor`` gives one
    rotary_dim_key: str | None = None
    #: LFM2 (lfm2): ``layer_types`` mixes ``conv`` layers (a gated short convolution,
    #: ``ShortConvSpec``) with ``full_attention`` layers; without ``layer_types`` the layers listed
    #: in ``full_attn_idxs`` are attention (default: all of them), the others conv
    short_conv: bool = False
    #: the MLP's width is derived from the config as Lfm2MLP does (``block_ff_dim``, else
    #: ``intermediate_size``; with ``block_auto_adjust_ff_dim`` two thirds of it, times
    #: ``block_ffn_dim_multiplier``, rounded up to ``block_multiple_of``)
    block_ff_dim: bool = False
    #: the MLP's module names (gate, up, down) where they are not llama's (lfm2: w1, w3, w2)
    mlp_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    #: the attention output projection's module name (lfm2: ``out_proj``)
    o_proj_name: str = "o_proj"
    #: the model scales the embedding output outside the embedding module (granite:
    #: ``inputs_embeds * embedding_multiplier`` in GraniteModel.forward), so the first layer's input
    #: is a new tensor; with a frozen embedding under checkpointing the unscaled output, a leaf
    #: that ``enable_input_require_grads`` marks, stays alive as well (see memory.py)
    embedding_scaled_outside: bool = False
    #: each attention layer builds its own interleaved fp32 cos/sin for the rope (ernie4_5:
    #: ``cos[..., :d/2].repeat_interleave(2)`` of the shared fp32 tables, ``(1, 1, s, d)`` each,
    #: which the rotary muls save), and rotates q/k in fp32 before casting back (``fp32_rope``)
    rope_interleave_tables: bool = False
    #: config keys of dropouts applied inside the layers in training, which the masks they save
    #: make visible (seed_oss: ``attention_dropout`` on the attention probabilities,
    #: ``residual_dropout`` on the o_proj and down_proj outputs); None: not read (other families'
    #: ``attention_dropout`` is 0.0 in every bundled config and is not modelled)
    dropout_keys: tuple[str, str] | None = None
    #: with a sliding window, the full-attention layers skip the rotary embedding (exaone4:
    #: ``if self.sliding_window is None or self.is_sliding: apply_rotary_pos_emb``); without one
    #: every layer rotates
    nope_global_layers: bool = False
    #: the per-head q/k RMSNorms run after the rotary embedding (hunyuan_v1_dense:
    #: ``query_layernorm(apply_rotary_pos_emb(q))``), on q/k in the rope's output dtype
    qk_norm_after_rope: bool = False
    #: the MLA attention rotates q_pe / k_pe through ``view_as_complex`` of fp32 copies times one
    #: shared complex64 ``freqs_cis`` table (deepseek_v2: ``apply_rotary_emb``), cast back to the
    #: projections' dtype, instead of DeepSeek-V3's cos/sin tables
    mla_complex_rope: bool = False
    #: cohere2: attention and MLP run in parallel on one norm's output (``residual + attn(x) +
    #: mlp(x)``, ``norms_per_layer=1``): the MLP's linears read the tensor q/k/v read
    parallel_block: bool = False
    #: the rope rotates fp32 copies of q and k and casts the results back to their dtype (cohere2's
    #: ``apply_rotary_pos_emb``: ``q.float()``), its cos/sin tables in the residual stream's dtype
    rope_cast_back: bool = False
    #: only the sliding-window layers rotate (cohere2: ``if self.sliding_window is not None``): the
    #: full-attention layers are NoPE, and every layer is without a window
    rope_only_sliding: bool = False
    #: the hidden-size norms are ``nn.LayerNorm`` with a bias (phimoe: weight + bias per norm)
    norm_bias: bool = False
    #: config key that puts a vocab-size bias on the lm_head (phimoe: ``lm_head_bias``)
    lm_head_bias_key: str | None = None


#: first transformers wheel with models/gemma4: 5.5.0 (the 5.4.0 wheel has none; checked with
#: ``pip download --no-deps transformers==5.4.0 / 5.5.0``)
GEMMA4_MIN_TRANSFORMERS = "5.5"

_LLAMA_LIKE = dict(
    vocab_size=32000,
    hidden_size=4096,
    intermediate_size=11008,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=None,
    head_dim=None,
    tie_word_embeddings=False,
    attention_bias=False,
    hidden_act="silu",
    sliding_window=None,
    max_position_embeddings=2048,
)

FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in [
        Family("llama", {**_LLAMA_LIKE, "mlp_bias": False}, mlp_bias_key="mlp_bias"),
        Family(
            "mistral",
            {**_LLAMA_LIKE, "intermediate_size": 14336, "num_key_value_heads": 8,
             "sliding_window": 4096, "max_position_embeddings": 131072},
            qkv_bias_key=None, o_bias_key=None,
        ),
        Family(
            "mixtral",
            {**_LLAMA_LIKE, "intermediate_size": 14336, "num_key_value_heads": 8,
             "num_local_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 131072},
            qkv_bias_key=None, o_bias_key=None, moe="mixtral",
        ),
        Family(
            "qwen2",
            {**_LLAMA_LIKE, "vocab_size": 151936, "intermediate_size": 22016,
             "max_position_embeddings": 32768, "use_sliding_window": False, "max_window_layers": 28},
            qkv_bias_key=None, o_bias_key=None, always_qkv_bias=True,
        ),
        Family(
            "qwen3",
            {**_LLAMA_LIKE, "vocab_size": 151936, "intermediate_size": 22016, "head_dim": 128,
             "max_position_embeddings": 32768, "use_sliding_window": False, "max_window_layers": 28},
            qk_norm=True,
        ),
        Family(
            "qwen3_moe",
            {**_LLAMA_LIKE, "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
             "num_hidden_layers": 24, "num_key_value_heads": 4, "max_position_embeddings": 32768,
             "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
             "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": False,
             "use_sliding_window": False},
            qk_norm=True, moe="qwen3_moe",
        ),
        Family(
            "gemma2",
            {**_LLAMA_LIKE, "vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216,
             "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
             "head_dim": 256, "tie_word_embeddings": True, "sliding_window": 4096,
             "hidden_activation": "gelu_pytorch_tanh", "attn_logit_softcapping": 50.0,
             "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 256,
             "max_position_embeddings": 8192},
            norms_per_layer=4, activation_key="hidden_activation", norm_style="gemma",
        ),
        Family(
            "gemma3_text",
            {**_LLAMA_LIKE, "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
             "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
             "head_dim": 256, "tie_word_embeddings": True, "sliding_window": 4096,
             "sliding_window_pattern": 6, "hidden_activation": "gelu_pytorch_tanh",
             "attn_logit_softcapping": None, "final_logit_softcapping": None,
             "query_pre_attn_scalar": 256, "max_position_embeddings": 131072},
            norms_per_layer=4, qk_norm=True, activation_key="hidden_activation", norm_style="gemma",
        ),
        Family(
            "phi3",
            {**_LLAMA_LIKE, "vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192,
             "max_position_embeddings": 4096},
            fused_qkv=True, fused_gate_up=True, qkv_bias_key=None, o_bias_key=None,
            # Phi3Config's default; Phi-4-mini rotates 0.75 of each head (rope tables of that width)
            partial_rotary_factor=1.0,
        ),
        Family(
            "deepseek_v3",
            {**_LLAMA_LIKE, "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
             "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
             "n_routed_experts": 256, "num_experts_per_tok": 8, "n_shared_experts": 1,
             "moe_intermediate_size": 2048, "first_k_dense_replace": 3, "q_lora_rank": 1536,
             "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
             "v_head_dim": 128, "max_position_embeddings": 4096, "n_group": 8, "topk_group": 4},
            moe="deepseek_v3", mla=True,
        ),
        Family(
            "gpt_oss",
            {**_LLAMA_LIKE, "vocab_size": 201088, "hidden_size": 2880, "intermediate_size": 2880,
             "num_hidden_layers": 36, "num_attention_heads": 64, "num_key_value_heads": 8,
             "head_dim": 64, "sliding_window": 128, "attention_bias": True,
             "num_local_experts": 128, "num_experts_per_tok": 4, "max_position_embeddings": 131072},
            moe="gpt_oss", attention_sinks=True, peft_wraps_experts=False, norm_style="gpt_oss",
        ),
        Family(
            # GLM-4.5 / 4.5-Air / 4.6 / 4.7: GQA with q/k/v biases (o_proj never), optional per-head
            # q/k norms, half-rotary RoPE, DeepSeek-V3's MoE block; head_dim is no field of the
            # config class (None: hidden // heads)
            "glm4_moe",
            {**_LLAMA_LIKE, "vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 10944,
             "num_hidden_layers": 46, "num_attention_heads": 96, "num_key_value_heads": 8,
             "max_position_embeddings": 131072, "n_routed_experts": 128, "num_experts_per_tok": 8,
             "n_shared_experts": 1, "moe_intermediate_size": 1408, "first_k_dense_replace": 1,
             "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 1.0,
             "use_qk_norm": False, "num_nextn_predict_layers": 1},
            o_bias_key=None, qk_norm_key="use_qk_norm", moe="deepseek_v3", partial_rotary_factor=0.5,
        ),
        Family(
            # Qwen3.5 dense (Qwen3_5TextConfig, transformers 5.24): 3 Gated DeltaNet layers to 1
            # gated full-attention layer, q/k norms, a quarter-rotary mrope on text positions,
            # zero-centred (1 + weight) fp32 RMSNorms as gemma's; image-text checkpoints keep the
            # text model in ``text_config`` (model_type qwen3_5_text)
            "qwen3_5",
            {**_LLAMA_LIKE, "vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288,
             "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 4,
             "head_dim": 256, "max_position_embeddings": 32768, "linear_conv_kernel_dim": 4,
             "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
             "linear_num_value_heads": 32, "full_attention_interval": 4},
            qk_norm=True, mlp_bias_key=None, partial_rotary_factor=0.25, norm_style="gemma",
            hybrid_linear=True, output_gate=True, mrope=True,
            min_transformers="5.2",  # models/qwen3_5 first ships in the 5.2.0 wheel (5.1.0 has none)
        ),
        Family(
            # Qwen3.5 MoE (Qwen3_5MoeTextConfig, transformers 5.24): qwen3_5's hybrid layers with
            # every MLP a Qwen3_5MoeSparseMoeBlock: qwen3_moe's softmax top-k router (always
            # renormalised), fused 3-D experts, one shared expert MLP scaled per token by
            # sigmoid(shared_expert_gate(x)) (a Linear hidden -> 1). PEFT has no v4->v5 MoE mapping
            # for it (transformers maps qwen3_5_moe_text onto qwen3_5_text's conversions), so
            # ``all-linear`` wraps the nn.Linear modules only: the shared expert and its gate too,
            # neither the routed experts nor the router
            "qwen3_5_moe",
            {**_LLAMA_LIKE, "vocab_size": 248320, "hidden_size": 2048, "intermediate_size": None,
             "num_hidden_layers": 40, "num_attention_heads": 16, "num_key_value_heads": 2,
             "head_dim": 256, "max_position_embeddings": 32768, "linear_conv_kernel_dim": 4,
             "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
             "linear_num_value_heads": 32, "full_attention_interval": 4, "moe_intermediate_size": 512,
             "shared_expert_intermediate_size": 512, "num_experts_per_tok": 8, "num_experts": 256},
            qk_norm=True, mlp_bias_key=None, partial_rotary_factor=0.25, norm_style="gemma",
            hybrid_linear=True, output_gate=True, mrope=True, moe="qwen3_5_moe", peft_wraps_experts=False,
            min_transformers="5.2",  # models/qwen3_5_moe ships with qwen3_5 (5.2.0)
        ),
        Family(
            # Qwen3-Next (Qwen3NextConfig, transformers 5.24): qwen3_5's hybrid layout (3 Gated
            # DeltaNet layers to 1 gated full-attention layer, q/k norms, zero-centred fp32
            # RMSNorms) with the DeltaNet's projections fused (in_proj_qkvz, in_proj_ba), a plain
            # (not mrope) quarter rotary, and qwen2_moe's sparse block: a softmax top-k router
            # (renormalised when norm_topk_prob), fused 3-D experts, one shared expert scaled by
            # sigmoid(shared_expert_gate(x)); decoder_sparse_step / mlp_only_layers pick dense
            # layers (intermediate_size) as in qwen3_moe. transformers maps qwen3_next's weight
            # conversions onto qwen2_moe's, so PEFT's all-linear wraps the experts and the router
            # (ParamWrapper) and leaves the MLP projections (the shared expert's) alone; the
            # shared_expert_gate, an nn.Linear of no mapping, is wrapped
            "qwen3_next",
            {**_LLAMA_LIKE, "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632,
             "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2,
             "head_dim": 256, "max_position_embeddings": 32768, "linear_conv_kernel_dim": 4,
             "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
             "linear_num_value_heads": 32, "full_attention_interval": 4, "decoder_sparse_step": 1,
             "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
             "num_experts_per_tok": 10, "num_experts": 512, "norm_topk_prob": True, "mlp_only_layers": []},
            qk_norm=True, mlp_bias_key=None, partial_rotary_factor=0.25, norm_style="gemma",
            hybrid_linear=True, output_gate=True, moe="qwen3_next", gdn_fused_proj=True,
            # models/qwen3_next first ships in the 4.57.0 wheel (4.56.2 has none; 4.57.0 is yanked,
            # 4.57.1 installs); the exported floor stays 5.0 (fused experts, PEFT's MoE mapping)
            min_transformers="4.57",
        ),
        Family(
            # OLMo 2 (Olmo2Config, transformers 5.24): llama's projections without pre-norms: the
            # attention output and the MLP output are RMSNormed before each residual add, q and k
            # RMSNormed over the whole projection; OLMo's RMSNorm multiplies the weight in fp32
            # (as gpt_oss's) and its rotary tables stay fp32; head_dim is no field (hidden // heads)
            "olmo2",
            {**_LLAMA_LIKE, "vocab_size": 50304},
            qk_norm=True, qk_norm_whole=True, post_norms=True, fp32_rope=True, norm_style="gpt_oss",
            mlp_bias_key=None,
        ),
        Family(
            # OLMo 3 (Olmo3Config): olmo2's layers; layer_types sliding/full (default: every 4th
            # layer full attention) with sliding_window 4096; one pair of rope tables per layer type
            "olmo3",
            {**_LLAMA_LIKE, "vocab_size": 50304, "sliding_window": 4096},
            qk_norm=True, qk_norm_whole=True, post_norms=True, fp32_rope=True, norm_style="gpt_oss",
            mlp_bias_key=None,
        ),
        Family(
            # SmolLM3 (SmolLM3Config): llama's layers, rotary embedding skipped in the NoPE layers
            # (no_rope_layers, default every 4th); sliding windows only with use_sliding_window
            "smollm3",
            {**_LLAMA_LIKE, "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 11008,
             "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 4,
             "max_position_embeddings": 32768, "tie_word_embeddings": True, "mlp_bias": False,
             "use_sliding_window": False, "no_rope_layer_interval": 4},
            mlp_bias_key="mlp_bias", nope_layers=True,
        ),
        Family(
            # Llama 4 text (Llama4TextConfig, transformers 5.24): MoE layers (every
            # ``interleave_moe_layer_step``-th, or ``moe_layers``) between dense MLP layers of
            # ``intermediate_size_mlp``; an MoE layer is a shared expert MLP (``intermediate_size``)
            # plus fused 3-D experts fed every token pre-scaled by its sigmoid router score (top-k
            # scores, the rest 0: transformers runs every expert on every token, a dense bmm); rope
            # layers (``no_rope_layers[i] == 1``) use complex-valued rope, a weightless L2 q/k norm
            # (``use_qk_norm``) and chunked local attention (``attention_chunk_size``); NoPE layers
            # attend over the whole causal row with the query scaled by the attention temperature
            # (``attn_temperature_tuning``). Image-text checkpoints (Llama4ForConditionalGeneration)
            # keep it in ``text_config``: AutoModelForCausalLM builds Llama4ForCausalLM from it
            "llama4_text",
            {**_LLAMA_LIKE, "vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192,
             "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
             "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072,
             "num_experts_per_tok": 1, "num_local_experts": 16, "moe_layers": None,
             "interleave_moe_layer_step": 1, "use_qk_norm": True, "no_rope_layers": None,
             "no_rope_layer_interval": 4, "attention_chunk_size": 8192, "layer_types": None,
             "attn_temperature_tuning": True, "floor_scale": 8192, "attn_scale": 0.1},
            moe="llama4", peft_wraps_experts=False, peft_all_linear=False, supports_flash=False,
            # models/llama4 first ships in the 4.51.0 wheel (4.50.3 has none; checked on PyPI); the
            # export's 5.0 floor (transformers-5 fused experts, what ftplan holds) is the higher one
            min_transformers="4.51.0",
        ),
        Family(
            # Gemma 4 (Gemma4TextConfig, transformers 5.24): gemma3's four norms per layer and q/k
            # norms plus a weightless v norm; sliding layers of head_dim, full-attention layers of
            # global_head_dim (with attention_k_eq_v: num_global_key_value_heads and k = v, no
            # v_proj); a proportional rope (full-width cos/sin tables); RMSNorm in fp32 with a
            # plain weight (``x * pow(mean(x^2) + eps, -0.5) * weight.float()``); attention
            # scaling 1. Image/audio-text checkpoints (model_type gemma4) keep it in text_config.
            # Per-layer input embeddings (E2B/E4B), KV sharing and bidirectional attention are
            # refused (:func:`_gemma4_refusals`)
            "gemma4",
            {**{k: v for k, v in _LLAMA_LIKE.items() if k != "hidden_act"}, "vocab_size": 262144, "hidden_size": 2304, "intermediate_size": 9216,
             "num_hidden_layers": 30, "num_attention_heads": 8, "num_key_value_heads": 4,
             "head_dim": 256, "tie_word_embeddings": True, "sliding_window": 512,
             "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": None,
             "max_position_embeddings": 131072, "hidden_size_per_layer_input": 256,
             "vocab_size_per_layer_input": 262144, "global_head_dim": 512,
             "num_global_key_value_heads": None, "attention_k_eq_v": False, "num_kv_shared_layers": 0,
             "enable_moe_block": False, "use_double_wide_mlp": False, "num_experts": None,
             "top_k_experts": None, "moe_intermediate_size": None, "use_bidirectional_attention": None},
            norms_per_layer=4, qk_norm=True, activation_key="hidden_activation", norm_style="gemma4",
            gemma4=True, min_transformers=GEMMA4_MIN_TRANSFORMERS, moe="gemma4", peft_wraps_experts=False,
        ),
        Family(
            # GLM-4.7-Flash (Glm4MoeLiteConfig, transformers 5.24): DeepSeek-V3's MLA attention
            # (DeepseekV3Attention verbatim: q/kv LoRA ranks, interleaved rope on the qk_rope part)
            # with glm4_moe's (= DeepSeek-V3's) MoE block; dense/MoE layers from mlp_layer_types;
            # head_dim is an alias of qk_rope_head_dim (attribute_map)
            "glm4_moe_lite",
            {**_LLAMA_LIKE, "vocab_size": 154880, "hidden_size": 2048, "intermediate_size": 10240,
             "num_hidden_layers": 47, "num_attention_heads": 20, "num_key_value_heads": 20,
             "n_routed_experts": 64, "num_experts_per_tok": 4, "n_shared_experts": 1,
             "moe_intermediate_size": 1536, "q_lora_rank": 768, "kv_lora_rank": 512,
             "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "v_head_dim": 256,
             "max_position_embeddings": 202752, "n_group": 1, "topk_group": 1, "norm_topk_prob": True,
             "routed_scaling_factor": 1.8, "rope_interleave": True, "mlp_layer_types": None},
            # the rotary embedding is glm4_moe's (rope_parameters' partial_rotary_factor, default
            # 1.0, of qk_rope_head_dim); the MLA attention rotates all qk_rope_head_dim features
            moe="deepseek_v3", mla=True, mlp_layer_types=True, partial_rotary_factor=1.0,
            # models/glm4_moe_lite ships in the 5.0.0 wheel already (mlp_layer_types as in 5.24;
            # checked on PyPI): the default 5.0 floor
        ),
        Family(
            # Mistral Small 4 (Mistral4Config, transformers 5.24): DeepSeek-V3's MLA attention and
            # MoE block layout (fused experts, shared experts, first_k_dense_replace dense layers,
            # group-limited top-k) with DeepSeek-V2's router: a softmax over logits of the input's
            # dtype (no fp32 weight, no e_score_correction_bias); the query is scaled per position
            # by llama-4's ``1 + beta * log(1 + floor(pos / original_max))`` before attention.
            # The public checkpoint is a Mistral3ForConditionalGeneration (Pixtral vision tower)
            # whose text_config is mistral4: ftplan plans the text model (Mistral4ForCausalLM)
            "mistral4",
            {**_LLAMA_LIKE, "vocab_size": 131072, "hidden_size": 4096, "intermediate_size": 12288,
             "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 32,
             "n_routed_experts": 128, "num_experts_per_tok": 4, "n_shared_experts": 1,
             "moe_intermediate_size": 2048, "first_k_dense_replace": 0, "q_lora_rank": 1024,
             "kv_lora_rank": 256, "qk_nope_head_dim": 64, "qk_rope_head_dim": 64,
             "v_head_dim": 128, "max_position_embeddings": 1048576, "n_group": 1, "topk_group": 1,
             "norm_topk_prob": True, "routed_scaling_factor": 1.0},
            moe="mistral4", mla=True, peft_wraps_experts=False,
            min_transformers="5.4",
        ),
        Family(
            # MiniMax-M2 / M2.1 / M2.5 / M2.7 (MiniMaxM2Config, transformers 5.24): every layer
            # GQA attention with q/k RMSNorms over the whole projection (as olmo2's, but llama's
            # RMSNorm: the weight multiplies the cast-back tensor) and a partial rotary (the
            # checkpoints' legacy ``rotary_dim``, 64 of head_dim 128; the config class's default is
            # the whole head), then mixtral's MoE block: fused 3-D experts of intermediate_size
            # (no shared expert) behind a router whose logits are the weight's dtype, scored by an
            # fp32 sigmoid plus the ``e_score_correction_bias`` buffer for the choice, the chosen
            # sigmoid scores renormalised. That router saves what mixtral's fp32-softmax router
            # saves (the fp32 scores of all experts, the top-k ids, the sum and the quotient), so it
            # is planned as "mixtral". transformers maps minimax_m2's weight conversions onto
            # mixtral's, so PEFT's all-linear wraps the experts and the router (ParamWrapper)
            "minimax_m2",
            {**_LLAMA_LIKE, "vocab_size": 200064, "hidden_size": 3072, "intermediate_size": 1536,
             "num_hidden_layers": 62, "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128,
             "max_position_embeddings": 196608, "num_local_experts": 256, "num_experts_per_tok": 8},
            qkv_bias_key=None, o_bias_key=None, moe="mixtral", qk_norm=True, qk_norm_whole=True,
            partial_rotary_factor=1.0, rotary_dim_key="rotary_dim",
            # models/minimax_m2 ships in the 5.0.0 wheel, but MiniMaxM2Config reads the checkpoints'
            # rotary_dim from 5.18.0 on (5.0.0, 5.16.1 and 5.17.0 ignore it and rotate the whole head:
            # not the model the checkpoints were trained as; checked with pip download --no-deps)
            min_transformers="5.18",
        ),
        Family(
            # LFM2 (Lfm2Config, transformers 5.24): gated short-convolution layers (Lfm2ShortConv:
            # in_proj -> B, C, x; B * x through a depthwise causal Conv1d of conv_L_cache taps;
            # C * that; out_proj) between GQA attention layers with per-head q/k RMSNorms
            # (q_layernorm / k_layernorm) and an out_proj; a SwiGLU MLP (w1, w3, w2) whose width
            # Lfm2MLP derives from the config; llama's RMSNorm and rope; tied embeddings; the final
            # norm is called embedding_norm. config.json's ``block_ff_dim`` and ``tie_embedding``
            # override intermediate_size / tie_word_embeddings (Lfm2Config.__post_init__)
            "lfm2",
            {**_LLAMA_LIKE, "vocab_size": 65536, "hidden_size": 2560, "intermediate_size": 12288,
             "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "max_position_embeddings": 128000, "tie_word_embeddings": True, "conv_bias": False,
             "conv_L_cache": 3, "block_multiple_of": 256, "block_ffn_dim_multiplier": 1.0,
             "block_auto_adjust_ff_dim": True, "full_attn_idxs": None, "layer_types": None},
            qk_norm=True, qkv_bias_key=None, o_bias_key=None, short_conv=True, block_ff_dim=True,
            mlp_names=("w1", "w3", "w2"), o_proj_name="out_proj",
        ),
        Family(
            # LFM2-MoE (Lfm2MoeConfig, transformers 5.24): lfm2's conv / attention layers; the first
            # num_dense_layers layers a SwiGLU MLP of intermediate_size as given (no block_* width
            # rule), the others a sparse block: a sigmoid router (an nn.Parameter ``gate.weight``,
            # logits in the compute dtype; top-k on the scores plus an fp32 ``expert_bias`` buffer,
            # the unbiased scores gathered, renormalised when norm_topk_prob, times
            # routed_scaling_factor) and fused 3-D experts (w1/w3 as gate_up_proj, w2 as down_proj).
            # PEFT 0.21.2 has no MoE mapping for it: all-linear wraps the nn.Linear modules only
            "lfm2_moe",
            {**_LLAMA_LIKE, "vocab_size": 65536, "hidden_size": 2048, "intermediate_size": 7168,
             "moe_intermediate_size": 1792, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 8, "max_position_embeddings": 128000, "tie_word_embeddings": True,
             "conv_bias": False, "conv_L_cache": 3, "num_dense_layers": 2, "num_experts_per_tok": 4,
             "num_experts": 32, "use_expert_bias": True, "routed_scaling_factor": 1.0,
             "norm_topk_prob": True, "layer_types": None},
            qk_norm=True, qkv_bias_key=None, o_bias_key=None, short_conv=True,
            mlp_names=("w1", "w3", "w2"), o_proj_name="out_proj", moe="lfm2_moe", peft_wraps_experts=False,
        ),
        Family(
            # IBM Granite 3.x dense (GraniteConfig, transformers 5.24): llama's decoder with muP
            # multipliers, python floats of the config: the embedding output times
            # embedding_multiplier, each attention and MLP output times residual_multiplier before
            # its residual add, attention_multiplier as the softmax scale (not 1/sqrt(head_dim)), the
            # logits divided by logits_scaling. A tensor-by-scalar mul/div saves nothing for
            # backward, so the saved set, the parameters and the states are llama's; q/k/v/o share
            # attention_bias; head_dim is no field of the config class (hidden // heads)
            "granite",
            {**_LLAMA_LIKE, "mlp_bias": False, "embedding_multiplier": 1.0, "logits_scaling": 1.0,
             "residual_multiplier": 1.0, "attention_multiplier": 1.0},
            mlp_bias_key="mlp_bias", embedding_scaled_outside=True,
        ),
        Family(
            # Baidu ERNIE 4.5 dense (Ernie4_5Config, transformers 5.24): llama's layers with one
            # use_bias switch for every projection (q/k/v/o and gate/up/down), head_dim 128, tied
            # embeddings; the rotary embedding keeps its cos/sin fp32 and each layer rotates q and k
            # in fp32 with GLM-style interleaved tables (``repeat_interleave`` copies of the fp32
            # tables, saved per layer), casting them back to the projections' dtype
            "ernie4_5",
            {**{k: v for k, v in _LLAMA_LIKE.items() if k not in ("attention_bias", "sliding_window")},
             "vocab_size": 103424, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 18,
             "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 128,
             "max_position_embeddings": 131072, "tie_word_embeddings": True, "use_bias": False},
            qkv_bias_key="use_bias", o_bias_key="use_bias", mlp_bias_key="use_bias", fp32_rope=True,
            rope_interleave_tables=True,
        ),
        Family(
            # ByteDance Seed-OSS (SeedOssConfig, transformers 5.24): llama's layers with q/k/v biases
            # (attention_bias, default on) apart from o_proj's (attention_out_bias, default off),
            # head_dim 128, and dropouts in training: attention_dropout on the attention
            # probabilities, residual_dropout on o_proj's and down_proj's outputs (both 0.1 by
            # default), whose masks the layers save
            "seed_oss",
            {**_LLAMA_LIKE, "vocab_size": 155136, "hidden_size": 4096, "intermediate_size": 27648,
             "num_hidden_layers": 64, "num_attention_heads": 80, "num_key_value_heads": 8, "head_dim": 128,
             "max_position_embeddings": 524288, "attention_bias": True, "attention_out_bias": False,
             "attention_dropout": 0.1, "residual_dropout": 0.1, "mlp_bias": False},
            qkv_bias_key="attention_bias", o_bias_key="attention_out_bias", mlp_bias_key="mlp_bias",
            dropout_keys=("attention_dropout", "residual_dropout"),
        ),
        Family(
            # IBM Granite 3.x MoE (GraniteMoeConfig, transformers 5.24): granite's multipliers on
            # mixtral's layout (every layer an MoE block: fused 3-D experts of intermediate_size, no
            # shared expert) behind a router whose logits (the weight's dtype) are upcast to fp32,
            # top-k first and a softmax over the k chosen logits only, cast back to the input's
            # dtype. PEFT 0.21 has no MoE mapping for granitemoe: all-linear adapts the attention
            "granitemoe",
            {**_LLAMA_LIKE, "embedding_multiplier": 1.0, "logits_scaling": 1.0, "residual_multiplier": 1.0,
             "attention_multiplier": 1.0, "num_local_experts": 8, "num_experts_per_tok": 2},
            moe="granitemoe", peft_wraps_experts=False, embedding_scaled_outside=True,
        ),
        Family(
            # AllenAI OLMoE (OlmoeConfig, transformers 5.24): llama's pre-norm layers (llama's
            # RMSNorm and rope, not OLMo 2's post-norms) with q/k RMSNorms over the whole q / k
            # projection (as olmo2's / minimax_m2's), then an MoE block in every layer: qwen3_moe's
            # router (fp32 softmax, top-k, renormalised when norm_topk_prob, cast back) and fused
            # 3-D experts of intermediate_size, no shared expert. attention_bias puts a bias on
            # q/k/v and o_proj; head_dim is no field (hidden // heads: q_norm is hidden_size wide).
            # transformers maps olmoe's weight conversions onto qwen2_moe's, so PEFT's all-linear
            # wraps the experts and the router (ParamWrapper)
            "olmoe",
            {**_LLAMA_LIKE, "vocab_size": 50304, "hidden_size": 2048, "intermediate_size": 2048,
             "num_hidden_layers": 16, "num_attention_heads": 16, "max_position_embeddings": 4096,
             "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": False, "clip_qkv": None},
            qk_norm=True, qk_norm_whole=True, moe="olmoe",
        ),
        Family(
            # LG EXAONE 4.0 (Exaone4Config, transformers 5.24): OLMo 2's post-norm layout (no norm
            # before attention or MLP; RMSNorms on o_proj's and down_proj's outputs before each
            # residual add) with llama's RMSNorm and rope (cos/sin in the input's dtype), per-head
            # q/k RMSNorms (applied after the head transpose), no biases; layer_types
            # sliding/full (default: every sliding_window_pattern-th layer full attention, the
            # others a sliding_window of 4096), and with a window the full-attention layers are
            # NoPE (no rotary embedding); head_dim is no field of the config class (hidden // heads)
            "exaone4",
            {**{k: v for k, v in _LLAMA_LIKE.items() if k != "attention_bias"}, "vocab_size": 102400,
             "intermediate_size": 16384, "num_key_value_heads": 32, "sliding_window": 4096,
             "sliding_window_pattern": 4, "layer_types": None},
            qk_norm=True, post_norms=True, qkv_bias_key=None, o_bias_key=None, nope_global_layers=True,
        ),
        Family(
            # rednote dots.llm1 (Dots1Config, transformers 5.24): qwen3's attention (per-head q/k
            # RMSNorms; attention_bias on q/k/v and o_proj) with DeepSeek-V3's MoE block verbatim
            # (fp32 sigmoid router with e_score_correction_bias, group-limited top-k, shared
            # experts, first_k_dense_replace dense layers; gate.weight kept fp32), as glm4_moe with
            # its q/k norms on a full rotary. Sliding windows on layers >= max_window_layers when
            # sliding_window is set (no use_sliding_window switch), or layer_types; head_dim is no
            # field (hidden // heads). transformers maps dots1 onto qwen2_moe's conversions: PEFT's
            # all-linear wraps the experts and the router, not the dense MLPs nor the shared experts
            "dots1",
            {**_LLAMA_LIKE, "vocab_size": 152064, "hidden_size": 4608, "intermediate_size": 10944,
             "moe_intermediate_size": 1408, "num_hidden_layers": 62, "num_key_value_heads": 32,
             "n_shared_experts": None, "n_routed_experts": None, "n_group": 1, "topk_group": 1,
             "num_experts_per_tok": None, "first_k_dense_replace": 0, "norm_topk_prob": False,
             "routed_scaling_factor": 1.0, "sliding_window": 4096, "max_window_layers": 62, "layer_types": None},
            qk_norm=True, moe="deepseek_v3",
        ),
        Family(
            # Tencent Hunyuan dense (HunYuanDenseV1Config, transformers 5.24): llama's layers with
            # per-head q/k RMSNorms (query_layernorm / key_layernorm) applied after the rotary
            # embedding, attention_bias on q/k/v and o_proj; the checkpoints' "dynamic" rope with a
            # fixed alpha is an NTK-alpha base (the same tables' shape); head_dim None: hidden // heads
            "hunyuan_v1_dense",
            {**_LLAMA_LIKE, "vocab_size": 290943, "intermediate_size": 11008},
            qk_norm=True, qk_norm_after_rope=True,
        ),
        Family(
            # Baidu ERNIE 4.5 MoE (Ernie4_5_MoeConfig, transformers 5.24): ernie4_5's attention (one
            # use_bias switch, fp32 interleaved rope tables per layer); the layers i with
            # moe_layer_start_index <= i <= moe_layer_end_index (-1: the last) and (i + 1) %
            # moe_layer_interval == 0 an MoE block: moe_num_shared_experts shared experts fused into
            # one MLP of moe_intermediate_size * that (before the router), fused 3-D experts of
            # moe_intermediate_size (no bias) behind an fp32 router (autocast off: ``x.float()``
            # through the fp32 ``gate.weight``, a softmax, top-k of the probabilities plus the frozen
            # fp32 ``e_score_correction_bias`` Parameter, the chosen probabilities divided by their
            # sum clamped to moe_norm_min, cast to the input's dtype); the other layers a dense MLP of
            # intermediate_size. PEFT maps it onto qwen2_moe's names: all-linear wraps the experts and
            # the router (ParamWrapper)
            "ernie4_5_moe",
            {**{k: v for k, v in _LLAMA_LIKE.items() if k not in ("attention_bias", "sliding_window", "head_dim")},
             "vocab_size": 103424, "hidden_size": 2560, "intermediate_size": 12288, "num_hidden_layers": 28,
             "num_attention_heads": 20, "num_key_value_heads": 4, "max_position_embeddings": 131072,
             "tie_word_embeddings": True, "use_bias": False, "moe_intermediate_size": 1536, "moe_k": 6,
             "moe_num_experts": 64, "moe_num_shared_experts": 2, "moe_layer_start_index": 1,
             "moe_layer_end_index": -1, "moe_layer_interval": 1},
            qkv_bias_key="use_bias", o_bias_key="use_bias", mlp_bias_key="use_bias", fp32_rope=True,
            rope_interleave_tables=True, moe="ernie4_5_moe",
        ),
        Family(
            # Google Gemma 1 (GemmaConfig, transformers 5.24): llama's pre-norm layers with gemma's
            # fp32 (1 + weight) RMSNorm, the embedding output scaled by sqrt(hidden_size) inside the
            # embedding module (GemmaTextScaledWordEmbedding, as gemma2's), a GeGLU MLP
            # (gelu_pytorch_tanh; GemmaConfig turns a checkpoint's "gelu" into it), attention_bias on
            # q/k/v and o_proj, head_dim 256 whatever hidden / heads (gemma-7b: 16 x 256 > 3072),
            # tied embeddings; two norms per layer, no window, no soft-capping (gemma2's additions)
            "gemma",
            {**_LLAMA_LIKE, "vocab_size": 256000, "hidden_size": 3072, "intermediate_size": 24576,
             "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256,
             "hidden_act": "gelu_pytorch_tanh", "max_position_embeddings": 8192, "tie_word_embeddings": True,
             "use_bidirectional_attention": None},
            norm_style="gemma",
        ),
        Family(
            # Qwen1.5-MoE / Qwen2-MoE (Qwen2MoeConfig, transformers 5.24): qwen2's attention (q/k/v
            # biases by qkv_bias, default on; o_proj none) with the sparse block qwen3_next copies
            # (planned as "qwen3_next"): a softmax top-k router renormalised when norm_topk_prob,
            # fused 3-D experts of moe_intermediate_size, one shared expert MLP of
            # shared_expert_intermediate_size scaled by sigmoid(shared_expert_gate(x));
            # decoder_sparse_step / mlp_only_layers pick dense layers of intermediate_size. With
            # use_sliding_window the even layers below max_window_layers slide (Qwen2MoeConfig's
            # rule). transformers' _MODEL_TO_CONVERSION_PATTERN maps other families onto the
            # "qwen2_moe" pattern but has no entry for qwen2_moe itself, so PEFT 0.21.2 does not
            # rewrite all-linear here: it wraps every nn.Linear (attention, dense and shared-expert
            # MLPs, shared_expert_gate), neither the fused experts nor the router
            "qwen2_moe",
            {**{k: v for k, v in _LLAMA_LIKE.items() if k != "attention_bias"}, "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632,
             "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
             "max_position_embeddings": 32768, "use_sliding_window": False, "sliding_window": 4096,
             "max_window_layers": 28, "decoder_sparse_step": 1, "moe_intermediate_size": 1408,
             "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4, "num_experts": 60,
             "norm_topk_prob": False, "output_router_logits": False, "mlp_only_layers": [], "qkv_bias": True,
             "layer_types": None},
            qkv_bias_key="qkv_bias", o_bias_key=None, moe="qwen3_next", peft_wraps_experts=False,
        ),
        Family(
            # GLM-4-0414 dense (Glm4Config, transformers 5.24): llama's RMSNorm with four norms per
            # layer (input, post_self_attn on o_proj's output, post_attention before the MLP,
            # post_mlp on down_proj's output: gemma2's sandwich), q/k/v biases (attention_bias,
            # default on; o_proj none), a fused gate_up_proj (phi3's chunked SwiGLU, up * act(gate)),
            # a partial rotary (Glm4Config's default factor 0.5) applied GLM-style: each layer
            # builds interleaved copies of the shared cos/sin (``cos[..., :w/2].repeat_interleave(2)``,
            # the residual stream's dtype) which the rotary muls save; head_dim 128 by default
            "glm4",
            {**{k: v for k, v in _LLAMA_LIKE.items() if k != "sliding_window"}, "vocab_size": 151552,
             "hidden_size": 4096, "intermediate_size": 13696, "num_hidden_layers": 40, "num_attention_heads": 32,
             "num_key_value_heads": 2, "head_dim": 128, "max_position_embeddings": 131072, "attention_bias": True},
            norms_per_layer=4, fused_gate_up=True, o_bias_key=None, partial_rotary_factor=0.5,
            rope_interleave_tables=True,
        ),
        Family(
            # DeepSeek-V2 / V2-Lite / Coder-V2 (DeepseekV2Config, transformers 5.24): DeepSeek-V3's
            # MLA attention (q_lora_rank null: one q_proj, as V2-Lite) with a complex rope
            # (``view_as_complex`` of fp32 copies of q_pe / k_pe times one complex64 ``freqs_cis``
            # table, cast back), and DeepSeek-V3's block layout (fused experts of
            # moe_intermediate_size, n_shared_experts shared experts fused into one MLP, the first
            # first_k_dense_replace layers dense) behind DeepSeek-V2's router: an fp32 linear (fp32
            # ``gate.weight``), an fp32 softmax, top-k of the probabilities (``greedy``) or of those
            # left in the topk_group best of n_group groups (``group_limited_greedy``), never
            # renormalised, times routed_scaling_factor. transformers maps deepseek_v2 onto
            # qwen2_moe's conversions: PEFT's all-linear wraps the experts and the router
            "deepseek_v2",
            {**{k: v for k, v in _LLAMA_LIKE.items() if k != "sliding_window"}, "vocab_size": 102400,
             "intermediate_size": 11008, "mlp_bias": False, "first_k_dense_replace": 0,
             "kv_lora_rank": 512, "q_lora_rank": 1536, "n_group": None, "n_routed_experts": 64,
             "n_shared_experts": 2, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
             "routed_scaling_factor": 1.0, "topk_group": None, "topk_method": "greedy",
             "norm_topk_prob": False, "v_head_dim": 128, "num_experts_per_tok": None,
             "moe_intermediate_size": 1407},
            moe="deepseek_v2", mla=True, mlp_bias_key="mlp_bias", mla_complex_rope=True,
        ),
        Family(
            # Cohere Command R7B / Command A (Cohere2Config, transformers 5.24): a parallel block
            # (``residual + attn(norm(x)) + mlp(norm(x))``) behind one Cohere2LayerNorm (mean-centred,
            # fp32, a weight and no bias; the final norm too); q/k/v/o biases with attention_bias;
            # layer_types sliding/full (default: every 4th layer full, ``sliding_window_pattern``),
            # the rope (fp32 copies of q / k rotated over interleaved tables and cast back) on the
            # sliding layers only: full-attention layers are NoPE; logits times ``logit_scale`` (a
            # tensor-by-scalar mul: nothing saved); head_dim: hidden // heads, unless config.json
            # gives one (Cohere2Config's __post_init__ sets the quotient, then its kwargs override it)
            "cohere2",
            {**_LLAMA_LIKE, "vocab_size": 256000,
             "hidden_size": 8192, "intermediate_size": 22528, "logit_scale": 0.0625,
             "num_hidden_layers": 40, "num_attention_heads": 64, "max_position_embeddings": 8192,
             "tie_word_embeddings": True, "sliding_window": 4096, "layer_types": None},
            norms_per_layer=1, norm_style="cohere", parallel_block=True, rope_cast_back=True,
            rope_only_sliding=True,
        ),
        Family(
            # Phi-3.5-MoE (PhimoeConfig, transformers 5.24): GQA attention (attention_bias on q/k/v/o,
            # llama's rope: the checkpoints' longrope has tables of the same shape) and an MoE block in
            # every layer: fused 3-D experts of intermediate_size behind an ``nn.Linear`` router whose
            # logits go through sparsemixer (two rounds of a masked softmax with Gumbel sampling in
            # training and PhimoeMultiplier's custom backward: always top-2), with multiplicative
            # input jitter (``input_jitter_noise``, in place, in the block and again in the router);
            # ``nn.LayerNorm`` norms with a bias; lm_head_bias. PEFT's all-linear wraps the router (an
            # nn.Linear returning a tuple: the forward fails) and not the experts: ftplan plans
            # all-linear as the attention projections
            "phimoe",
            {**_LLAMA_LIKE, "vocab_size": 32064, "intermediate_size": 6400, "num_key_value_heads": 8,
             "max_position_embeddings": 131072, "num_experts_per_tok": 2, "num_local_experts": 16,
             "router_jitter_noise": 0.01, "input_jitter_noise": 0.0, "lm_head_bias": False},
            moe="phimoe", norm_style="layernorm", norm_bias=True, lm_head_bias_key="lm_head_bias",
            peft_wraps_experts=False, peft_all_linear=False,
        ),
    ]
}

#: architectures (config "architectures") accepted for each model_type; used for clear errors.
_ARCH_TO_TYPE = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    "Gemma3ForConditionalGeneration": "gemma3_text",
    "Phi3ForCausalLM": "phi3",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "GptOssForCausalLM": "gpt_oss",
    "Glm4MoeForCausalLM": "glm4_moe",
    "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe",
    "Qwen3NextForCausalLM": "qwen3_next",
    "Olmo2ForCausalLM": "olmo2",
    "Olmo3ForCausalLM": "olmo3",
    "SmolLM3ForCausalLM": "smollm3",
    "Llama4ForCausalLM": "llama4_text",
    "Llama4ForConditionalGeneration": "llama4_text",
    "Gemma4ForCausalLM": "gemma4",
    "Gemma4ForConditionalGeneration": "gemma4",
    "Glm4MoeLiteForCausalLM": "glm4_moe_lite",
    "Mistral4ForCausalLM": "mistral4",
    "MiniMaxM2ForCausalLM": "minimax_m2",
    "Lfm2ForCausalLM": "lfm2",
    "Lfm2MoeForCausalLM": "lfm2_moe",
    "GraniteForCausalLM": "granite",
    "Ernie4_5ForCausalLM": "ernie4_5",
    "Ernie4_5_ForCausalLM": "ernie4_5",  # (the remote-code class name of the first ERNIE 4.5 configs)
    "SeedOssForCausalLM": "seed_oss",
    "GraniteMoeForCausalLM": "granitemoe",
    "OlmoeForCausalLM": "olmoe",
    "Exaone4ForCausalLM": "exaone4",
    "Dots1ForCausalLM": "dots1",
    "HunYuanDenseV1ForCausalLM": "hunyuan_v1_dense",
    "Ernie4_5_MoeForCausalLM": "ernie4_5_moe",  # (transformers' class and the remote-code one share the name)
    "GemmaForCausalLM": "gemma",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Glm4ForCausalLM": "glm4",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "Cohere2ForCausalLM": "cohere2",
    "PhiMoEForCausalLM": "phimoe",  # (the remote-code class name of the Phi-3.5-MoE configs)
    "PhimoeForCausalLM": "phimoe",
}
#: MoE families whose ``ForCausalLM.forward`` adds ``load_balancing_loss_func`` over the router
#: logits of every MoE layer when ``output_router_logits`` is set (transformers 5.24; measured on CPU:
#: tests/test_router_aux_loss.py). DeepSeek-V2/V3, GLM-4.5, Llama 4, LFM2-MoE, Gemma 4, dots.llm1
#: compute none (their configs have no such loss or their forward ignores it: 0 B measured)
ROUTER_AUX_LOSS_FAMILIES = frozenset({"mixtral", "qwen3_moe", "gpt_oss", "qwen3_5_moe", "qwen3_next", "minimax_m2",
                                      "granitemoe", "olmoe", "ernie4_5_moe", "qwen2_moe", "phimoe"})
#: text model_types that name a family under another key (the inner type of a multimodal config)
_TEXT_TYPE_ALIASES = {"qwen3_5_text": "qwen3_5", "qwen3_5_moe_text": "qwen3_5_moe", "llama4": "llama4_text",
                      "gemma4_text": "gemma4"}

#: model_type values transformers does not know whose checkpoints load with ``trust_remote_code``
#: into a supported architecture's modeling code: planned as that architecture. Kimi K2 (and the
#: text model of Kimi K2.5): config.json says model_type "kimi_k2", architectures
#: ["DeepseekV3ForCausalLM"], and the repo's configuration_deepseek.py / modeling_deepseek.py are
#: DeepSeek-V3's (DeepseekV3Config, DeepseekV3ForCausalLM).
MODEL_TYPE_ALIASES = {"kimi_k2": "deepseek_v3"}


def planned_as_note(raw: Mapping[str, Any] | None) -> str | None:
    """One line for an answer whose config's model_type is planned as another architecture
    (:data:`MODEL_TYPE_ALIASES`), else None."""
    if not isinstance(raw, Mapping):
        return None
    inner = raw.get("text_config")
    mt = (inner if isinstance(inner, Mapping) else raw).get("model_type")
    target = MODEL_TYPE_ALIASES.get(mt) if isinstance(mt, str) else None
    if target is None:
        return None
    arch = next((a for a, t in _ARCH_TO_TYPE.items() if t == target), target)
    return (f"config model_type {mt!r} (remote code, which transformers does not know) is planned as the "
            f"{arch} architecture ({target}) its checkpoint declares and its modeling code implements")


def unmodelled_dropout_note(family: str, raw: Mapping[str, Any] | None) -> str | None:
    """One line when the config asks for attention dropout in a family whose dropout ftplan does
    not plan (:attr:`Family.dropout_keys` None), else None. transformers passes
    ``config.attention_dropout`` to the attention kernel in training in these families too."""
    fam = FAMILIES.get(family)
    if fam is None or fam.dropout_keys is not None or not isinstance(raw, Mapping):
        return None
    inner = raw.get("text_config")
    p = (inner if isinstance(inner, Mapping) else raw).get("attention_dropout")
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p < 1:
        return None
    return (f"config attention_dropout {p:g} is planned as 0: the sdpa / flash kernels on CUDA keep only an "
            "RNG state for it, but eager attention also keeps the probabilities' dropout mask (not counted); "
            "set it to 0 in config.json to train without")


# --------------------------------------------------------------------------------------------
# Typed structure
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttentionSpec:
    num_heads: int
    num_kv_heads: int
    head_dim: int  # q/k head dim (MLA: qk_nope + qk_rope)
    v_head_dim: int
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    fused_qkv: bool = False
    softcap: float | None = None
    sinks: bool = False  # one learned sink logit per head (gpt_oss)
    #: features of each head the rotary embedding turns (partial rotary, glm4_moe); None: all
    rotary_dim: int | None = None
    #: gated attention (qwen3_5): q_proj emits ``heads * head_dim`` query features and as many
    #: gate features (per head ``[query | gate]``); ``attn_output * sigmoid(gate)`` feeds o_proj
    output_gate: bool = False
    #: the q/k norms cover the whole projection (olmo2: weights of ``heads * head_dim`` and
    #: ``kv_heads * head_dim``, one rsqrt per token), not each head
    qk_norm_whole: bool = False
    #: Llama 4 (llama4_text): ``rope`` False on a NoPE layer (no rotary embedding);
    #: ``l2_qk_norm``: a weightless L2 norm (``Llama4TextL2Norm``) on q and k after the rope;
    #: ``temperature_tuning``: the NoPE layer scales q by ``log1p(floor((pos + 1) / floor_scale))
    #: * attn_scale + 1``; ``complex_rope``: the rope runs through ``view_as_complex`` in fp32;
    #: ``chunk``: chunked local attention (``attention_chunk_size``: each query attends to the
    #: earlier keys of its own chunk of that many positions), None for a full causal row
    rope: bool = True
    l2_qk_norm: bool = False
    temperature_tuning: bool = False
    complex_rope: bool = False
    chunk: int | None = None
    #: gemma4 full-attention layers with ``attention_k_eq_v``: no v_proj, v is k_proj's output
    #: (before k_norm and rope)
    k_eq_v: bool = False
    #: gemma4: a weightless RMSNorm on v (``v_norm``, ``with_scale=False``)
    v_norm: bool = False
    # MLA (DeepSeek-V3); None for standard multi-/grouped-query attention
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    #: llama-4 attention scaling (mistral4): the query is multiplied by a per-position
    #: ``(rows, 1, s, 1)`` scale ``1 + beta * log(1 + floor(pos / original_max))`` before the
    #: kernel, which the product keeps for the query's gradient
    query_pos_scale: bool = False
    #: the output projection's module name (lfm2: ``out_proj``)
    o_name: str = "o_proj"
    #: dropout in training (seed_oss): on the attention probabilities (``attention_dropout``) and
    #: on o_proj's output (``residual_dropout``)
    dropout: float = 0.0
    out_dropout: float = 0.0

    @property
    def head_major_q(self) -> bool:
        """q reaches the attention kernel as a contiguous head-major ``(b, heads, s, d)`` tensor:
        sliced from a fused qkv projection (phi3) or the ``torch.cat`` of a partial rotary's
        rotated and passed-through halves (glm4_moe). The CPU sdpa kernel then writes its output
        head-major too, and ``transpose(1, 2).contiguous()`` makes o_proj's input a separate copy
        (a full-rotary q keeps the projection's ``(b, s, heads, d)`` layout through RoPE's
        elementwise ops, and the copy is a no-op)."""
        return self.fused_qkv or self.rotary_dim is not None

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def qk_norm_sizes(self) -> tuple[int, int]:
        """Weights of the q and k norms: ``head_dim`` each (per-head norms), or the whole
        projections' widths (``qk_norm_whole``)."""
        if self.qk_norm_whole:
            return self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return self.head_dim, self.head_dim


@dataclass(frozen=True)
class GatedDeltaNetSpec:
    """A Gated DeltaNet token mixer (qwen3_5 ``linear_attention`` layers, transformers'
    ``Qwen3_5GatedDeltaNet``): ``in_proj_qkv`` (q and k of ``num_k_heads x k_head_dim`` each, v of
    ``num_v_heads x v_head_dim``), ``in_proj_z`` (the output gate, value-wide), ``in_proj_b`` /
    ``in_proj_a`` (one beta and one decay input per value head), a depthwise causal ``Conv1d`` of
    ``conv_kernel`` taps over the q/k/v channels (no bias), ``dt_bias`` and ``A_log`` (one per value
    head), a gated RMSNorm over ``v_head_dim`` (one weight shared by all heads) and ``out_proj``.
    Its recurrent state is ``k_head_dim x v_head_dim`` per value head; the chunked delta rule runs
    on ``chunk_size``-token chunks (the sequence is padded to a multiple of it).

    ``fused_proj`` (qwen3_next's ``Qwen3NextGatedDeltaNet``): the same weights as two linears,
    ``in_proj_qkvz`` (q, k, v and z) and ``in_proj_ba`` (b and a)."""

    num_k_heads: int
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int
    conv_kernel: int
    chunk_size: int = 64
    fused_proj: bool = False

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.k_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.v_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the depthwise convolution: q, k and v."""
        return 2 * self.key_dim + self.value_dim

    @property
    def vector_params(self) -> int:
        """Parameters outside the linears and the norm: conv weight, dt_bias, A_log."""
        return self.conv_dim * self.conv_kernel + 2 * self.num_v_heads


@dataclass(frozen=True)
class ShortConvSpec:
    """LFM2's gated short convolution (``conv`` layers, transformers' ``Lfm2ShortConv``):
    ``in_proj`` (hidden -> 3 x hidden, chunked into the gates B and C and the value x), ``B * x``
    through a depthwise causal ``Conv1d`` of ``conv_kernel`` taps (``conv_L_cache``) over the
    hidden channels, ``C *`` its output, ``out_proj`` (hidden -> hidden). ``bias``
    (``conv_bias``): the conv and both linears carry biases. No norm, no rope, no KV inside."""

    conv_kernel: int
    bias: bool = False

    def vector_params(self, h: int) -> int:
        """Parameters outside the linears: the conv weight ``(h, 1, K)`` (and its bias)."""
        return h * self.conv_kernel + (h if self.bias else 0)


@dataclass(frozen=True)
class MlpSpec:
    intermediate_size: int
    bias: bool = False
    fused_gate_up: bool = False
    #: module names of the gate, up and down projections (lfm2: w1, w3, w2)
    names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    #: dropout on down_proj's output in training (seed_oss: ``residual_dropout``)
    out_dropout: float = 0.0


@dataclass(frozen=True)
class MoeSpec:
    num_experts: int
    top_k: int
    expert_intermediate_size: int
    shared: MlpSpec | None = None  # shared experts, run on every token
    #: router implementation (the family's): "mixtral"/"qwen3_moe" softmax in fp32, "deepseek_v3"
    #: sigmoid in the logits' dtype, "mistral4" softmax in the compute dtype (a plain linear, no
    #: fp32 weight), "lfm2_moe" a sigmoid there (the same bytes saved); qwen3_moe casts the top-k
    #: weights back to the logits' dtype;
    #: "gpt_oss" takes the top-k logits first and softmaxes only those, in the logits' dtype;
    #: "granitemoe" does that on an fp32 copy of the logits and casts the weights back
    router: str = "mixtral"
    #: the router weight stays fp32 whatever the model's dtype: transformers >= 5.24 lists
    #: ``gate.weight`` in the family's ``_keep_in_fp32_modules_strict`` (deepseek_v3)
    router_fp32: bool = False
    #: routed experts and the router carry biases (gpt_oss: ``gate_up_proj_bias``,
    #: ``down_proj_bias``, ``router.bias``)
    bias: bool = False
    #: the shared expert's output is scaled per token by ``sigmoid(shared_expert_gate(x))``, a
    #: bias-free ``nn.Linear(hidden, 1)`` (qwen3_5_moe, qwen3_next)
    shared_gate: bool = False
    #: a softmax router divides its top-k probabilities by their sum (qwen3_moe's and qwen3_next's
    #: ``norm_topk_prob``; mixtral's and qwen3_5_moe's always do)
    renormalize: bool = True
    #: Llama 4 (``Llama4TextMoe``): every token goes through every expert (``hidden.repeat(E, 1)``
    #: scaled row-wise by the sigmoid router scores, 0 outside the top-k, then one batched
    #: ``bmm`` per projection): compute and saved activations scale with ``num_experts``, not
    #: ``top_k``; the scores scale the experts' *input*
    dense_dispatch: bool = False
    #: the router's ``e_score_correction_bias`` (one per expert, fp32) is an ``nn.Parameter`` with
    #: ``requires_grad=False`` (ernie4_5_moe), not a buffer: counted in the parameters (router),
    #: stored in fp32 whatever the model's dtype, never trained
    frozen_bias_param: bool = False
    #: deepseek_v2's ``group_limited_greedy``: the router zeroes the experts outside the
    #: topk_group best groups (``masked_fill``, which keeps its bool mask) before the top-k
    group_limited: bool = False
    #: phimoe's ``input_jitter_noise`` > 0: the MoE block and its router each multiply their input
    #: in place by a fresh uniform tensor in training
    input_jitter: bool = False

    @property
    def computed_experts(self) -> int:
        """Experts each token's activations go through in transformers' forward: ``top_k``, or
        every expert under :attr:`dense_dispatch`."""
        return self.num_experts if self.dense_dispatch else self.top_k

    @property
    def router_autocast(self) -> bool:
        """The router's matmul runs under the forward's autocast, which keeps a compute-dtype copy of
        its weight; ernie4_5_moe's router turns autocast off and multiplies in fp32 (no copy)."""
        return self.router != "ernie4_5_moe"

    @property
    def router_is_module(self) -> bool:
        """gemma4's router: an ``nn.Linear`` (``router.proj``, hidden -> experts, which PEFT's
        ``all-linear`` wraps) after a weightless RMSNorm and a learned hidden-size ``scale``,
        with a learned ``per_expert_scale`` on the top-k weights (two vectors more per layer)."""
        return self.router == "gemma4"


@dataclass(frozen=True)
class LayerGroup:
    """``count`` identical decoder layers.

    The token mixer is ``attention`` (softmax attention) or, in a hybrid model's linear-attention
    layers (qwen3_5), ``linear_attention`` with ``attention`` None: exactly one of them is set."""

    count: int
    attention: AttentionSpec | None
    mlp: MlpSpec | None  # dense MLP (None for MoE layers)
    moe: MoeSpec | None
    norms_per_layer: int
    window: int | None = None  # sliding-window size, None for full attention
    linear_attention: GatedDeltaNetSpec | None = None
    #: LFM2's ``conv`` layers: a gated short convolution as the token mixer (``attention`` None)
    short_conv: ShortConvSpec | None = None

    @property
    def is_linear(self) -> bool:
        """A layer without softmax attention (no KV, no rope): a Gated DeltaNet or LFM2's short
        convolution."""
        return self.linear_attention is not None or self.short_conv is not None


@dataclass(frozen=True)
class LinearSpec:
    """A weight matrix kind, ``count`` times in the model.

    ``module`` is the leaf name PEFT matches (``q_proj``, ``gate_up_proj``...). Routed experts in
    transformers 5 are fused 3-D parameters, not ``nn.Linear`` modules: ``is_module`` is False for
    them, so PEFT's ``all-linear`` and bitsandbytes' 4-bit replacement do not touch them.
    """

    module: str
    in_features: int
    out_features: int
    count: int
    bias: bool
    category: str
    is_module: bool = True
    #: fraction of tokens that go through this weight (routed experts: top_k / num_experts)
    token_fraction: float = 1.0
    #: fraction of this weight a token *uses* when that differs from the compute's
    #: ``token_fraction`` (Llama 4's experts: every token is computed through every expert, a
    #: token's output uses its top-k): for ``ParamCounts.active``
    active_fraction: float | None = None

    @property
    def params(self) -> int:
        return self.count * (self.in_features * self.out_features + (self.out_features if self.bias else 0))


@dataclass(frozen=True)
class ParamCounts:
    embedding: int
    attention: int
    mlp: int
    experts: int
    router: int
    norms: int
    lm_head: int
    active: int  # parameters a token goes through (MoE: top_k of the routed experts)

    @property
    def total(self) -> int:
        return self.embedding + self.attention + self.mlp + self.experts + self.router + self.norms + self.lm_head

    def by_category(self) -> dict[str, int]:
        return {c: getattr(self, c) for c in CATEGORIES}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    tie_word_embeddings: bool
    groups: tuple[LayerGroup, ...]
    max_position_embeddings: int | None = None
    final_logit_softcap: float | None = None
    hf_id: str | None = None
    source: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: the hidden-size norms carry a bias (``nn.LayerNorm``: phimoe)
    norm_bias: bool = False
    #: the lm_head has a vocab-size bias (phimoe's ``lm_head_bias``)
    lm_head_bias: bool = False
    #: ``output_router_logits`` on a family whose forward then adds the load-balancing loss
    #: (:data:`ROUTER_AUX_LOSS_FAMILIES`): its softmax over every MoE layer's router logits is saved
    router_aux_loss: bool = False

    # ---- structure ----------------------------------------------------------------------
    @property
    def supports_sdpa(self) -> bool:
        """transformers has an sdpa path for this architecture: not with attention soft-capping
        (Gemma2: ``_supports_sdpa = False``, "sdpa does not support softcapping") nor attention
        sinks (gpt-oss: ``_supports_sdpa = False``), where it runs eager attention when none is
        named and refuses ``attn_implementation="sdpa"``."""
        return not any(g.attention is not None and (g.attention.softcap or g.attention.sinks) for g in self.groups)

    @property
    def is_moe(self) -> bool:
        return any(g.moe is not None for g in self.groups)

    @property
    def attention(self) -> AttentionSpec:
        """The softmax attention of the first layer group that has one (the model-level facts:
        heads, head_dim, rope width); a hybrid model's linear-attention groups have none."""
        return next(g.attention for g in self.groups if g.attention is not None)

    @property
    def attention_groups(self) -> tuple[LayerGroup, ...]:
        """The layer groups with softmax attention."""
        return tuple(g for g in self.groups if g.attention is not None)

    @property
    def is_hybrid(self) -> bool:
        """Some layers mix tokens with a linear-attention (Gated DeltaNet) layer or LFM2's short
        convolution instead of softmax attention."""
        return any(g.is_linear for g in self.groups)

    @property
    def has_gated_deltanet(self) -> bool:
        """Some layers are Gated DeltaNet layers (qwen3_5, qwen3_5_moe, qwen3_next)."""
        return any(g.linear_attention is not None for g in self.groups)

    def __hash__(self) -> int:
        # a ModelSpec keys many caches (planner memos, runtime state caches): hash its fields once
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash(tuple(getattr(self, f.name) for f in fields(self) if f.compare))
        return h

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_hash", None)  # string hashes differ between processes
        return state

    def linears(self) -> tuple[LinearSpec, ...]:
        """Every weight matrix of the decoder layers and the lm_head (embedding excluded)."""
        return self._linears

    @cached_property
    def _linears(self) -> tuple[LinearSpec, ...]:
        h = self.hidden_size
        out: list[LinearSpec] = []
        for g in self.groups:
            out.extend(mixer_linears(g, h, g.count))
            if g.mlp is not None:
                out.extend(mlp_linears(g.mlp, h, g.count, "mlp"))
            if g.moe is not None:
                m = g.moe
                frac = m.computed_experts / m.num_experts
                act = m.top_k / m.num_experts if m.dense_dispatch else None
                n = g.count * m.num_experts
                out.append(LinearSpec("gate_up_proj", h, 2 * m.expert_intermediate_size, n, m.bias,
                                      "experts", is_module=False, token_fraction=frac, active_fraction=act))
                out.append(LinearSpec("down_proj", m.expert_intermediate_size, h, n, m.bias,
                                      "experts", is_module=False, token_fraction=frac, active_fraction=act))
                if m.shared is not None:
                    out.extend(mlp_linears(m.shared, h, g.count, "mlp"))
                if m.shared_gate:
                    out.append(LinearSpec("shared_expert_gate", h, 1, g.count, False, "router"))
                if m.router_is_module:
                    out.append(LinearSpec("proj", h, m.num_experts, g.count, False, "router"))
        if not self.tie_word_embeddings:
            out.append(LinearSpec("lm_head", h, self.vocab_size, 1, self.lm_head_bias, "lm_head"))
        return tuple(out)

    @cached_property
    def params(self) -> ParamCounts:
        """Parameter counts by category (computed once per spec: it is immutable)."""
        h = self.hidden_size
        cats = dict.fromkeys(CATEGORIES, 0)
        active = 0
        for lin in self.linears():
            cats[lin.category] += lin.params
            active += round(lin.params * (lin.token_fraction if lin.active_fraction is None else lin.active_fraction))
        cats["embedding"] = self.vocab_size * h
        norms = h  # final norm
        router = 0
        for g in self.groups:
            a = g.attention
            per_layer = g.norms_per_layer * h
            if g.moe is not None and g.moe.router_is_module:  # the Linear is counted above
                router += g.count * (h + g.moe.num_experts)  # scale, per_expert_scale
            elif g.moe is not None:
                router += g.count * g.moe.num_experts * (h + (1 if g.moe.bias or g.moe.frozen_bias_param else 0))
            if g.linear_attention is not None:
                la = g.linear_attention
                norms += g.count * (per_layer + la.v_head_dim)  # + the gated RMSNorm
                cats["attention"] += g.count * la.vector_params
                active += g.count * la.vector_params
                continue
            if g.short_conv is not None:  # the conv weight (and bias); no norm inside
                norms += g.count * per_layer
                cats["attention"] += g.count * g.short_conv.vector_params(h)
                active += g.count * g.short_conv.vector_params(h)
                continue
            if a.qk_norm:
                per_layer += sum(a.qk_norm_sizes)
            if a.is_mla:
                per_layer += a.kv_lora_rank + (a.q_lora_rank or 0)
            norms += g.count * per_layer
            if a.sinks:
                cats["attention"] += g.count * a.num_heads
                active += g.count * a.num_heads
        if self.norm_bias:  # (phimoe's nn.LayerNorm: a bias beside every hidden-size weight)
            extra = h * (1 + sum(g.count * g.norms_per_layer for g in self.groups))
            norms += extra
        cats["norms"] = norms
        cats["router"] += router
        active += cats["embedding"] + norms + router
        return ParamCounts(active=active, **cats)

    def module_names(self) -> frozenset[str]:
        """Leaf module names PEFT can target (as in ``target_modules``)."""
        return self._module_names

    @cached_property
    def _module_names(self) -> frozenset[str]:
        return frozenset(lin.module for lin in self.linears() if lin.is_module)

    def summary(self) -> str:
        p = self.params
        moe = f", MoE {p.active / 1e9:.1f}B active" if self.is_moe else ""
        return f"{self.name}: {self.family}, {p.total / 1e9:.2f}B params{moe}, {self.num_layers} layers, hidden {self.hidden_size}"


def linear_attention_linears(la: GatedDeltaNetSpec, h: int, n: int) -> list[LinearSpec]:
    """A Gated DeltaNet's ``nn.Linear`` modules in registration order (out_proj first, as
    ``Qwen3_5GatedDeltaNet.__init__`` registers it; ``Qwen3NextGatedDeltaNet`` registers its fused
    in_proj_qkvz and in_proj_ba first); the depthwise Conv1d is no linear."""
    if la.fused_proj:
        return [
            LinearSpec("in_proj_qkvz", h, la.conv_dim + la.value_dim, n, False, "attention"),
            LinearSpec("in_proj_ba", h, 2 * la.num_v_heads, n, False, "attention"),
            LinearSpec("out_proj", la.value_dim, h, n, False, "attention"),
        ]
    return [
        LinearSpec("out_proj", la.value_dim, h, n, False, "attention"),
        LinearSpec("in_proj_qkv", h, la.conv_dim, n, False, "attention"),
        LinearSpec("in_proj_z", h, la.value_dim, n, False, "attention"),
        LinearSpec("in_proj_b", h, la.num_v_heads, n, False, "attention"),
        LinearSpec("in_proj_a", h, la.num_v_heads, n, False, "attention"),
    ]


def short_conv_linears(sc: ShortConvSpec, h: int, n: int) -> list[LinearSpec]:
    """LFM2's short convolution's ``nn.Linear`` modules in registration order (after the Conv1d):
    ``in_proj`` (B, C, x) and ``out_proj``."""
    return [LinearSpec("in_proj", h, 3 * h, n, sc.bias, "attention"),
            LinearSpec("out_proj", h, h, n, sc.bias, "attention")]


def mixer_linears(g: LayerGroup, h: int, n: int) -> list[LinearSpec]:
    """The token mixer's linears of group ``g`` (attention, Gated DeltaNet or LFM2's short
    convolution), ``n`` of each."""
    if g.linear_attention is not None:
        return linear_attention_linears(g.linear_attention, h, n)
    if g.short_conv is not None:
        return short_conv_linears(g.short_conv, h, n)
    assert g.attention is not None
    return attention_linears(g.attention, h, n)


def attention_linears(a: AttentionSpec, h: int, n: int) -> list[LinearSpec]:
    if a.is_mla:
        out = []
        qk = a.num_heads * a.head_dim
        if a.q_lora_rank:
            out.append(LinearSpec("q_a_proj", h, a.q_lora_rank, n, a.qkv_bias, "attention"))
            out.append(LinearSpec("q_b_proj", a.q_lora_rank, qk, n, False, "attention"))
        else:
            out.append(LinearSpec("q_proj", h, qk, n, False, "attention"))
        out.append(LinearSpec("kv_a_proj_with_mqa", h, a.kv_lora_rank + a.qk_rope_head_dim, n,
                              a.qkv_bias, "attention"))
        nope = a.head_dim - a.qk_rope_head_dim
        out.append(LinearSpec("kv_b_proj", a.kv_lora_rank, a.num_heads * (nope + a.v_head_dim), n,
                              False, "attention"))
        out.append(LinearSpec("o_proj", a.num_heads * a.v_head_dim, h, n, a.o_bias, "attention"))
        return out
    q = a.num_heads * a.head_dim
    kv = a.num_kv_heads * a.head_dim
    if a.output_gate:
        q *= 2  # [query | gate] per head
    if a.fused_qkv:
        out = [LinearSpec("qkv_proj", h, q + 2 * kv, n, a.qkv_bias, "attention")]
    else:
        out = [
            LinearSpec("q_proj", h, q, n, a.qkv_bias, "attention"),
            LinearSpec("k_proj", h, kv, n, a.qkv_bias, "attention"),
        ]
        if not a.k_eq_v:
            out.append(LinearSpec("v_proj", h, kv, n, a.qkv_bias, "attention"))
    out.append(LinearSpec(a.o_name, a.num_heads * a.v_head_dim, h, n, a.o_bias, "attention"))
    return out


def mlp_linears(m: MlpSpec, h: int, n: int, category: str) -> list[LinearSpec]:
    i = m.intermediate_size
    gate, up_name, down = m.names
    if m.fused_gate_up:
        up = [LinearSpec("gate_up_proj", h, 2 * i, n, m.bias, category)]
    else:
        up = [LinearSpec(gate, h, i, n, m.bias, category),
              LinearSpec(up_name, h, i, n, m.bias, category)]
    return up + [LinearSpec(down, i, h, n, m.bias, category)]


_attention_linears, _mlp_linears = attention_linears, mlp_linears  # their names before they were public


#: a decoder layer's projections that read its (normed) input: with a frozen embedding (LoRA,
#: QLoRA) the first layer's read an input that needs no gradient (memory.py's activation formulas
#: and sharding.py's ZeRO-3 release rule both use this set)
LAYER_INPUT_PROJECTIONS = frozenset({"q_proj", "k_proj", "v_proj", "qkv_proj", "q_a_proj", "kv_a_proj_with_mqa",
                                     "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a",
                                     "in_proj_qkvz", "in_proj_ba", "in_proj"})  # (in_proj: lfm2's short conv)


def layer_linears(model: ModelSpec, g: LayerGroup) -> list[LinearSpec]:
    """One decoder layer's ``nn.Linear`` modules of group ``g`` in registration order (attention,
    dense MLP or the shared expert's MLP), one of each; routed experts are fused 3-D parameters,
    not linears."""
    out = mixer_linears(g, model.hidden_size, 1)
    if g.mlp is not None:
        out += mlp_linears(g.mlp, model.hidden_size, 1, "mlp")
    if g.moe is not None and g.moe.shared is not None:
        out += mlp_linears(g.moe.shared, model.hidden_size, 1, "mlp")
    if g.moe is not None and g.moe.shared_gate:
        out.append(LinearSpec("shared_expert_gate", model.hidden_size, 1, 1, False, "router"))
    if g.moe is not None and g.moe.router_is_module:  # gemma4's router.proj
        out.append(LinearSpec("proj", model.hidden_size, g.moe.num_experts, 1, False, "router"))
    return out


# --------------------------------------------------------------------------------------------
# From config.json
# --------------------------------------------------------------------------------------------
#: Sanity bounds on config.json sizes. They are validation limits, not physical constants: each is
#: at least 8x the largest value in any published causal-LM config (e.g. hidden 16384 and 126 layers
#: for Llama 3.1 405B, vocab 262144 for Gemma 3, 384 experts for Kimi K2, 10M context for
#: Llama 4 Scout), and low enough that a typo or a hostile file cannot make ftplan build numbers or
#: structures that take minutes or gigabytes (``num_hidden_layers: 1e9``).
CONFIG_LIMITS: dict[str, int] = {
    "hidden_size": 1 << 17,
    "intermediate_size": 1 << 20,
    "moe_intermediate_size": 1 << 20,
    "shared_expert_intermediate_size": 1 << 20,
    "num_hidden_layers": 4096,
    "num_attention_heads": 4096,
    "num_key_value_heads": 4096,
    "head_dim": 8192,
    "vocab_size": 1 << 24,
    "num_local_experts": 1 << 16,
    "num_experts": 1 << 16,
    "n_routed_experts": 1 << 16,
    "num_experts_per_tok": 1 << 16,
    "n_shared_experts": 1024,
    "q_lora_rank": 1 << 17,
    "kv_lora_rank": 1 << 17,
    "qk_nope_head_dim": 8192,
    "qk_rope_head_dim": 8192,
    "v_head_dim": 8192,
    "max_position_embeddings": 1 << 30,
    "sliding_window": 1 << 31,
    "sliding_window_pattern": 4096,
    "max_window_layers": 4096,
    "decoder_sparse_step": 4096,
    "first_k_dense_replace": 4096,
    "linear_num_key_heads": 4096,
    "linear_num_value_heads": 4096,
    "linear_key_head_dim": 8192,
    "linear_value_head_dim": 8192,
    "linear_conv_kernel_dim": 1024,
    "full_attention_interval": 4096,
    "intermediate_size_mlp": 1 << 20,
    "interleave_moe_layer_step": 4096,
    "no_rope_layer_interval": 4096,
    "attention_chunk_size": 1 << 31,
    "conv_L_cache": 1024,
    "moe_num_experts": 1 << 16,  # (ernie4_5_moe's names)
    "moe_k": 1 << 16,
    "moe_num_shared_experts": 1024,
    "moe_layer_start_index": 4096,
    "moe_layer_end_index": 4096,
    "moe_layer_interval": 4096,
    "block_multiple_of": 1 << 20,
}
#: largest logit soft-capping value accepted (published: 30 and 50)
_MAX_SOFTCAP = 1e6
_LAYER_TYPES = ("sliding_attention", "full_attention")


class _Check:
    """Collects every problem of a config; typed getters return a safe value even when wrong."""

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        self.cfg = cfg
        self.problems: list[str] = []

    def bad(self, msg: str) -> None:
        if msg not in self.problems:  # (a rule read twice reports once)
            self.problems.append(msg)

    def int(self, key: str, *, minimum: int = 1, optional: bool = False, zero_is_none: bool = False) -> int | None:
        v = self.cfg.get(key)
        if v is None and optional:
            return None
        if zero_is_none and v == 0 and not isinstance(v, bool):
            return None
        hi = CONFIG_LIMITS.get(key)
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer() and math.isfinite(v):
                self.bad(f"{key} must be an integer, got the float {v!r}")
            else:
                self.bad(f"{key} must be an integer >= {minimum}, got {_show(v)}")
            return None
        if v < minimum:
            self.bad(f"{key} must be >= {minimum}, got {v}")
            return None
        if hi is not None and v > hi:
            self.bad(f"{key} = {_show(v)} is implausibly large (at most {hi:,})")
            return None
        return v

    def bool(self, key: str) -> bool:
        v = self.cfg.get(key)
        if v is None:
            return False
        if not isinstance(v, bool):
            self.bad(f"{key} must be true or false, got {_show(v)}")
            return False
        return v

    def number(self, key: str, *, maximum: float) -> float | None:
        v = self.cfg.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 < v <= maximum:
            self.bad(f"{key} must be a number in (0, {maximum:g}] or null, got {_show(v)}")
            return None
        return float(v)


def _show(v: Any) -> str:
    if isinstance(v, str):
        return repr(v if len(v) <= 40 else v[:40] + "...")
    if isinstance(v, (list, dict)):
        return f"a {'list' if isinstance(v, list) else 'JSON object'}"
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**15:
        return f"{float(v):.3g}" if abs(v) < 10**300 else f"an integer of about {int(v.bit_length() * 0.30103)} digits"
    return repr(v)


def text_config(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The language-model part of a config (multimodal Gemma 3 keeps it in ``text_config``)."""
    if not isinstance(raw, Mapping):
        raise ConfigError("config.json must be a JSON object", "pass a Hugging Face config.json")
    cfg = dict(raw)
    outer_mt = cfg.get("model_type")
    if not isinstance(outer_mt, (str, type(None))):
        raise ConfigError(f"config.json: model_type must be a string, got {_show(outer_mt)}",
                          "pass a Hugging Face config.json of a causal LM")
    if "text_config" in cfg and isinstance(cfg["text_config"], Mapping):
        inner = dict(cfg["text_config"])
        mt = inner.get("model_type") or {"gemma3": "gemma3_text", "qwen3_5": "qwen3_5",
                                             "qwen3_5_moe": "qwen3_5_moe",
                                             "llama4": "llama4_text", "gemma4": "gemma4"}.get(outer_mt or "", "")
        if isinstance(mt, str):
            mt = _TEXT_TYPE_ALIASES.get(mt, mt)
            mt = MODEL_TYPE_ALIASES.get(mt, mt)
        inner["model_type"] = mt
        return inner
    mt = outer_mt
    if mt in _TEXT_TYPE_ALIASES:
        cfg["model_type"] = _TEXT_TYPE_ALIASES[mt]
    if mt in MODEL_TYPE_ALIASES:
        cfg["model_type"] = MODEL_TYPE_ALIASES[mt]
    if mt == "gemma3":  # a gemma3 config without text_config: the text defaults apply
        cfg["model_type"] = "gemma3_text"
    if not mt:
        archs = cfg.get("architectures")
        for arch in archs if isinstance(archs, list) else []:
            if isinstance(arch, str) and arch in _ARCH_TO_TYPE:
                cfg["model_type"] = _ARCH_TO_TYPE[arch]
                break
    return cfg


#: config keys whose explicit null transformers keeps as None (the config class does not put its
#: default back): Mistral-7B-v0.3's ``"sliding_window": null`` is no window, not MistralConfig's
#: 4096; Llama4TextConfig's null ``attention_chunk_size`` turns chunked attention off; an MLA
#: config's null ``q_lora_rank`` is a plain q_proj, no low-rank q (DeepseekV3Config, Glm4MoeLiteConfig,
#: Mistral4Config keep None)
_NULL_IS_A_VALUE = frozenset({"sliding_window", "attention_chunk_size", "q_lora_rank"})
#: families whose transformers 5.24 config class types head_dim as an int with a non-None
#: default and refuses an explicit null (StrictDataclassFieldValidationError), held by
#: tests/test_head_dim_null.py
_HEAD_DIM_NULL_REFUSED = frozenset({"qwen3", "gemma2", "gemma3_text", "gpt_oss", "qwen3_5", "qwen3_5_moe",
                                    "qwen3_next", "llama4_text", "gemma4", "minimax_m2"})
_HEAD_DIM_NULL_REFUSED |= {"gemma", "glm4"}  # (GemmaConfig, Glm4Config: head_dim int = 256 / 128)


def _with_defaults(fam: Family, cfg0: Mapping[str, Any]) -> dict[str, Any]:
    """The family's defaults overlaid with the config's values (a missing key, or a null outside
    ``_NULL_IS_A_VALUE``, takes the default)."""
    return {**fam.defaults, **{k: v for k, v in cfg0.items()
                               if v is not None or k not in fam.defaults or k in _NULL_IS_A_VALUE}}


def model_from_config(
    raw: Mapping[str, Any],
    *,
    name: str | None = None,
    hf_id: str | None = None,
    source: str | None = None,
) -> ModelSpec:
    """Build a ``ModelSpec`` from a Hugging Face ``config.json`` dict (never runs remote code).

    Every field ftplan reads is checked (type, range, consistency); all problems are reported
    together in one ``ConfigError``. Work is proportional to the number of distinct layer types,
    not to ``num_hidden_layers``.
    """
    from .inputs import MAX_NESTING, nesting_depth

    if isinstance(raw, Mapping) and nesting_depth(raw, MAX_NESTING) > MAX_NESTING:
        raise ConfigError(f"config.json is nested deeper than {MAX_NESTING} levels",
                          "pass a Hugging Face config.json")
    cfg0 = text_config(raw)
    mt = cfg0.get("model_type")
    if not mt:
        raise ConfigError("config.json has no 'model_type'", "pass a Hugging Face config.json of a causal LM")
    if not isinstance(mt, str):
        raise ConfigError(f"config.json: model_type must be a string, got {_show(mt)}",
                          "pass a Hugging Face config.json of a causal LM")
    fam = FAMILIES.get(mt)
    if fam is None:
        raise ConfigError(
            f"unsupported architecture model_type={_show(mt)}",
            f"supported: {', '.join(sorted(FAMILIES))}",
        )
    cfg = _with_defaults(fam, cfg0)
    # keys whose None means "use the default" in transformers
    for k in ("num_key_value_heads", "head_dim"):
        if cfg0.get(k) is None:
            cfg[k] = fam.defaults.get(k)
    # an explicit "head_dim": null is hidden_size // num_attention_heads where the config class
    # takes it (Ernie4_5Config, SeedOssConfig: ``head_dim if not None else hidden // heads``; the
    # classes whose default is None anyway); the strict classes of _HEAD_DIM_NULL_REFUSED refuse it
    if "head_dim" in cfg0 and cfg0["head_dim"] is None:
        cfg["head_dim"] = None
    if fam.short_conv:
        # Lfm2Config.__post_init__: config.json's block_ff_dim and tie_embedding (LFM2's own
        # names) override intermediate_size and tie_word_embeddings
        for old, new in (("block_ff_dim", "intermediate_size"), ("tie_embedding", "tie_word_embeddings")):
            if old in cfg0 and (fam.block_ff_dim or old == "tie_embedding"):  # (Lfm2MoeConfig: tie_embedding only)
                cfg[new] = cfg0[old]

    c = _Check(cfg)
    if mt in _HEAD_DIM_NULL_REFUSED and "head_dim" in cfg0 and cfg0["head_dim"] is None:
        c.bad(f"head_dim is null: transformers' {mt} config class requires an integer (it refuses the "
              "config); give head_dim or leave the key out for the default")
    if mt == "hunyuan_v1_dense" and cfg0.get("head_dim") is None:
        c.bad("head_dim is required for hunyuan_v1_dense (HunYuanDenseV1Config's default is None, which "
              "HunYuanDenseV1Attention uses as the head width: transformers fails)")
    if mt == "dots1":  # Dots1Config keeps a null; Dots1TopkRouter then divides by None
        for k in ("n_group", "topk_group"):
            if k in cfg0 and cfg0[k] is None:
                c.bad(f"{k} is null: transformers' Dots1TopkRouter divides by it and fails; give 1 (no group limit)")
    if mt == "cohere2" and not cfg.get("sliding_window"):
        c.bad("sliding_window is null: transformers' Cohere2Model builds a sliding-window mask every forward and "
              "fails without one; give the window (Command R7B / A: 4096)")
    h = c.int("hidden_size")
    n_layers = c.int("num_hidden_layers")
    vocab = c.int("vocab_size")
    heads = c.int("num_attention_heads")
    kv_heads = c.int("num_key_value_heads", optional=True)
    head_dim = c.int("head_dim", optional=True, zero_is_none=True)  # transformers: `head_dim or h // heads`
    # (qwen3_5_moe: every layer is MoE; Qwen3_5MoeTextConfig has no intermediate_size)
    inter = c.int("intermediate_size", optional=fam.moe == "qwen3_5_moe")
    tie = c.bool("tie_word_embeddings")
    qkv_bias = fam.always_qkv_bias or bool(fam.qkv_bias_key and c.bool(fam.qkv_bias_key))
    o_bias = bool(fam.o_bias_key and c.bool(fam.o_bias_key))
    mlp_bias = bool(fam.mlp_bias_key and c.bool(fam.mlp_bias_key))
    softcap = c.number("attn_logit_softcapping", maximum=_MAX_SOFTCAP)
    final_softcap = c.number("final_logit_softcapping", maximum=_MAX_SOFTCAP)
    mpe = c.int("max_position_embeddings", optional=True)
    qk_norm = fam.qk_norm or bool(fam.qk_norm_key and c.bool(fam.qk_norm_key))
    prf = _partial_rotary_factor(fam, c)
    attn_p, resid_p = (_probability(c, k) for k in fam.dropout_keys) if fam.dropout_keys else (0.0, 0.0)
    if heads is not None and kv_heads is not None and heads % kv_heads:
        c.bad(f"num_key_value_heads={kv_heads} must divide num_attention_heads={heads}")
    if head_dim is None and h is not None and heads is not None and heads > h:
        c.bad(f"num_attention_heads={heads} exceeds hidden_size={h} (head_dim would be 0); give head_dim")
    mla = _mla_fields(c) if fam.mla else None
    if mla is not None and prf not in (None, 1.0):
        c.bad(f"partial_rotary_factor={prf}: transformers' MLA attention rotates all qk_rope_head_dim "
              "features and fails on narrower rope tables (only 1.0 runs)")
    linear = _linear_attention_spec(c, fam.gdn_fused_proj) if fam.hybrid_linear else None
    conv = _short_conv_spec(c) if fam.short_conv else None
    plan = _layer_plan(fam, c, n_layers or 1)
    if fam.nope_layers:
        _nope_rule(c, n_layers or 1)  # (validates no_rope_layers)
    moe = _moe_spec(fam, c, plan.any_moe)
    if mt == "phimoe":
        _phimoe_checks(c)
    g4 = _gemma4_fields(c, heads) if fam.gemma4 else None
    if c.problems:
        n = len(c.problems)
        raise ConfigError(f"config.json ({mt}): {n} problem{'s' if n > 1 else ''}: " + "; ".join(c.problems),
                          "fix the model's config.json")
    assert h is not None and n_layers is not None and vocab is not None and heads is not None
    assert inter is not None or fam.moe == "qwen3_5_moe"
    if fam.gemma4:
        _gemma4_refusals(c.cfg, mt)
    if mt == "olmoe":
        _olmoe_refusals(c.cfg, h, heads, head_dim)
    if mt in ("gemma", "qwen2_moe"):
        _gemma_qwen2_moe_refusals(c.cfg, mt)

    if mla is not None:
        nope, rope, v_dim, kv_rank, q_rank = mla
        bias = c.bool("attention_bias")
        attn = AttentionSpec(
            num_heads=heads, num_kv_heads=heads, head_dim=nope + rope, v_head_dim=v_dim,
            qkv_bias=bias, o_bias=bias, q_lora_rank=q_rank, kv_lora_rank=kv_rank, qk_rope_head_dim=rope,
            query_pos_scale=mt == "mistral4", complex_rope=fam.mla_complex_rope,
        )
    else:
        hd = head_dim or h // heads
        attn = AttentionSpec(
            num_heads=heads, num_kv_heads=kv_heads or heads, head_dim=hd, v_head_dim=hd,
            qkv_bias=qkv_bias, o_bias=o_bias, qk_norm=qk_norm, fused_qkv=fam.fused_qkv,
            softcap=softcap, sinks=fam.attention_sinks,
            rotary_dim=int(hd * prf) if prf is not None else None, output_gate=fam.output_gate,
            qk_norm_whole=fam.qk_norm_whole and qk_norm,
            v_norm=fam.gemma4, o_name=fam.o_proj_name, dropout=attn_p, out_dropout=resid_p,
        )
    if fam.block_ff_dim and inter is not None:
        inter = _lfm2_ff_dim(c, inter)
    mlp = MlpSpec(inter or 0, bias=mlp_bias, fused_gate_up=fam.fused_gate_up, names=fam.mlp_names,
                  out_dropout=resid_p)
    if fam.moe == "llama4":  # dense layers use intermediate_size_mlp (intermediate_size: experts)
        mlp = MlpSpec(c.int("intermediate_size_mlp") or 0)
    groups = tuple(
        LayerGroup(count, None if is_linear else _variant_attention(attn, variant, c, fam),
                   None if is_moe else mlp, moe if is_moe else None,
                   fam.norms_per_layer, window, linear if is_linear else None,
                   conv if is_linear else None)
        for count, window, is_moe, is_linear, variant in _layer_kinds(plan, n_layers)
    )
    if g4 is not None:
        groups = _gemma4_groups(groups, g4, mlp)
    if c.problems:
        raise ConfigError(f"config.json ({mt}): " + "; ".join(c.problems), "fix the model's config.json")
    if not any(g.attention is not None for g in groups):
        raise ConfigError(f"config.json ({mt}): no full_attention layer",
                          "ftplan plans hybrid models with at least one softmax-attention layer")
    return ModelSpec(
        name=name or hf_id or mt,
        family=mt,
        hidden_size=h,
        num_layers=n_layers,
        vocab_size=vocab,
        tie_word_embeddings=tie,
        groups=groups,
        max_position_embeddings=mpe,
        final_logit_softcap=final_softcap,
        hf_id=hf_id,
        source=source,
        config=dict(raw),
        norm_bias=fam.norm_bias,
        lm_head_bias=bool(fam.lm_head_bias_key and c.bool(fam.lm_head_bias_key)),
        router_aux_loss=bool(mt in ROUTER_AUX_LOSS_FAMILIES and c.cfg.get("output_router_logits")),
    )


def _probability(c: _Check, key: str) -> float:
    """A dropout probability of the config, in [0, 1); one problem when it is not."""
    v = c.cfg.get(key)
    if v is None:
        return 0.0
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v < 1:
        c.bad(f"{key} must be a number in [0, 1), got {_show(v)}")
        return 0.0
    return float(v)


def _variant_attention(attn: AttentionSpec, variant: Any, c: _Check, fam: Family) -> AttentionSpec:
    """The attention of a layer kind (llama4_text: ``variant`` = ``(rope, chunked)``)."""
    if variant is None:
        return attn
    rope, chunked = variant
    if fam.nope_global_layers or fam.rope_only_sliding:  # exaone4 / cohere2: a NoPE full-attention layer
        return replace(attn, rope=rope)

    return replace(attn, rope=rope, complex_rope=rope, l2_qk_norm=rope and c.bool("use_qk_norm"),
                   temperature_tuning=not rope and bool(c.cfg.get("attn_temperature_tuning")),
                   chunk=c.int("attention_chunk_size") if chunked else None)


def _attention_variant(g: LayerGroup) -> Any:
    """The ``variant_at`` key of a group's attention (inverse of :func:`_variant_attention`)."""
    a = g.attention
    if a is None or not (a.complex_rope or not a.rope):
        return None
    return (a.rope, a.chunk is not None)


# ---- Gemma 4 --------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Gemma4Global:
    """The full-attention layers' attention shape (``Gemma4TextConfig.per_layer_config``)."""

    head_dim: int
    num_kv_heads: int | None  # None: num_key_value_heads
    k_eq_v: bool


def _gemma4_fields(c: _Check, heads: int | None) -> _Gemma4Global | None:
    """``global_head_dim`` (default 512) for every full-attention layer; with ``attention_k_eq_v``
    also ``num_global_key_value_heads`` (when given) and no v_proj (v = k_proj's output)."""
    ghd = c.int("global_head_dim")
    k_eq_v = c.bool("attention_k_eq_v")
    gkv = c.int("num_global_key_value_heads", optional=True) if k_eq_v else None
    for key in ("hidden_size_per_layer_input", "num_kv_shared_layers"):
        c.int(key, minimum=0, optional=True)
    c.bool("enable_moe_block")
    if c.cfg.get("sliding_window") == 0:  # the layer kinds come from layer_types, windowed or not
        c.bad("sliding_window must be >= 1 (gemma4's sliding_attention layers)")
    if heads is not None and gkv is not None and heads % gkv:
        c.bad(f"num_global_key_value_heads={gkv} must divide num_attention_heads={heads}")
    if ghd is None:
        return None
    return _Gemma4Global(ghd, gkv, k_eq_v)


def _gemma4_refusals(cfg: Mapping[str, Any], mt: str) -> None:
    """Gemma 4 features ftplan does not plan yet, refused with one line each."""
    hint = "ftplan plans the Gemma 4 text models without them (gemma-4-31B, gemma-4-26B-A4B)"
    if cfg.get("hidden_size_per_layer_input"):
        raise ConfigError(
            f"config.json ({mt}): per-layer input embeddings (hidden_size_per_layer_input="
            f"{cfg['hidden_size_per_layer_input']}, Gemma 4 E2B/E4B) are not planned yet", hint)
    if cfg.get("num_kv_shared_layers"):
        raise ConfigError(
            f"config.json ({mt}): KV sharing across layers (num_kv_shared_layers="
            f"{cfg['num_kv_shared_layers']}) is not planned yet", hint)
    if cfg.get("use_bidirectional_attention") == "all":
        raise ConfigError(f"config.json ({mt}): use_bidirectional_attention='all' (non-causal text "
                          "attention) is not planned", "ftplan plans causal language-model fine-tuning")


def _olmoe_refusals(cfg: Mapping[str, Any], h: int, heads: int, head_dim: int | None) -> None:
    """OLMoE configs ftplan does not plan: ``clip_qkv`` (in-place clamps of q/k/v, whose saved
    tensors are not modelled; the OLMoE checkpoints have none) and a head_dim that makes the
    projections another width than the q norm's ``hidden_size`` (transformers fails there)."""
    if cfg.get("clip_qkv") is not None:
        raise ConfigError(f"config.json (olmoe): clip_qkv={_show(cfg['clip_qkv'])} is not planned "
                          "(the clamps' saved tensors are not modelled)",
                          "ftplan plans OLMoE without clip_qkv (null in the OLMoE checkpoints)")
    if head_dim is not None and head_dim * heads != h:
        raise ConfigError(f"config.json (olmoe): head_dim={head_dim} x {heads} heads != hidden_size={h}: "
                          "OlmoeAttention's q_norm is hidden_size wide and fails on that q_proj",
                          "drop head_dim (OlmoeConfig has none: hidden_size // num_attention_heads)")


def _gemma_qwen2_moe_refusals(cfg: Mapping[str, Any], mt: str) -> None:
    """Options of GemmaConfig / Qwen2MoeConfig that transformers runs and ftplan does not plan, one
    line each: Gemma's ``use_bidirectional_attention`` (non-causal attention); Qwen2-MoE's
    ``layer_types`` naming sliding
    layers without ``use_sliding_window`` (Qwen2MoeConfig sets the window to 0 then)."""
    if mt == "gemma" and cfg.get("use_bidirectional_attention"):
        raise ConfigError(f"config.json (gemma): use_bidirectional_attention={_show(cfg['use_bidirectional_attention'])} "
                          "(non-causal attention) is not planned", "ftplan plans causal language-model fine-tuning")
    if mt != "qwen2_moe":
        return
    types = cfg.get("layer_types")
    if isinstance(types, list) and "sliding_attention" in types and not cfg.get("use_sliding_window"):
        raise ConfigError("config.json (qwen2_moe): layer_types names sliding_attention layers without "
                          "use_sliding_window (Qwen2MoeConfig then sets sliding_window to 0)",
                          "set use_sliding_window to true, or make every layer full_attention")


def _gemma4_groups(groups: tuple[LayerGroup, ...], g4: _Gemma4Global, mlp: MlpSpec) -> tuple[LayerGroup, ...]:
    """Full-attention groups (no window) take the global attention shape. With the MoE block
    (``enable_moe_block``) a layer keeps its dense MLP and adds the routed experts beside it,
    with three norms more (``post_feedforward_layernorm_1/2``, ``pre_feedforward_layernorm_2``):
    ``post_ff(post_ff_1(mlp(pre_ff(x))) + post_ff_2(experts(pre_ff_2(x))))``, the router reading
    the un-normed residual."""
    out = []
    for g in groups:
        a = g.attention
        if a is not None and g.window is None:
            a = replace(a, head_dim=g4.head_dim, v_head_dim=g4.head_dim,
                        num_kv_heads=g4.num_kv_heads or a.num_kv_heads, k_eq_v=g4.k_eq_v)
            g = replace(g, attention=a)
        if g.moe is not None:
            g = replace(g, mlp=mlp, norms_per_layer=g.norms_per_layer + 3)
        out.append(g)
    return tuple(out)


def _gemma4_layer_types(c: _Check, n: int) -> list[str] | None:
    """``Gemma4TextConfig.layer_types``: given, or every 6th layer full attention; the last
    layer is always full attention (transformers forces it)."""
    types = c.cfg.get("layer_types")
    if types is None:
        types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)]
    elif not (isinstance(types, list) and all(t in _LAYER_TYPES for t in types)):
        c.bad(f"layer_types must be a list of {' / '.join(_LAYER_TYPES)}")
        return None
    elif len(types) != n:
        c.bad(f"layer_types has {len(types):,} entries for num_hidden_layers={n}")
        return None
    types = list(types)
    if types:
        types[-1] = "full_attention"
    return types


def _partial_rotary_factor(fam: Family, c: _Check) -> float | None:
    """The rotary share of each head for a partial-rotary family: transformers reads it from
    ``rope_parameters`` (which ``rope_scaling`` and a top-level ``partial_rotary_factor`` fill in
    when it does not give one), the config class's default otherwise."""
    if fam.partial_rotary_factor is None:
        return None
    for key in ("rope_parameters", "rope_scaling"):
        rp = c.cfg.get(key)
        if isinstance(rp, Mapping) and rp.get("partial_rotary_factor") is not None:
            return _rotary_share(c, rp["partial_rotary_factor"], f"{key}.partial_rotary_factor")
    if c.cfg.get("partial_rotary_factor") is not None:
        return _rotary_share(c, c.cfg["partial_rotary_factor"], "partial_rotary_factor")
    if fam.rotary_dim_key is not None and c.cfg.get(fam.rotary_dim_key) is not None:
        # (MiniMaxM2Config.convert_rope_params_to_dict: rotary_dim / head_dim)
        rd = c.int(fam.rotary_dim_key)
        hd = c.int("head_dim")
        if rd is None or hd is None:
            return None
        if rd > hd:
            c.bad(f"{fam.rotary_dim_key}={rd} exceeds head_dim={hd}")
            return None
        return rd / hd
    return fam.partial_rotary_factor


def _rotary_share(c: _Check, v: Any, name: str) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
        c.bad(f"{name} must be a number in (0, 1], got {_show(v)}")
        return None
    return float(v)


def _linear_attention_spec(c: _Check, fused: bool = False) -> GatedDeltaNetSpec | None:
    """The Gated DeltaNet of a hybrid family's linear-attention layers (Qwen3_5TextConfig's
    ``linear_*`` fields; ``fused``: qwen3_next's fused input projections)."""
    kh, vh = c.int("linear_num_key_heads"), c.int("linear_num_value_heads")
    kd, vd = c.int("linear_key_head_dim"), c.int("linear_value_head_dim")
    kernel = c.int("linear_conv_kernel_dim")
    if kh is not None and vh is not None and vh % kh:
        c.bad(f"linear_num_key_heads={kh} must divide linear_num_value_heads={vh}")
    if None in (kh, vh, kd, vd, kernel):
        return None
    return GatedDeltaNetSpec(kh, vh, kd, vd, kernel, fused_proj=fused)  # type: ignore[arg-type]


def _short_conv_spec(c: _Check) -> ShortConvSpec | None:
    """LFM2's short convolution: ``conv_L_cache`` taps, ``conv_bias``."""
    k = c.int("conv_L_cache")
    bias = c.bool("conv_bias")
    return None if k is None else ShortConvSpec(k, bias)


def _lfm2_ff_dim(c: _Check, inter: int) -> int:
    """The MLP width Lfm2MLP builds: with ``block_auto_adjust_ff_dim``, ``int(2 * inter / 3)``,
    then (``block_ffn_dim_multiplier`` not null) ``int(multiplier * that)`` rounded up to a
    multiple of ``block_multiple_of``; the configured width otherwise."""
    if not c.bool("block_auto_adjust_ff_dim"):
        return inter
    out = int(2 * inter / 3)
    mult = c.cfg.get("block_ffn_dim_multiplier")
    if mult is None:
        return out
    if isinstance(mult, bool) or not isinstance(mult, (int, float)) or not 0 < mult <= 1024:
        c.bad(f"block_ffn_dim_multiplier must be a number in (0, 1024], got {_show(mult)}")
        return out
    of = c.int("block_multiple_of") or 1
    out = int(mult * out)
    out = of * ((out + of - 1) // of)
    if out < 1 or out > CONFIG_LIMITS["intermediate_size"]:
        c.bad(f"the MLP width derived from block_ff_dim / intermediate_size is {out:,}, outside "
              f"[1, {CONFIG_LIMITS['intermediate_size']:,}]")
        return max(1, min(out, CONFIG_LIMITS["intermediate_size"]))
    return out


def _mla_fields(c: _Check) -> tuple[int, int, int, int, int | None] | None:
    nope = c.int("qk_nope_head_dim")
    rope = c.int("qk_rope_head_dim")
    v_dim = c.int("v_head_dim")
    kv_rank = c.int("kv_lora_rank")
    q_rank = c.int("q_lora_rank", optional=True, zero_is_none=True)
    if None in (nope, rope, v_dim, kv_rank):
        return None
    return nope, rope, v_dim, kv_rank, q_rank  # type: ignore[return-value]


@dataclass(frozen=True)
class _LayerPlan:
    """Which layers use a sliding window and which are MoE, as rules rather than per-layer lists.

    ``window_at(i)`` / ``moe_at(i)`` give one layer's kind. Between consecutive ``cuts`` the kind
    only depends on whether ``(i + 1) % period == 0`` (gemma's every-p-th full-attention layer,
    qwen3_moe's ``decoder_sparse_step``), so the layers can be counted per kind arithmetically.
    """

    window_at: Any
    moe_at: Any
    period: int
    cuts: tuple[int, ...]
    any_moe: bool
    #: the layer is a linear-attention (Gated DeltaNet) layer (hybrid families)
    linear_at: Any = lambda i: False  # noqa: E731
    #: the layer's attention variant beyond its window (llama4_text: ``(rope, chunked)``), None
    variant_at: Any = lambda i: None  # noqa: E731


def _layer_plan(fam: Family, c: _Check, n: int) -> _LayerPlan:
    cfg = c.cfg
    cuts: set[int] = {0, n}
    period = 1
    # ---- sliding windows
    window = c.int("sliding_window", optional=True, zero_is_none=True)
    types = cfg.get("layer_types") if not fam.gemma4 else _gemma4_layer_types(c, n)
    allowed = _LAYER_TYPES + (("linear_attention",) if fam.hybrid_linear else ()) + (
        ("chunked_attention",) if fam.moe == "llama4" else ())
    if fam.short_conv:  # Lfm2Model masks per layer type: only these two exist
        allowed = ("full_attention", "conv")
    if types is not None and not (isinstance(types, list) and all(t in allowed for t in types)):
        c.bad(f"layer_types must be a list of {' / '.join(allowed)}")
        types = None
    elif types is not None and window and len(types) != n:
        if len(types) > CONFIG_LIMITS["num_hidden_layers"]:
            c.bad(f"layer_types has {len(types):,} entries, more than num_hidden_layers={n}")
        types = None  # as before: a list of the wrong length is ignored
    mt = fam.model_type
    qwen = mt in ("qwen2", "qwen3", "qwen3_moe")
    # (dots1: Dots1Config slides the layers from max_window_layers on whenever sliding_window is set)
    use_sw = c.bool("use_sliding_window") if (qwen or mt == "qwen2_moe") and window else (mt == "dots1" and bool(window))
    start = (c.int("max_window_layers", minimum=0, optional=True) or 0) if use_sw else 0
    pattern = (c.int("sliding_window_pattern", optional=True) or 6) if mt == "gemma3_text" and window else 6
    if mt == "smollm3" and not c.bool("use_sliding_window"):
        window = None  # SmolLM3Attention: a window only with use_sliding_window
    if mt in ("olmo2", "minimax_m2", "olmoe") or fam.short_conv:
        window = None  # Olmo2Attention / MiniMaxM2Attention / Lfm2Attention / OlmoeAttention have no sliding window (nor their configs)
    if mt == "exaone4" and types is None:
        pat = cfg.get("sliding_window_pattern")
        if not window:  # (Exaone4Config: pattern 0, then ``(i + 1) % 0``)
            c.bad("layer_types is required for exaone4 without a sliding_window (Exaone4Config "
                  "cannot fill it in: transformers fails)")
        elif isinstance(pat, bool) or not isinstance(pat, int) or pat < 1:
            c.bad(f"exaone4: sliding_window_pattern={_show(pat)} without layer_types: Exaone4Config "
                  "builds layer_types only from an integer pattern (transformers fails); give layer_types")
            window = None
    if not window:
        window_at = lambda i: None  # noqa: E731
    elif types is not None:
        window_at = lambda i: window if types[i] == "sliding_attention" else None  # noqa: E731
        cuts.update(range(n))
    elif mt == "cohere2":  # Cohere2Config: every sliding_window_pattern-th (default 4th) layer full attention
        pat = c.int("sliding_window_pattern", optional=True) or 4
        window_at = lambda i: window if (i + 1) % pat else None  # noqa: E731
        period = pat
    elif mt == "exaone4":  # Exaone4Config: every sliding_window_pattern-th layer full attention
        pat = cfg["sliding_window_pattern"]
        window_at = lambda i: window if (i + 1) % pat else None  # noqa: E731
        period = pat
    elif mt == "olmo3":  # Olmo3Config: every 4th layer full attention
        window_at = lambda i: window if (i + 1) % 4 else None  # noqa: E731
        period = 4
    elif mt == "smollm3":  # SmolLM3Config: the NoPE layers slide
        nope = _nope_rule(c, n)
        window_at = lambda i: window if nope(i) else None  # noqa: E731
        cuts.update(range(n))
    elif mt in ("gemma2", "gpt_oss"):  # sliding on even layers, full on odd ones
        window_at = lambda i: window if (i + 1) % 2 else None  # noqa: E731
        period = 2
    elif mt == "gemma3_text":
        window_at = lambda i: window if (i + 1) % pattern else None  # noqa: E731
        period = pattern
    elif mt == "qwen2_moe":
        if use_sw:  # Qwen2MoeConfig: the even layers below max_window_layers slide
            window_at = lambda i: window if (i + 1) % 2 and i < start else None  # noqa: E731
            period = 2
            cuts.add(min(start, n))
        else:
            window_at = lambda i: None  # noqa: E731
    elif qwen or mt == "dots1":
        if use_sw:
            window_at = lambda i: window if i >= start else None  # noqa: E731
            cuts.add(min(start, n))
        else:
            window_at = lambda i: None  # noqa: E731
    else:  # mistral, mixtral, phi3, llama, deepseek_v3: every layer
        window_at = lambda i: window  # noqa: E731
    # ---- MoE layers
    any_moe = False
    if fam.moe in ("mixtral", "gpt_oss", "qwen3_5_moe", "granitemoe", "olmoe", "phimoe"):
        moe_at = lambda i: True  # noqa: E731
        any_moe = True
    elif fam.moe in ("qwen3_moe", "qwen3_next"):
        step = c.int("decoder_sparse_step", optional=True) or 1
        experts = c.int("num_experts", minimum=0, optional=True) or 0
        only = cfg.get("mlp_only_layers") or []
        if not isinstance(only, list) or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in only):
            c.bad("mlp_only_layers must be a list of layer indices (integers >= 0)")
            only = []
        only_set = frozenset(x for x in only if x < n)
        if period > 1 and step > 1:  # never both in the family table; keep the counting exact anyway
            cuts.update(range(n))
        period = max(period, step)
        cuts.update(only_set)
        cuts.update(x + 1 for x in only_set)
        moe_at = lambda i: experts > 0 and i not in only_set and (i + 1) % step == 0  # noqa: E731
        any_moe = experts > 0 and step <= n and len(only_set) < n
    elif fam.moe == "llama4":
        moe_at, any_moe = _llama4_moe_layers(c, n)
        cuts.update(range(n))
    elif fam.moe == "ernie4_5_moe":
        # Ernie4_5_MoeDecoderLayer: (i + 1) % moe_layer_interval == 0 and start <= i <= end
        # (Ernie4_5_MoeConfig turns an end of -1 into the last layer)
        start = c.int("moe_layer_start_index", minimum=0, optional=True) or 0
        end = c.int("moe_layer_end_index", minimum=-1, optional=True)
        end = n - 1 if end is None or end == -1 else end
        step = c.int("moe_layer_interval", optional=True) or 1
        experts = c.int("moe_num_experts", minimum=0, optional=True) or 0
        if period > 1 and step > 1:
            cuts.update(range(n))
        period = max(period, step)
        cuts.update((min(start, n), min(end + 1, n)))
        moe_at = lambda i: experts > 0 and start <= i <= end and (i + 1) % step == 0  # noqa: E731
        any_moe = any(moe_at(i) for i in range(start, min(end + 1, n, start + step)))
    elif fam.moe == "gemma4":  # enable_moe_block: every layer adds the MoE block to its MLP
        any_moe = c.bool("enable_moe_block")
        moe_at = lambda i: any_moe  # noqa: E731
    elif fam.moe == "deepseek_v3" and fam.mlp_layer_types:
        moe_at, any_moe = _mlp_layer_types(c, n)
        cuts.update(range(n) if cfg.get("mlp_layer_types") is not None else (min(1, n),))
    elif fam.moe in ("deepseek_v3", "mistral4", "lfm2_moe", "deepseek_v2"):
        # (lfm2_moe: the first num_dense_layers layers are dense)
        k = c.int("num_dense_layers" if fam.moe == "lfm2_moe" else "first_k_dense_replace", minimum=0,
                  optional=True) or 0
        moe_at = lambda i: i >= k  # noqa: E731
        cuts.add(min(k, n))
        any_moe = k < n
    else:
        moe_at = lambda i: False  # noqa: E731
    # ---- hybrid token mixers (qwen3_5): Qwen3_5TextConfig fills layer_types from
    # full_attention_interval (default 4: layers 3, 7, ... are full attention)
    linear_at = lambda i: False  # noqa: E731
    if fam.hybrid_linear:
        if types is not None and len(types) != n:
            if len(types) <= CONFIG_LIMITS["num_hidden_layers"]:
                c.bad(f"layer_types has {len(types)} entries for num_hidden_layers={n}")
            else:
                c.bad(f"layer_types has {len(types):,} entries, more than num_hidden_layers={n}")
        elif types is not None:
            linear_at = lambda i: types[i] == "linear_attention"  # noqa: E731
            cuts.update(range(n))
        else:
            k = c.int("full_attention_interval", optional=True) or 4
            linear_at = lambda i: bool((i + 1) % k)  # noqa: E731
            if period > 1 and k != period:
                cuts.update(range(n))
            period = max(period, k)
    if fam.short_conv:
        # Lfm2Config: layer_types when given (every non-"conv" layer is attention), else the
        # full_attn_idxs layers are attention (default: all), the others conv
        if types is not None and len(types) != n:
            c.bad(f"layer_types has {len(types):,} entries for num_hidden_layers={n}")
        elif types is not None:
            linear_at = lambda i: types[i] == "conv"  # noqa: E731
            cuts.update(range(n))
        elif fam.moe == "lfm2_moe":
            # Lfm2MoeConfig has no full_attn_idxs and no default layout: transformers' decoder
            # layers index layer_types, which a config without it leaves None
            c.bad("layer_types is required for lfm2_moe (Lfm2MoeConfig has no default layout: "
                  "transformers cannot build the model without it)")
        elif cfg.get("full_attn_idxs") is not None:
            idxs = _int_list(c, "full_attn_idxs", n)
            attn_set = frozenset(idxs or ())
            linear_at = lambda i: i not in attn_set  # noqa: E731
            cuts.update(range(n))
    variant_at = _llama4_attention_layers(c, n, types) if fam.moe == "llama4" else (lambda i: None)
    if (fam.nope_global_layers and window) or fam.rope_only_sliding:  # exaone4 / cohere2: full layers NoPE
        variant_at = lambda i: None if window_at(i) is not None else (False, False)  # noqa: E731
    return _LayerPlan(window_at, moe_at, period, tuple(sorted(x for x in cuts if 0 <= x <= n)), any_moe,
                      linear_at, variant_at)


def _mlp_layer_types(c: _Check, n: int) -> tuple[Any, bool]:
    """glm4_moe_lite's MoE layers: ``mlp_layer_types[i] == "sparse"`` (a list of "dense" /
    "sparse", one per layer); Glm4MoeLiteConfig's default is layer 0 dense, every other one sparse
    (whatever ``first_k_dense_replace`` says: the config keeps it, the decoder layers ignore it)."""
    types = c.cfg.get("mlp_layer_types")
    if types is None:
        return (lambda i: i >= 1), n > 1
    if not (isinstance(types, list) and all(t in ("dense", "sparse") for t in types)):
        c.bad('mlp_layer_types must be a list of "dense" / "sparse"')
        return (lambda i: False), False
    if len(types) != n:
        c.bad(f"mlp_layer_types has {len(types):,} entries for num_hidden_layers={n}")
        return (lambda i: False), False
    return (lambda i: types[i] == "sparse"), "sparse" in types


def _nope_rule(c: _Check, n: int) -> Any:
    """Which layers of a NoPE family (smollm3) skip the rotary embedding: ``no_rope_layers[i] ==
    0`` (a list of 0/1 of num_hidden_layers entries), else every ``no_rope_layer_interval``-th
    layer (SmolLM3Config's default 4)."""
    flags = c.cfg.get("no_rope_layers")
    if flags is not None:
        if not (isinstance(flags, list) and len(flags) == n
                and all(type(x) is int and x in (0, 1) for x in flags)):
            c.bad(f"no_rope_layers must be a list of {n} entries 0 or 1 (1: rotary embedding)")
            return lambda i: False
        return lambda i: not flags[i]
    k = c.int("no_rope_layer_interval", optional=True) or 4
    return lambda i: (i + 1) % k == 0


def nope_layer_indices(model: ModelSpec) -> tuple[int, ...]:
    """Indices of the decoder layers without rotary embedding (smollm3's NoPE layers, which share
    their layer group with the rope layers; empty for other families)."""
    fam = FAMILIES.get(model.family)
    if fam is None or not fam.nope_layers or not model.config:
        return ()
    check = _Check(_with_defaults(fam, text_config(model.config)))
    rule = _nope_rule(check, model.num_layers)
    return () if check.problems else tuple(i for i in range(model.num_layers) if rule(i))


def nope_layer_count(model: ModelSpec) -> int:
    """Decoder layers without rotary embedding (smollm3's NoPE layers; 0 for other families)."""
    return len(nope_layer_indices(model))


def _int_list(c: _Check, key: str, n: int, *, values: tuple[int, ...] | None = None) -> list[int] | None:
    """A config list of non-negative integers (``values``: the allowed ones), None when absent
    or empty; one problem when malformed (at most ``CONFIG_LIMITS["num_hidden_layers"]`` long)."""
    v = c.cfg.get(key)
    if v is None or v == []:
        return None
    limit = CONFIG_LIMITS["num_hidden_layers"]
    if (not isinstance(v, list) or len(v) > limit
            or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 or (values and x not in values)
                   for x in v)):
        allowed = " / ".join(map(str, values)) if values else "integers >= 0"
        c.bad(f"{key} must be a list of {allowed} (at most {limit:,} entries)")
        return None
    return v


def _llama4_moe_layers(c: _Check, n: int) -> tuple[Any, bool]:
    """Llama4TextConfig's MoE layers: ``moe_layers`` when given, else every
    ``interleave_moe_layer_step``-th layer (``range(step - 1, n, step)``)."""
    listed = _int_list(c, "moe_layers", n)
    if listed is None and c.cfg.get("moe_layers") == []:
        return (lambda i: False), False  # an explicit empty list: every layer dense
    if listed is not None:
        idx = frozenset(listed)
        return (lambda i: i in idx), any(i < n for i in idx)
    step = c.int("interleave_moe_layer_step", optional=True) or 1
    return (lambda i: (i + 1) % step == 0), step <= n


def _llama4_attention_layers(c: _Check, n: int, types: list[str] | None) -> Any:
    """``(rope, chunked)`` per layer as Llama4TextConfig fills them: ``no_rope_layers[i] == 1``
    is a rope layer (default: every ``no_rope_layer_interval``-th layer is NoPE); ``layer_types``
    names chunked or full attention, by default chunked on the rope layers when
    ``attention_chunk_size`` is set."""
    rope = _int_list(c, "no_rope_layers", n, values=(0, 1))
    if rope is not None and len(rope) < n:
        c.bad(f"no_rope_layers has {len(rope)} entries for num_hidden_layers={n}")
        rope = None
    if rope is None:
        k = c.int("no_rope_layer_interval", optional=True) or 4
        rope = [int((i + 1) % k != 0) for i in range(n)]
    chunk = c.int("attention_chunk_size", optional=True)
    if types is not None and len(types) != n:
        c.bad(f"layer_types has {len(types)} entries for num_hidden_layers={n}")
        types = None
    if types is None:
        types = ["chunked_attention" if r and chunk is not None else "full_attention" for r in rope]
    if chunk is None and "chunked_attention" in types:
        c.bad("layer_types names chunked_attention but attention_chunk_size is null")
    return lambda i: (bool(rope[i]), types[i] == "chunked_attention" and chunk is not None)


def _layer_kinds(plan: _LayerPlan, n: int) -> list[tuple[int, int | None, bool, bool, Any]]:
    """(count, window, is_moe, is_linear, variant) per distinct layer kind, in order of first
    appearance."""
    counts: dict[tuple[int | None, bool, bool, Any], int] = {}
    first: dict[tuple[int | None, bool, bool, Any], int] = {}
    p = plan.period

    def add(i: int, count: int) -> None:
        key = (plan.window_at(i), bool(plan.moe_at(i)), bool(plan.linear_at(i)), plan.variant_at(i))
        counts[key] = counts.get(key, 0) + count
        first[key] = min(first.get(key, i), i)

    cuts = plan.cuts
    for a, b in zip(cuts, cuts[1:]):
        if b <= a:
            continue
        hits = b // p - a // p  # layers i in [a, b) with (i + 1) % p == 0
        if hits:
            add((a // p + 1) * p - 1, hits)
        if b - a - hits:
            add(a if (a + 1) % p else a + 1, b - a - hits)
    order = sorted(counts, key=first.__getitem__)
    return [(counts[k], k[0], k[1], k[2], k[3]) for k in order]


def _moe_spec(fam: Family, c: _Check, any_moe: bool) -> MoeSpec | None:
    if fam.moe is None:
        return None
    renorm = True
    if fam.moe in ("mixtral", "gpt_oss", "granitemoe", "phimoe"):
        experts, top_k, inter = (c.int("num_local_experts"), c.int("num_experts_per_tok"),
                                 c.int("intermediate_size"))
        router, shared = fam.moe, None
    elif fam.moe == "qwen3_moe":
        if not any_moe:
            return None
        experts, top_k, inter = (c.int("num_experts"), c.int("num_experts_per_tok"),
                                 c.int("moe_intermediate_size"))
        router, shared = "qwen3_moe", None
        renorm = c.bool("norm_topk_prob")
    elif fam.moe == "olmoe":
        # OlmoeSparseMoeBlock: qwen3_moe's router (renormalised when norm_topk_prob) in every
        # layer, experts of intermediate_size (num_local_experts is an alias of num_experts)
        experts, top_k, inter = (c.int("num_experts"), c.int("num_experts_per_tok"),
                                 c.int("intermediate_size"))
        router, shared = "qwen3_moe", None
        renorm = c.bool("norm_topk_prob")
    elif fam.moe == "llama4":
        # Llama4TextMoe: a shared expert MLP of intermediate_size next to the routed experts
        experts, top_k, inter = (c.int("num_local_experts"), c.int("num_experts_per_tok"),
                                 c.int("intermediate_size"))
        router, shared = "llama4", MlpSpec(inter) if inter else None
    elif fam.moe == "gemma4":
        if not any_moe:
            return None
        experts, top_k, inter = (c.int("num_experts"), c.int("top_k_experts"), c.int("moe_intermediate_size"))
        router, shared = "gemma4", None
    elif fam.moe == "lfm2_moe":
        # Lfm2MoeTopKRouter: sigmoid scores, top-k (with the expert bias), renormalised when
        # norm_topk_prob; no shared expert
        if not any_moe:
            return None
        experts, top_k, inter = (c.int("num_experts"), c.int("num_experts_per_tok"),
                                 c.int("moe_intermediate_size"))
        router, shared = "lfm2_moe", None
        renorm = c.bool("norm_topk_prob")
    elif fam.moe == "ernie4_5_moe":
        if not any_moe:
            return None
        experts, top_k, inter = (c.int("moe_num_experts"), c.int("moe_k"), c.int("moe_intermediate_size"))
        shared_n = c.int("moe_num_shared_experts", minimum=0, optional=True) or 0
        router = "ernie4_5_moe"
        if c.bool("use_bias"):
            c.bad("use_bias: true puts a vocab-size bias on Ernie4_5_MoeForCausalLM's lm_head (tied or not), "
                  "which ftplan does not plan (every published ERNIE 4.5 MoE config says false)")
        shared = MlpSpec(inter * shared_n, bias=c.bool("use_bias")) if shared_n and inter else None
    elif fam.moe in ("qwen3_5_moe", "qwen3_next"):
        # Qwen3_5MoeTopKRouter is qwen3_moe's with norm_topk_prob always on; qwen3_next's
        # (qwen2_moe's) renormalises when norm_topk_prob
        if not any_moe:
            return None
        experts, top_k, inter = (c.int("num_experts"), c.int("num_experts_per_tok"),
                                 c.int("moe_intermediate_size"))
        shared_i = c.int("shared_expert_intermediate_size")
        router, shared = "qwen3_moe", MlpSpec(shared_i) if shared_i else None
        if fam.moe == "qwen3_next":
            renorm = c.bool("norm_topk_prob")
    else:
        experts, top_k, inter = (c.int("n_routed_experts"), c.int("num_experts_per_tok"),
                                 c.int("moe_intermediate_size"))
        # (Dots1MoE always builds its shared expert MLP: Dots1Config's n_shared_experts null fails)
        shared_n = c.int("n_shared_experts", minimum=0, optional=fam.model_type != "dots1") or 0
        # mistral4: DeepSeek-V2's softmax router on DeepSeek-V3's block
        router = fam.moe if fam.moe in ("mistral4", "deepseek_v2") else "deepseek_v3"
        if fam.moe == "deepseek_v2":  # DeepseekV2TopkRouter never renormalises (norm_topk_prob unread)
            renorm = False
            _deepseek_v2_router_checks(c, experts)
        elif fam.moe == "mistral4" or c.cfg.get("norm_topk_prob") is not None:
            # (DeepseekV3Config's default is True: a deepseek_v3 config without the key renormalises)
            renorm = c.bool("norm_topk_prob")
        # (deepseek_v2: mlp_bias puts biases on the shared experts' projections too)
        shared = MlpSpec(inter * shared_n, bias=fam.moe == "deepseek_v2" and c.bool("mlp_bias")) \
            if shared_n and inter else None
    if experts is not None and top_k is not None and top_k > experts:
        c.bad(f"num_experts_per_tok={top_k} exceeds the {experts} experts")
    if experts is None or top_k is None or inter is None or not any_moe:
        return None
    return MoeSpec(experts, top_k, inter, shared, router=router,
                   router_fp32=router in ("deepseek_v3", "ernie4_5_moe", "deepseek_v2"),
                   bias=router == "gpt_oss", shared_gate=fam.moe in ("qwen3_5_moe", "qwen3_next"),
                   renormalize=renorm, dense_dispatch=router == "llama4",
                   frozen_bias_param=router == "ernie4_5_moe",
                   group_limited=router == "deepseek_v2" and c.cfg.get("topk_method") == "group_limited_greedy",
                   input_jitter=router == "phimoe" and _probability(c, "input_jitter_noise") > 0)


def _phimoe_checks(c: _Check) -> None:
    """PhimoeTopKRouter's sparsemixer always picks two experts (it ignores num_experts_per_tok:
    another value builds a model whose routing is not the config's); a tied lm_head keeps its own
    bias (ftplan counts a tied head as the embedding only)."""
    k = c.cfg.get("num_experts_per_tok")
    if k != 2:
        c.bad(f"num_experts_per_tok={_show(k)}: transformers' phimoe sparsemixer always routes each token to 2 "
              "experts (every Phi-3.5-MoE config says 2)")
    if c.cfg.get("tie_word_embeddings") and c.cfg.get("lm_head_bias"):
        c.bad("tie_word_embeddings with lm_head_bias: a tied lm_head with its own bias is not planned "
              "(Phi-3.5-MoE is untied)")


def _deepseek_v2_router_checks(c: _Check, experts: int | None) -> None:
    """What DeepseekV2TopkRouter runs: ``greedy`` or ``group_limited_greedy`` (any other
    topk_method leaves its top-k undefined: transformers fails), the latter with n_group groups
    dividing the experts and topk_group of them; ``moe_layer_freq`` (DeepSeek's remote code) is not
    read by transformers, which makes every layer from first_k_dense_replace on an MoE layer."""
    method = c.cfg.get("topk_method")
    if method not in ("greedy", "group_limited_greedy"):
        c.bad(f"topk_method={_show(method)}: transformers' DeepseekV2TopkRouter runs only 'greedy' and "
              "'group_limited_greedy' (it fails on any other)")
    elif method == "group_limited_greedy":
        groups = c.int("n_group", optional=True)
        top = c.int("topk_group", optional=True)
        if groups is None or top is None:
            c.bad("topk_method='group_limited_greedy' needs integer n_group and topk_group "
                  "(DeepseekV2TopkRouter divides by n_group and takes topk_group groups)")
        elif experts is not None and (experts % groups or top > groups):
            c.bad(f"n_group={groups} must divide the {experts} experts and be at least topk_group={top}")
    freq = c.cfg.get("moe_layer_freq", 1)
    if freq != 1:
        c.bad(f"moe_layer_freq={_show(freq)}: transformers' DeepseekV2DecoderLayer ignores it (every layer "
              "from first_k_dense_replace on is MoE), so it would not build this checkpoint's model")


def layer_group_order(model: ModelSpec) -> list[int]:
    """Index into ``model.groups`` of every decoder layer, in order (groups merge non-adjacent
    identical layers, e.g. gemma's alternating sliding/full attention): rebuilt from the config's
    windows and MoE layers (the rules :func:`model_from_config` counts by); layers in group order
    when the config does not say."""
    n = model.num_layers
    fam = FAMILIES.get(model.family)
    order: list[int] | None = None
    if model.config and fam is not None:
        try:
            cfg0 = text_config(model.config)
        except ConfigError:
            cfg0 = None
        if cfg0 is not None:
            check = _Check(_with_defaults(fam, cfg0))
            plan = _layer_plan(fam, check, n)
            if not check.problems:
                order = []
                for i in range(n):
                    window, moe, lin = plan.window_at(i), bool(plan.moe_at(i)), bool(plan.linear_at(i))
                    variant = plan.variant_at(i)
                    gi = next((j for j, g in enumerate(model.groups)
                               if g.window == window and (g.moe is not None) == moe
                               and g.is_linear == lin and _attention_variant(g) == variant), None)
                    if gi is None:
                        order = None
                        break
                    order.append(gi)
    if order is None or [order.count(j) for j in range(len(model.groups))] != [g.count for g in model.groups]:
        order = [j for j, g in enumerate(model.groups) for _ in range(g.count)]
    return order
