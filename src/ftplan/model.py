"""Model architecture: a ``ModelSpec`` built from a Hugging Face ``config.json``.

This is the one place that knows architectures. ``FAMILIES`` reads like a table: for each
supported ``model_type``, the config defaults that transformers' config class would fill in, and
the structural facts (norms per layer, fused projections, bias rules) of its modeling code.

Parameter counts are derived from the module structure transformers builds (checked exactly,
category by category, against ``AutoModelForCausalLM.from_config`` on the meta device for every
bundled model, see ``tests/test_model_params.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

__all__ = [
    "FAMILIES",
    "AttentionSpec",
    "MlpSpec",
    "MoeSpec",
    "LayerGroup",
    "LinearSpec",
    "ParamCounts",
    "ModelSpec",
    "model_from_config",
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
    fused_qkv: bool = False  # phi3: one qkv_proj
    fused_gate_up: bool = False  # phi3: one gate_up_proj
    qkv_bias_key: str | None = "attention_bias"  # config key that turns q/k/v biases on
    o_bias_key: str | None = "attention_bias"  # config key that turns the o_proj bias on
    always_qkv_bias: bool = False  # qwen2: q/k/v always have a bias, o_proj never
    mlp_bias_key: str | None = None
    moe: str | None = None  # None | "mixtral" | "qwen3_moe" | "deepseek_v3"
    mla: bool = False
    activation_key: str = "hidden_act"
    #: "llama": RMSNorm upcasts to fp32 and casts the normalised tensor back before the weight;
    #: "gemma": computes entirely in fp32 with a (1 + weight) scale, casting only the result
    norm_style: str = "llama"


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
}


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
    # MLA (DeepSeek-V3); None for standard multi-/grouped-query attention
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None


@dataclass(frozen=True)
class MlpSpec:
    intermediate_size: int
    bias: bool = False
    fused_gate_up: bool = False


@dataclass(frozen=True)
class MoeSpec:
    num_experts: int
    top_k: int
    expert_intermediate_size: int
    shared: MlpSpec | None = None  # shared experts, run on every token
    #: router implementation (the family's): "mixtral"/"qwen3_moe" softmax in fp32, "deepseek_v3"
    #: sigmoid in the logits' dtype; qwen3_moe casts the top-k weights back to the logits' dtype
    router: str = "mixtral"


@dataclass(frozen=True)
class LayerGroup:
    """``count`` identical decoder layers."""

    count: int
    attention: AttentionSpec
    mlp: MlpSpec | None  # dense MLP (None for MoE layers)
    moe: MoeSpec | None
    norms_per_layer: int
    window: int | None = None  # sliding-window size, None for full attention


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

    # ---- structure ----------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return any(g.moe is not None for g in self.groups)

    @property
    def attention(self) -> AttentionSpec:
        return self.groups[0].attention

    def linears(self) -> tuple[LinearSpec, ...]:
        """Every weight matrix of the decoder layers and the lm_head (embedding excluded)."""
        h = self.hidden_size
        out: list[LinearSpec] = []
        for g in self.groups:
            out.extend(attention_linears(g.attention, h, g.count))
            if g.mlp is not None:
                out.extend(mlp_linears(g.mlp, h, g.count, "mlp"))
            if g.moe is not None:
                m = g.moe
                frac = m.top_k / m.num_experts
                n = g.count * m.num_experts
                out.append(LinearSpec("gate_up_proj", h, 2 * m.expert_intermediate_size, n, False,
                                      "experts", is_module=False, token_fraction=frac))
                out.append(LinearSpec("down_proj", m.expert_intermediate_size, h, n, False,
                                      "experts", is_module=False, token_fraction=frac))
                if m.shared is not None:
                    out.extend(mlp_linears(m.shared, h, g.count, "mlp"))
        if not self.tie_word_embeddings:
            out.append(LinearSpec("lm_head", h, self.vocab_size, 1, False, "lm_head"))
        return tuple(out)

    @property
    def params(self) -> ParamCounts:
        h = self.hidden_size
        cats = dict.fromkeys(CATEGORIES, 0)
        active = 0
        for lin in self.linears():
            cats[lin.category] += lin.params
            active += round(lin.params * lin.token_fraction)
        cats["embedding"] = self.vocab_size * h
        norms = h  # final norm
        router = 0
        for g in self.groups:
            a = g.attention
            per_layer = g.norms_per_layer * h
            if a.qk_norm:
                per_layer += 2 * a.head_dim
            if a.is_mla:
                per_layer += a.kv_lora_rank + (a.q_lora_rank or 0)
            norms += g.count * per_layer
            if g.moe is not None:
                router += g.count * g.moe.num_experts * h
        cats["norms"] = norms
        cats["router"] = router
        active += cats["embedding"] + norms + router
        return ParamCounts(active=active, **cats)

    def module_names(self) -> frozenset[str]:
        """Leaf module names PEFT can target (as in ``target_modules``)."""
        return frozenset(lin.module for lin in self.linears() if lin.is_module)

    def summary(self) -> str:
        p = self.params
        moe = f", MoE {p.active / 1e9:.1f}B active" if self.is_moe else ""
        return f"{self.name}: {self.family}, {p.total / 1e9:.2f}B params{moe}, {self.num_layers} layers, hidden {self.hidden_size}"


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
    if a.fused_qkv:
        out = [LinearSpec("qkv_proj", h, q + 2 * kv, n, a.qkv_bias, "attention")]
    else:
        out = [
            LinearSpec("q_proj", h, q, n, a.qkv_bias, "attention"),
            LinearSpec("k_proj", h, kv, n, a.qkv_bias, "attention"),
            LinearSpec("v_proj", h, kv, n, a.qkv_bias, "attention"),
        ]
    out.append(LinearSpec("o_proj", a.num_heads * a.v_head_dim, h, n, a.o_bias, "attention"))
    return out


def mlp_linears(m: MlpSpec, h: int, n: int, category: str) -> list[LinearSpec]:
    i = m.intermediate_size
    if m.fused_gate_up:
        up = [LinearSpec("gate_up_proj", h, 2 * i, n, m.bias, category)]
    else:
        up = [LinearSpec("gate_proj", h, i, n, m.bias, category),
              LinearSpec("up_proj", h, i, n, m.bias, category)]
    return up + [LinearSpec("down_proj", i, h, n, m.bias, category)]


_attention_linears, _mlp_linears = attention_linears, mlp_linears  # their names before they were public


# --------------------------------------------------------------------------------------------
# From config.json
# --------------------------------------------------------------------------------------------
def _int(cfg: Mapping[str, Any], key: str, *, minimum: int = 1) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ConfigError(
            f"config.json field {key!r} must be an integer >= {minimum}, got {v!r}",
            "check the model's config.json",
        )
    return v


def text_config(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The language-model part of a config (multimodal Gemma 3 keeps it in ``text_config``)."""
    if not isinstance(raw, Mapping):
        raise ConfigError("config.json must be a JSON object", "pass a Hugging Face config.json")
    cfg = dict(raw)
    if "text_config" in cfg and isinstance(cfg["text_config"], Mapping):
        inner = dict(cfg["text_config"])
        mt = inner.get("model_type") or {"gemma3": "gemma3_text"}.get(cfg.get("model_type", ""), "")
        inner["model_type"] = mt
        return inner
    mt = cfg.get("model_type")
    if mt == "gemma3":  # a gemma3 config without text_config: the text defaults apply
        cfg["model_type"] = "gemma3_text"
    if not mt:
        for arch in cfg.get("architectures") or []:
            if arch in _ARCH_TO_TYPE:
                cfg["model_type"] = _ARCH_TO_TYPE[arch]
                break
    return cfg


def model_from_config(
    raw: Mapping[str, Any],
    *,
    name: str | None = None,
    hf_id: str | None = None,
    source: str | None = None,
) -> ModelSpec:
    """Build a ``ModelSpec`` from a Hugging Face ``config.json`` dict (never runs remote code)."""
    cfg0 = text_config(raw)
    mt = cfg0.get("model_type")
    if not mt:
        raise ConfigError("config.json has no 'model_type'", "pass a Hugging Face config.json of a causal LM")
    fam = FAMILIES.get(mt)
    if fam is None:
        raise ConfigError(
            f"unsupported architecture model_type={mt!r}",
            f"supported: {', '.join(sorted(FAMILIES))}",
        )
    cfg = {**fam.defaults, **{k: v for k, v in cfg0.items() if v is not None or k not in fam.defaults}}
    # keys whose None means "use the default" in transformers
    for k in ("num_key_value_heads", "head_dim"):
        if cfg0.get(k) is None:
            cfg[k] = fam.defaults.get(k)

    h = _int(cfg, "hidden_size")
    n_layers = _int(cfg, "num_hidden_layers")
    vocab = _int(cfg, "vocab_size")
    heads = _int(cfg, "num_attention_heads")
    kv_heads = cfg.get("num_key_value_heads") or heads
    if not isinstance(kv_heads, int) or kv_heads < 1 or heads % kv_heads:
        raise ConfigError(
            f"num_key_value_heads={kv_heads!r} must divide num_attention_heads={heads}",
            "check the model's config.json",
        )
    head_dim = cfg.get("head_dim") or h // heads
    inter = _int(cfg, "intermediate_size")
    tie = bool(cfg.get("tie_word_embeddings", False))

    qkv_bias = fam.always_qkv_bias or bool(fam.qkv_bias_key and cfg.get(fam.qkv_bias_key))
    o_bias = bool(fam.o_bias_key and cfg.get(fam.o_bias_key))
    mlp_bias = bool(fam.mlp_bias_key and cfg.get(fam.mlp_bias_key))
    softcap = cfg.get("attn_logit_softcapping")

    if fam.mla:
        nope = _int(cfg, "qk_nope_head_dim")
        rope = _int(cfg, "qk_rope_head_dim")
        attn = AttentionSpec(
            num_heads=heads, num_kv_heads=heads, head_dim=nope + rope,
            v_head_dim=_int(cfg, "v_head_dim"), qkv_bias=bool(cfg.get("attention_bias")),
            o_bias=bool(cfg.get("attention_bias")), q_lora_rank=cfg.get("q_lora_rank") or None,
            kv_lora_rank=_int(cfg, "kv_lora_rank"), qk_rope_head_dim=rope,
        )
    else:
        attn = AttentionSpec(
            num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, v_head_dim=head_dim,
            qkv_bias=qkv_bias, o_bias=o_bias, qk_norm=fam.qk_norm, fused_qkv=fam.fused_qkv,
            softcap=softcap,
        )

    windows = _layer_windows(fam, cfg, n_layers)
    mlp = MlpSpec(inter, bias=mlp_bias, fused_gate_up=fam.fused_gate_up)
    moe_layers = _moe_layers(fam, cfg, n_layers)
    moe = _moe_spec(fam, cfg) if any(moe_layers) else None

    # group consecutive identical layers (structure only: window and dense/moe)
    groups: list[LayerGroup] = []
    for i in range(n_layers):
        g = LayerGroup(1, attn, None if moe_layers[i] else mlp, moe if moe_layers[i] else None,
                       fam.norms_per_layer, windows[i])
        if groups and _same(groups[-1], g):
            last = groups[-1]
            groups[-1] = LayerGroup(last.count + 1, last.attention, last.mlp, last.moe,
                                    last.norms_per_layer, last.window)
        else:
            groups.append(g)
    # merge non-adjacent identical groups (alternating sliding/full) for compactness
    merged: list[LayerGroup] = []
    for g in groups:
        for j, m in enumerate(merged):
            if _same(m, g):
                merged[j] = LayerGroup(m.count + g.count, m.attention, m.mlp, m.moe, m.norms_per_layer, m.window)
                break
        else:
            merged.append(g)

    mpe = cfg.get("max_position_embeddings")
    return ModelSpec(
        name=name or hf_id or mt,
        family=mt,
        hidden_size=h,
        num_layers=n_layers,
        vocab_size=vocab,
        tie_word_embeddings=tie,
        groups=tuple(merged),
        max_position_embeddings=mpe if isinstance(mpe, int) else None,
        final_logit_softcap=cfg.get("final_logit_softcapping"),
        hf_id=hf_id,
        source=source,
        config=dict(raw),
    )


def _same(a: LayerGroup, b: LayerGroup) -> bool:
    return (a.attention, a.mlp, a.moe, a.norms_per_layer, a.window) == (
        b.attention, b.mlp, b.moe, b.norms_per_layer, b.window)


def _layer_windows(fam: Family, cfg: Mapping[str, Any], n: int) -> list[int | None]:
    window = cfg.get("sliding_window")
    if not window:
        return [None] * n
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == n:
        return [window if t == "sliding_attention" else None for t in types]
    mt = fam.model_type
    if mt == "gemma2":
        return [window if (i + 1) % 2 else None for i in range(n)]
    if mt == "gemma3_text":
        pattern = cfg.get("sliding_window_pattern") or 6
        return [window if (i + 1) % pattern else None for i in range(n)]
    if mt in ("qwen2", "qwen3", "qwen3_moe"):
        if not cfg.get("use_sliding_window"):
            return [None] * n
        start = cfg.get("max_window_layers") or 0
        return [window if i >= start else None for i in range(n)]
    return [window] * n  # mistral, phi3: every layer


def _moe_layers(fam: Family, cfg: Mapping[str, Any], n: int) -> list[bool]:
    if fam.moe == "mixtral":
        return [True] * n
    if fam.moe == "qwen3_moe":
        step = cfg.get("decoder_sparse_step") or 1
        only_mlp = set(cfg.get("mlp_only_layers") or [])
        experts = cfg.get("num_experts") or 0
        return [(i not in only_mlp) and experts > 0 and (i + 1) % step == 0 for i in range(n)]
    if fam.moe == "deepseek_v3":
        k = cfg.get("first_k_dense_replace") or 0
        return [i >= k for i in range(n)]
    return [False] * n


def _moe_spec(fam: Family, cfg: Mapping[str, Any]) -> MoeSpec:
    h_inter = cfg.get("moe_intermediate_size")
    if fam.moe == "mixtral":
        return MoeSpec(_int(cfg, "num_local_experts"), _int(cfg, "num_experts_per_tok"),
                       _int(cfg, "intermediate_size"))
    if fam.moe == "qwen3_moe":
        return MoeSpec(_int(cfg, "num_experts"), _int(cfg, "num_experts_per_tok"),
                       _int(cfg, "moe_intermediate_size"), router="qwen3_moe")
    shared_n = cfg.get("n_shared_experts") or 0
    shared = MlpSpec(h_inter * shared_n) if shared_n else None
    return MoeSpec(_int(cfg, "n_routed_experts"), _int(cfg, "num_experts_per_tok"),
                   _int(cfg, "moe_intermediate_size"), shared, router="deepseek_v3")
