"""Configs of the models ftplan measures: tiny faithful configs and the text model of a config.

Stdlib only (no torch): :data:`TINY_CONFIGS` (one tiny ``config.json`` per family, for the exact
CPU reference counts), :func:`tiny_config` (shrink any config to a tiny one of the same family, for
``ftplan measure --tiny``) and :func:`text_config` (the causal LM inside a multimodal config).
"""

from __future__ import annotations

import copy

from ..errors import ConfigError
from ..model import FAMILIES, MODEL_TYPE_ALIASES

__all__ = ["TINY_CONFIGS", "tiny_config", "text_config", "default_attention"]

# --------------------------------------------------------------------------------------------------
# Tiny configs
# --------------------------------------------------------------------------------------------------

#: what every tiny config carries unless its entry says otherwise
_BASE = dict(vocab_size=512, hidden_size=64, intermediate_size=120, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
#: the config classes' special token ids do not fit the vocabulary of 512
_NO_SPECIAL_IDS = dict(pad_token_id=None, bos_token_id=None, eos_token_id=None)
#: three layers sliding(16)/full/sliding
_SLIDING_FULL_SLIDING = dict(num_hidden_layers=3, sliding_window=16,
                             layer_types=["sliding_attention", "full_attention", "sliding_attention"])
#: DeepSeek-V3's MLA: q_lora_rank 32, kv_lora_rank 16, qk_nope 16, qk_rope 8, v_head_dim 16
_MLA = dict(num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8,
            v_head_dim=16)
#: DeepSeek-V3's MoE block: 8 routed experts of 24 top-2 in 2 groups (top-1 group), 1 shared expert,
#: layer 0 dense (of 3)
_DEEPSEEK_V3_MOE = dict(moe_intermediate_size=24, num_hidden_layers=3, n_routed_experts=8, n_shared_experts=1,
                        num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1)
#: the Gated DeltaNet hybrid linear/full/linear (2 key heads of 16, 4 value heads of 24, conv kernel 4),
#: attention heads of 32
_DELTANET = dict(num_hidden_layers=3, layer_types=["linear_attention", "full_attention", "linear_attention"],
                 head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                 linear_value_head_dim=24, linear_conv_kernel_dim=4)
#: 4 experts top-2 of 24 and a shared expert of 40 behind its sigmoid gate (qwen2_moe's block)
_SHARED_EXPERT_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                          shared_expert_intermediate_size=40)
_QWEN3_5_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                 "mrope_section": [2, 1, 1], "mrope_interleaved": True}
_GEMMA4 = dict(
    num_hidden_layers=4,
    layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    num_attention_heads=8, num_key_value_heads=4, head_dim=16, global_head_dim=24, num_global_key_value_heads=2,
    attention_k_eq_v=True, hidden_size_per_layer_input=0, sliding_window=16, final_logit_softcapping=30.0,
    rope_parameters={"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                        "rope_theta": 1000000.0},
                     "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
    tie_word_embeddings=True,
)
#: LFM2's hybrid conv/full/conv
_LFM2 = dict(num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"], conv_L_cache=3,
             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=True)

_ABSENT = object()  # a field of _BASE that a family's config does not carry


def _tiny(model_type: str, *blocks: dict, **fields) -> dict:
    """``model_type`` + :data:`_BASE`, then each shared block, then the family's own fields (later wins);
    a field given as ``_ABSENT`` is left out. Deep-copied: no two configs share a list or a dict."""
    cfg = {"model_type": model_type, **_BASE}
    for block in blocks:
        cfg.update(block)
    cfg.update(fields)
    return copy.deepcopy({k: v for k, v in cfg.items() if v is not _ABSENT})


#: One tiny but structurally faithful ``config.json``-style dict per family, keyed by HF model_type.
#: Sizes: hidden 64, 2-3 layers, vocab 512, intermediate 120 (MoE expert intermediate 24; chosen so that no
#: two of h, I, Im, V are small multiples of each other, which keeps fitted formulas unambiguous). Sliding
#: windows are 16 tokens, i.e. smaller
#: than the sequence lengths the tests use (32), so the window really masks something where it applies.
#: Features exercised:
#:
#: * llama: GQA (4 heads / 2 kv heads), untied embeddings.
#: * mistral: GQA, ``sliding_window=16`` on every layer, untied.
#: * mixtral: 4 experts top-2 (fused 3-D experts), GQA, untied, no sliding window (like Mixtral-8x7B).
#: * qwen2: q/k/v biases (hard-coded in the architecture), tied embeddings, GQA.
#: * qwen3: ``head_dim=32 != 64/4``, q_norm/k_norm, GQA, untied.
#: * qwen3_moe: ``head_dim=32``, q/k norms, 4 experts top-2 with ``moe_intermediate_size=24``,
#:   ``decoder_sparse_step=1`` and ``mlp_only_layers=[0]`` (layer 0 dense, layers 1-2 MoE).
#: * gemma2: ``head_dim=32``, ``query_pre_attn_scalar=32``, layers alternate sliding(16)/full,
#:   attention soft-capping 50 and final-logit soft-capping 30, pre/post feed-forward norms, tied.
#: * gemma3_text: ``head_dim=32``, q/k norms, layer_types sliding/full/sliding (window 16), tied.
#: * phi3: fused ``qkv_proj`` and ``gate_up_proj``, GQA, ``sliding_window=16``, untied.
#: * deepseek_v3: MLA (q_lora_rank 32, kv_lora_rank 16, qk_nope 16, qk_rope 8, v_head_dim 16),
#:   8 routed experts top-2 (n_group 2, topk_group 1), 1 shared expert, ``first_k_dense_replace=1``.
#: * gpt_oss: attention sinks, q/k/v/o biases, ``head_dim=32`` (q width 128 != hidden 64, as
#:   4096 != 2880 in the real models), layers sliding(16)/full, 4 biased experts top-2 with
#:   ``intermediate_size=24`` (the clamped SwiGLU on interleaved gate/up columns), a biased router
#:   that softmaxes its top-k logits, untied; no sdpa path (eager attention).
#: * glm4_moe: GQA with q/k/v biases (o_proj none), ``use_qk_norm=True``, ``head_dim=32 != 64/4``
#:   with ``partial_rotary_factor=0.5`` (rope tables 16 wide; q/k split into a rotated and a
#:   passed-through half), DeepSeek-V3's MoE block: 8 routed experts top-2 (n_group 2, topk_group 1),
#:   1 shared expert, ``moe_intermediate_size=24``, ``first_k_dense_replace=1``, untied.
#: * qwen3_5: the hybrid Qwen3.5 text model (``qwen3_5_text``): layer_types linear/full/linear (Gated
#:   DeltaNet layers around one gated-attention layer; non-adjacent, so group order matters), 2 key
#:   heads of 16 and 4 value heads of 24 in the DeltaNet (q/k repeated per value head), conv kernel
#:   4; attention 4 heads / 2 kv heads of 32 with q/k norms and a quarter rotary (8 features,
#:   mrope sections 2/1/1), tied embeddings (as the small Qwen3.5 checkpoints).
#: * qwen3_5_moe: qwen3_5's layers (``qwen3_5_moe_text``) with Qwen3.5's MoE block in every layer: 4
#:   experts top-2 of ``moe_intermediate_size=24``, a shared expert of 40 and its sigmoid
#:   ``shared_expert_gate``; untied (as Qwen3.5-35B-A3B).
#: * qwen3_next: Qwen3-Next's hybrid layers linear/full/linear (the DeltaNet as qwen3_5's tiny one,
#:   its projections fused: ``in_proj_qkvz``, ``in_proj_ba``; a plain quarter rotary, no mrope),
#:   qwen2_moe's block (4 experts top-2 of 24, renormalised, a shared expert of 40 and its sigmoid
#:   gate) on layers 0-1 and a dense MLP of 120 on layer 2 (``mlp_only_layers=[2]``); untied.
#: * olmo2: no pre-norms (post-attention and post-feed-forward RMSNorms on the branch outputs), q/k
#:   RMSNorms over the whole projections, fp32 rope tables, GQA, untied.
#: * olmo3: olmo2's layers, layer_types sliding(16)/full/sliding (one rope table pair per type), GQA.
#: * smollm3: llama's layers with ``no_rope_layer_interval=2`` (layer 1 of 3 is NoPE), GQA, tied.
#: * llama4_text: Llama 4's text model: 4 layers, MoE on layers 1 and 3
#:   (``interleave_moe_layer_step=2``, as Maverick) with 4 experts top-2 of ``intermediate_size=24``
#:   and a shared expert of 24, dense layers of ``intermediate_size_mlp=120``; rope on layers 0-1
#:   (complex rope, L2 q/k norm, chunked attention of 16 tokens) and NoPE on layers 2-3 (full
#:   causal attention, temperature tuning with ``floor_scale=8``): every (rope, MoE) combination
#:   once; GQA 4 / 2 heads of 16; untied.
#: * gemma4: Gemma 4 (``gemma4_text``): layer_types sliding/full/sliding/full (window 16), 8 heads;
#:   sliding layers 4 kv heads of 16, full layers ``global_head_dim=24`` with
#:   ``num_global_key_value_heads=2`` and ``attention_k_eq_v`` (no v_proj), q/k/v norms, proportional
#:   rope on the full layers, final-logit soft-capping 30, no per-layer inputs, tied (as gemma-4-31B).
#: * gemma4_moe: gemma4 with ``enable_moe_block`` (as gemma-4-26B-A4B): every layer keeps its dense MLP
#:   and adds 4 experts top-2 of ``moe_intermediate_size=24`` and the router (a Linear ``proj``).
#: * glm4_moe_lite: GLM-4.7-Flash's layers: DeepSeek-V3's MLA (q_lora_rank 32, kv_lora_rank 16,
#:   qk_nope 16, qk_rope 8 interleaved, ``v_head_dim=24`` equal to the q/k head 16 + 8, as
#:   GLM-4.7-Flash's 256 = 192 + 64, where DeepSeek-V3's differ) and the DeepSeek-V3 MoE block (8 routed experts top-2, n_group 2,
#:   topk_group 1, 1 shared expert, ``routed_scaling_factor=1.8``); no ``mlp_layer_types``, so
#:   Glm4MoeLiteConfig's default: layer 0 dense, layers 1-2 MoE (``first_k_dense_replace=1`` and
#:   ``partial_rotary_factor=1.0`` as the real config.json carries them); untied.
#: * mistral4: deepseek_v3's tiny MLA/MoE shapes (8 routed experts top-2 in 2 groups, 1 shared,
#:   layer 0 dense) with Mistral Small 4's softmax router and yarn rope with llama-4 query scaling
#:   (``original_max_position_embeddings=8``); untied.
#: * minimax_m2: MiniMax-M2's layers: GQA 4 / 2 heads of ``head_dim=32`` (q width 128 != hidden 64, as
#:   6144 != 3072), q/k RMSNorms over the whole projections, a half rotary through the checkpoints'
#:   legacy ``rotary_dim`` (16 of 32, as 64 of 128), mixtral-style fused experts (8 of
#:   ``intermediate_size=24``, top-2, no shared expert) behind the sigmoid router with its
#:   ``e_score_correction_bias``; untied; the real vocabulary's bos/eos ids dropped.
#: * lfm2: LFM2's hybrid layers conv/full/conv (gated short convolutions of 3 taps around one GQA
#:   attention layer, 4 heads / 2 kv heads of 16, per-head q/k norms), the MLP width derived from
#:   ``block_ff_dim=150`` as Lfm2MLP does (int(2 * 150 / 3) = 100, rounded up to
#:   ``block_multiple_of=24``: 120), tied embeddings (as every LFM2 checkpoint).
#: * lfm2_moe: lfm2's layers conv/full/conv with layer 0 dense (``num_dense_layers=1``, an MLP of
#:   ``intermediate_size=120`` as given) and layers 1-2 LFM2-MoE's sparse block (4 experts top-2 of 24,
#:   the sigmoid router with the fp32 expert bias, renormalised), tied.
TINY_CONFIGS: dict[str, dict] = {
    "llama": _tiny("llama"),
    "mistral": _tiny("mistral", sliding_window=16),
    "mixtral": _tiny("mixtral", num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
    "qwen2": _tiny("qwen2", use_sliding_window=False, tie_word_embeddings=True),
    "qwen3": _tiny("qwen3", head_dim=32, use_sliding_window=False),
    "qwen3_moe": _tiny("qwen3_moe", moe_intermediate_size=24, num_hidden_layers=3, head_dim=32, num_experts=4,
                       num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[0],
                       use_sliding_window=False),
    "gemma2": _tiny("gemma2", _SLIDING_FULL_SLIDING, head_dim=32, query_pre_attn_scalar=32,
                    attn_logit_softcapping=50.0, final_logit_softcapping=30.0, tie_word_embeddings=True),
    "gemma3_text": _tiny("gemma3_text", _SLIDING_FULL_SLIDING, head_dim=32, query_pre_attn_scalar=32,
                         tie_word_embeddings=True),
    "phi3": _tiny("phi3", original_max_position_embeddings=256, sliding_window=16, pad_token_id=0, eos_token_id=1),
    "deepseek_v3": _tiny("deepseek_v3", _MLA, _DEEPSEEK_V3_MOE),
    "gpt_oss": _tiny("gpt_oss", intermediate_size=24, head_dim=32, num_local_experts=4, num_experts_per_tok=2,
                     sliding_window=16, layer_types=["sliding_attention", "full_attention"],
                     max_position_embeddings=131072),  # yarn's 32 x 4096, as the real config
    "glm4_moe": _tiny("glm4_moe", _DEEPSEEK_V3_MOE, head_dim=32, attention_bias=True, use_qk_norm=True,
                      partial_rotary_factor=0.5),
    "qwen3_5": _tiny("qwen3_5_text", _DELTANET, rope_parameters=_QWEN3_5_ROPE, tie_word_embeddings=True),
    "qwen3_5_moe": _tiny("qwen3_5_moe_text", _DELTANET, _SHARED_EXPERT_MOE, intermediate_size=_ABSENT,
                         rope_parameters=_QWEN3_5_ROPE),
    "qwen3_next": _tiny("qwen3_next", _DELTANET, _SHARED_EXPERT_MOE, norm_topk_prob=True, decoder_sparse_step=1,
                        mlp_only_layers=[2],
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}),
    "olmo2": _tiny("olmo2"),
    "olmo3": _tiny("olmo3", _SLIDING_FULL_SLIDING),
    "smollm3": _tiny("smollm3", _NO_SPECIAL_IDS, num_hidden_layers=3, no_rope_layer_interval=2,
                     tie_word_embeddings=True),
    "llama4_text": _tiny("llama4_text", intermediate_size=24, intermediate_size_mlp=120, num_hidden_layers=4,
                         head_dim=16, num_local_experts=4, num_experts_per_tok=2, interleave_moe_layer_step=2,
                         no_rope_layers=[1, 1, 0, 0], use_qk_norm=True, attention_chunk_size=16,
                         attn_temperature_tuning=True, floor_scale=8, attn_scale=0.1),
    "gemma4": _tiny("gemma4_text", _GEMMA4),
    "glm4_moe_lite": _tiny("glm4_moe_lite", _MLA, _DEEPSEEK_V3_MOE, v_head_dim=24, routed_scaling_factor=1.8,
                           partial_rotary_factor=1.0, pad_token_id=0),
    # yarn with llama-4 query scaling, as Mistral-Small-4's config (original length 8 < the tests'
    # sequences, so the per-position scale really varies)
    "mistral4": _tiny("mistral4", _MLA, _DEEPSEEK_V3_MOE, rope_interleave=True,
                      rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 32.0,
                                       "original_max_position_embeddings": 8, "beta_fast": 32.0, "beta_slow": 1.0,
                                       "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}),
    "minimax_m2": _tiny("minimax_m2", intermediate_size=24, head_dim=32, rotary_dim=16, num_local_experts=8,
                        num_experts_per_tok=2, bos_token_id=None, eos_token_id=None),  # MiniMaxM2Config's > vocab
    "lfm2": _tiny("lfm2", _LFM2, intermediate_size=_ABSENT, block_ff_dim=150, block_multiple_of=24,
                  block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=True, conv_bias=False),
    "lfm2_moe": _tiny("lfm2_moe", _LFM2, moe_intermediate_size=24, num_dense_layers=1, num_experts=4,
                      num_experts_per_tok=2),
    "gemma4_moe": _tiny("gemma4_text", _GEMMA4, enable_moe_block=True, num_experts=4, top_k_experts=2,
                        moe_intermediate_size=24),
    # granite: llama's layers with Granite 3.x's muP multipliers (granite-3.3-8b's values: embedding 12,
    # residual 0.22, attention 1/128, logits divided by 16), GQA, tied (as every Granite 3.x checkpoint).
    "granite": _tiny("granite", _NO_SPECIAL_IDS, embedding_multiplier=12.0, residual_multiplier=0.22,
                     attention_multiplier=0.0078125, logits_scaling=16.0, tie_word_embeddings=True),
    # ernie4_5: ERNIE 4.5's dense layers (head_dim 32 != 64 / 4, GQA 4 / 2), fp32 interleaved rope,
    # biased projections (use_bias; the 0.3B checkpoint has none: the switch's path), tied.
    "ernie4_5": _tiny("ernie4_5", head_dim=32, use_bias=True, tie_word_embeddings=True),
    # seed_oss: Seed-OSS's layers (q/k/v biases, none on o_proj, head_dim 32 != 64 / 4, GQA 4 / 2) with
    # residual dropout 0.1 on o_proj's and down_proj's outputs; attention dropout off (CPU sdpa runs its
    # math kernel in fp32 with a dropout, which the CUDA kernels ftplan plans do not: held by hand with
    # eager attention instead, tests/test_seed_oss.py); untied.
    "seed_oss": _tiny("seed_oss", _NO_SPECIAL_IDS, head_dim=32, attention_dropout=0.0, residual_dropout=0.1),
    # granitemoe: granite's multipliers (granite-3.x MoE values: embedding 12, residual 0.22, attention
    # 1/64, logits divided by 6) on mixtral's layout: 4 experts top-2 of ``intermediate_size=24`` in every
    # layer behind the fp32 top-k-then-softmax router, GQA, tied.
    "granitemoe": _tiny("granitemoe", intermediate_size=24, num_local_experts=4, num_experts_per_tok=2,
                        embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.015625,
                        logits_scaling=6.0, tie_word_embeddings=True),
    # olmoe: OLMoE's layers: GQA 4 / 2 heads of 16 with q/k RMSNorms over the whole projections, 4
    # experts top-2 of ``intermediate_size=24`` in every layer behind qwen3_moe's fp32-softmax router,
    # not renormalised (norm_topk_prob false, as the OLMoE checkpoints); untied; OlmoeConfig's pad/eos
    # ids (1, 50279) dropped.
    "olmoe": _tiny("olmoe", _NO_SPECIAL_IDS, intermediate_size=24, num_experts=4, num_experts_per_tok=2,
                   norm_topk_prob=False),
    # exaone4: EXAONE 4.0's post-norm layers (no input norms; norms on o_proj's and down_proj's outputs),
    # per-head q/k norms, GQA 4 / 2 heads of 16, layer_types sliding(16)/sliding/full (the full layer
    # NoPE: the hybrid layout of EXAONE-4.0-32B's "LLLG" in three layers), untied; Exaone4Config's
    # bos/eos ids dropped.
    "exaone4": _tiny("exaone4", _NO_SPECIAL_IDS, num_hidden_layers=3, sliding_window=16,
                     layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
    # dots1: dots.llm1's layers: GQA 4 / 2 heads of 16 with per-head q/k norms, layer 0 dense
    # (``first_k_dense_replace=1``, an MLP of 120), layers 1-2 DeepSeek-V3's MoE block (4 experts top-2 of
    # ``moe_intermediate_size=24`` in 2 groups, top-1 group, one shared expert, the fp32 sigmoid router
    # renormalised, routed_scaling_factor 2.5), no window (as dots.llm1: max_window_layers = all layers);
    # untied.
    "dots1": _tiny("dots1", _DEEPSEEK_V3_MOE, n_routed_experts=4, norm_topk_prob=True, routed_scaling_factor=2.5,
                   sliding_window=None),
    # hunyuan_v1_dense: Hunyuan's dense layers (per-head q/k norms after the rope, q/k/v/o biases as
    # attention_bias), GQA 4 / 2 heads of 16 (head_dim given: the config class's None fails), untied;
    # HunYuanDenseV1Config's special ids dropped.
    "hunyuan_v1_dense": _tiny("hunyuan_v1_dense", _NO_SPECIAL_IDS, head_dim=16, attention_bias=True,
                              eod_token_id=None),
    # ernie4_5_moe: ERNIE 4.5 MoE (21B-A3B shape, shrunk): layer 0 dense, layer 1 an MoE block (fp32
    # softmax router with the frozen fp32 e_score_correction_bias, 4 experts top-2, 2 shared experts);
    # ernie4_5's fp32 interleaved rope, head_dim 32 != 64 / 4, GQA 4 / 2, tied embeddings
    "ernie4_5_moe": _tiny("ernie4_5_moe", intermediate_size=96, head_dim=32, moe_num_experts=4, moe_k=2,
                          moe_intermediate_size=24, moe_num_shared_experts=2, moe_layer_start_index=1,
                          tie_word_embeddings=True),
    # gemma: Gemma 1's layers (gemma-2b's multi-query shape): 4 heads of 32 over hidden 64 (q_proj 128
    # wide, as gemma-7b's 16 x 256 > 3072), one kv head, a GeGLU MLP of 120, the (1 + w) fp32 RMSNorms,
    # the embedding scaled by sqrt(64), tied; GemmaConfig's pad/bos/eos ids dropped.
    "gemma": _tiny("gemma", _NO_SPECIAL_IDS, num_key_value_heads=1, head_dim=32, hidden_act="gelu_pytorch_tanh",
                   tie_word_embeddings=True),
    # deepseek_v2: DeepSeek-V2-Lite's layers, shrunk: MLA with ``q_lora_rank`` null (one q_proj),
    # kv_lora_rank 16, qk_nope 16 + qk_rope 8 (the complex rope), v_head_dim 16; layer 0 dense
    # (``first_k_dense_replace=1``, an MLP of 120), layers 1-2 DeepSeek-V2's MoE block (8 experts top-2
    # of ``moe_intermediate_size=24``, 2 shared experts fused into one MLP of 48, the fp32 softmax router,
    # ``greedy``, routed_scaling_factor 1.5); untied.
    "deepseek_v2": _tiny("deepseek_v2", _MLA, q_lora_rank=None, moe_intermediate_size=24, num_hidden_layers=3,
                         n_routed_experts=8, n_shared_experts=2, num_experts_per_tok=2, first_k_dense_replace=1,
                         topk_method="greedy", routed_scaling_factor=1.5),
    # cohere2: Command R7B's layers, shrunk: the parallel attention + MLP block behind one
    # Cohere2LayerNorm, GQA 4 / 2 heads of 16, layer_types sliding/sliding/full from
    # ``sliding_window_pattern=3`` (window 16: the sliding layers rotate, the full one is NoPE),
    # q/k/v/o biases (attention_bias), ``logit_scale=0.25``, tied embeddings; Cohere2Config's special ids
    # dropped.
    "cohere2": _tiny("cohere2", _NO_SPECIAL_IDS, num_hidden_layers=3, sliding_window=16, sliding_window_pattern=3,
                     attention_bias=True, logit_scale=0.25, tie_word_embeddings=True),
    # qwen2_moe: Qwen1.5-MoE's layers: GQA 4 / 2 heads of 16 with q/k/v biases, layer 0 dense
    # (``mlp_only_layers=[0]``, an MLP of 120), layer 1 the sparse block (4 experts top-2 of
    # ``moe_intermediate_size=24``, not renormalised as the checkpoints, one shared expert of 48 behind
    # its sigmoid gate); untied.
    "qwen2_moe": _tiny("qwen2_moe", _SHARED_EXPERT_MOE, _NO_SPECIAL_IDS, shared_expert_intermediate_size=48,
                       norm_topk_prob=False, mlp_only_layers=[0]),
    # glm4: GLM-4-0414's layers: four llama RMSNorms per layer (sandwich norms around attention and
    # MLP), GQA 4 / 2 heads of 16 with q/k/v biases, Glm4Config's half rotary (8 of 16 features,
    # interleaved per layer), a fused gate_up_proj of 2 x 120; untied; Glm4Config's pad/eos ids dropped.
    "glm4": _tiny("glm4", _NO_SPECIAL_IDS, head_dim=16, attention_bias=True),
    # phimoe: Phi-3.5-MoE's layers, shrunk: GQA 4 / 2 heads of 16 with q/k/v/o biases, nn.LayerNorm
    # norms (weight + bias), every layer an MoE block of 4 experts of ``intermediate_size=24`` behind the
    # sparsemixer router (top-2), input jitter 0.01 (as the checkpoint's config), lm_head bias, untied.
    "phimoe": _tiny("phimoe", intermediate_size=24, num_local_experts=4, num_experts_per_tok=2, attention_bias=True,
                    lm_head_bias=True, input_jitter_noise=0.01, router_jitter_noise=0.01, sliding_window=None),
}


def text_config(config: dict) -> tuple[str, dict]:
    """(model_type, kwargs for ``AutoConfig.for_model``) of a config.json dict (not modified);
    descends into ``text_config`` for multimodal wrappers (gemma3 -> gemma3_text)."""
    cfg = copy.deepcopy(dict(config))
    model_type = cfg.pop("model_type", None)
    if isinstance(cfg.get("text_config"), dict):
        text = copy.deepcopy(cfg["text_config"])
        ttype = text.pop("model_type", None) or {"gemma3": "gemma3_text"}.get(model_type, f"{model_type}_text")
        if isinstance(ttype, str):
            ttype = MODEL_TYPE_ALIASES.get(ttype, ttype)  # kimi_k2 -> deepseek_v3 (its remote code)
        if ttype in ("qwen3_5_text", "qwen3_5_moe_text"):
            # AutoModelForCausalLM on a Qwen3.5 image-text config builds Qwen3_5ForCausalLM from
            # the text config alone (its own tie_word_embeddings; no vision tower)
            return ttype, text
        if ttype == "llama4_text":
            _llama4_strict_bool(text)
        # a few top-level fields matter for the text model too
        for k in ("tie_word_embeddings", "vocab_size"):
            if k in cfg and k not in text:
                text[k] = cfg[k]
        return ttype, text
    if not model_type:
        raise ConfigError("config has no 'model_type'", "pass a Hugging Face config.json")
    if isinstance(model_type, str):
        model_type = MODEL_TYPE_ALIASES.get(model_type, model_type)
    if model_type in ("qwen3_5", "qwen3_5_moe", "gemma4"):  # a flat Qwen3.5 / Gemma 4 text config
        model_type += "_text"
    qc = cfg.get("quantization_config")
    if isinstance(qc, dict) and qc.get("quant_method") == "mxfp4":
        # gpt-oss ships MXFP4 experts; training runs on the bf16 weights transformers makes of them
        # (Mxfp4Config(dequantize=True)), which is what ftplan plans and a random-weight build is
        cfg.pop("quantization_config")
    return model_type, cfg


def _llama4_strict_bool(text: dict) -> None:
    """Llama 4 Scout's published config.json says ``"attn_temperature_tuning": 4``, which
    transformers 4.51 read as true and 5.24's strict ``Llama4TextConfig`` refuses (a bool field):
    build it as the bool it stands for (the planning answer says so, see ``memory._llama4_note``)."""
    v = text.get("attn_temperature_tuning")
    if isinstance(v, int) and not isinstance(v, bool):
        text["attn_temperature_tuning"] = bool(v)


_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             head_dim=16, vocab_size=512)


def tiny_config(config: dict) -> dict:
    """A tiny config of the same family (hidden 64, 2 layers, 4 heads, vocab 512, ...).

    Structural switches of the original (biases, tied embeddings, qk-norm, sliding windows,
    MoE/MLA, soft-capping) are kept; only sizes shrink, so the same code paths run.
    """
    model_type, cfg = text_config(config)
    out = dict(cfg)
    out.update(_TINY)
    heads = cfg.get("num_attention_heads") or 1
    kv = cfg.get("num_key_value_heads") or heads
    out["num_key_value_heads"] = 4 if kv >= heads else (1 if kv == 1 else 2)
    if isinstance(out.get("max_position_embeddings"), int):
        out["max_position_embeddings"] = max(4096, min(out["max_position_embeddings"], 131072))
    for k, v in (("num_local_experts", 4), ("num_experts", 4), ("n_routed_experts", 4), ("moe_num_experts", 4)):
        if cfg.get(k):
            out[k] = v
    if cfg.get("num_experts_per_tok"):
        out["num_experts_per_tok"] = 2
    if cfg.get("moe_k"):  # (ernie4_5_moe's top-k)
        out["moe_k"] = 2
    if cfg.get("moe_intermediate_size"):
        out["moe_intermediate_size"] = 32
    if cfg.get("shared_expert_intermediate_size"):
        out["shared_expert_intermediate_size"] = 48
    if cfg.get("n_shared_experts"):
        out["n_shared_experts"] = 1
    if cfg.get("n_group"):
        out["n_group"], out["topk_group"] = 1, 1
    if cfg.get("first_k_dense_replace"):
        out["first_k_dense_replace"] = 1
    if cfg.get("kv_lora_rank"):
        out.update(kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16)
        out["head_dim"] = 8
        if cfg.get("q_lora_rank"):
            out["q_lora_rank"] = 32
        if model_type == "mistral4":
            # Mistral4's (llama) rotary turns head_dim * partial_rotary_factor features, head_dim
            # being qk_nope + qk_rope: the 8 rope features of the 16-wide tiny head
            out["head_dim"] = 16
            out.pop("qk_head_dim", None)
            if isinstance(out.get("rope_parameters"), dict):
                out["rope_parameters"] = {**out["rope_parameters"], "partial_rotary_factor": 0.5}
    if isinstance(cfg.get("layer_types"), list):
        out["layer_types"] = cfg["layer_types"][:2] if len(cfg["layer_types"]) >= 2 else cfg["layer_types"]
    if model_type == "olmo3" and isinstance(cfg.get("layer_types"), list) and len(set(cfg["layer_types"])) > 1:
        out["layer_types"] = ["sliding_attention", "full_attention"]  # one layer of each kind
    if isinstance(cfg.get("no_rope_layers"), list):  # smollm3: keep one NoPE layer if it has any
        out["no_rope_layers"] = [1, 0] if 0 in cfg["no_rope_layers"] else [1, 1]
    elif model_type == "smollm3":
        out["no_rope_layer_interval"] = 2
    if isinstance(cfg.get("mlp_only_layers"), list):
        out["mlp_only_layers"] = [i for i in cfg["mlp_only_layers"] if i < 2]
    if cfg.get("max_window_layers") is not None:
        out["max_window_layers"] = min(int(cfg["max_window_layers"]), 2)
    head = cfg.get("head_dim") or (FAMILIES[model_type].defaults.get("head_dim") if model_type in FAMILIES else None)
    if isinstance(cfg.get("rotary_dim"), int) and isinstance(head, int) and head > 0:
        # minimax_m2's legacy rotary width (head_dim: the config's, else the config class's): the
        # same share of the tiny head
        out["rotary_dim"] = max(2, cfg["rotary_dim"] * out["head_dim"] // head // 2 * 2)
    if cfg.get("query_pre_attn_scalar"):
        out["query_pre_attn_scalar"] = 16
    if model_type == "gemma4_text":
        # the full-attention layers' own head size and kv heads, and the MoE block's top-k, shrink too
        if cfg.get("global_head_dim"):
            out["global_head_dim"] = 24
        if cfg.get("num_global_key_value_heads"):
            out["num_global_key_value_heads"] = 1 if cfg["num_global_key_value_heads"] == 1 else 2
        if cfg.get("top_k_experts"):
            out["top_k_experts"] = 2
    if model_type in ("qwen3_5_text", "qwen3_5_moe_text"):
        # the Gated DeltaNet shrinks too (2 key / 4 value heads of 16), one layer of each kind, and
        # the mrope sections fit the 4 rotary features of a 16-wide head (a quarter rotary)
        out.update(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                   linear_value_head_dim=16, layer_types=["linear_attention", "full_attention"])
        out.pop("full_attention_interval", None)
        rp = dict(cfg.get("rope_parameters") or {})
        prf = rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
        rp.update(mrope_section=[1, 1, max(0, int(16 * prf) // 2 - 2)], partial_rotary_factor=prf)
        rp.setdefault("rope_type", "default")
        rp.setdefault("rope_theta", 10000000.0)
        out["rope_parameters"] = rp
    if model_type == "qwen3_next":
        # the Gated DeltaNet shrinks as qwen3_5's (its projections fused), one layer of each kind
        out.update(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                   linear_value_head_dim=16, layer_types=["linear_attention", "full_attention"])
        out.pop("full_attention_interval", None)
    if model_type == "llama4_text":
        # dense layers shrink too; the per-layer schedules keep the first two layers' entries
        out["intermediate_size_mlp"] = 192
        if isinstance(cfg.get("moe_layers"), list):
            out["moe_layers"] = [i for i in cfg["moe_layers"] if isinstance(i, int) and i < 2]
        if isinstance(cfg.get("no_rope_layers"), list) and len(cfg["no_rope_layers"]) >= 2:
            out["no_rope_layers"] = cfg["no_rope_layers"][:2]
    if model_type == "lfm2_moe":
        # one layer of each kind, the first dense and the second MoE
        out.update(layer_types=["conv", "full_attention"], num_dense_layers=1)
    if model_type == "lfm2":
        # one layer of each kind; the MLP width LFM2 derives (block_ff_dim overrides
        # intermediate_size) shrinks to 2/3 of 192, a multiple of 32: 128
        out.update(layer_types=["conv", "full_attention"], intermediate_size=192, block_multiple_of=32)
        out.pop("full_attn_idxs", None)
        out.pop("block_ff_dim", None)
        out.pop("head_dim", None)  # Lfm2Config has none: hidden // heads
    for k in ("torch_dtype", "dtype"):
        out.pop(k, None)
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        # token ids of the real vocabulary do not fit the tiny one, nor do the config classes'
        # defaults (Phi3Config's pad 32000, SmolLM3Config's 128004, MiniMaxM2Config's bos/eos)
        out[k] = None
    for key in ("rope_scaling", "rope_parameters"):
        rs = out.get(key)
        if isinstance(rs, dict) and isinstance(rs.get("short_factor"), list):
            # LongRoPE (phi-3.5 / phi-4-mini): one factor per rotary frequency of the tiny head
            prf = rs.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
            n = int(out["head_dim"] * prf) // 2
            out[key] = {**rs, "short_factor": rs["short_factor"][:n], "long_factor": rs.get("long_factor", [])[:n]}
    out["model_type"] = model_type
    return out


def default_attention(config: dict) -> str:
    """``sdpa``, or ``eager`` for an architecture transformers has no sdpa path for (Gemma2's
    soft-capping, gpt-oss's sinks): what a measurement builds the model with when the job says
    sdpa. ``ModelSpec.supports_sdpa`` is the one place that knows."""
    from ..model import model_from_config

    return "sdpa" if model_from_config(config).supports_sdpa else "eager"
