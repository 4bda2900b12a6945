"""The runtime model's memory-bound traffic held against the bytes real PyTorch ops move.

``runtime._elementwise_dims`` prices a layer's non-GEMM ops from op inventories (efficiency.json
``elementwise.eager``; ``runtime.adapter_traffic_bytes`` for PEFT's LoRA adapters). Every aten op a
real transformers decoder layer and a real PEFT ``lora.Linear`` run, forward then backward, is
counted by ``ftplan.measure.opbytes`` (bytes per token, from two token counts). Dropout is CUDA's
one ``native_dropout`` kernel but three ops on CPU, so the adapters are held at ``lora_dropout=0``.
What the inventories do not cover (the fp32 residual stream of mixed-precision full fine-tuning
on one GPU) is in benchmarks/notes/elementwise_bytes.md.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from ftplan.catalog.efficiency import efficiency  # noqa: E402
from ftplan.job import Job, LoraSpec  # noqa: E402
from ftplan.measure.opbytes import bytes_per_token  # noqa: E402
from ftplan.model import model_from_config  # noqa: E402
from ftplan.runtime import _elementwise_dims, adapter_traffic_bytes  # noqa: E402

pytestmark = pytest.mark.torch


IN, OUT = 512, 1024


def _adapter_run(autocast: bool, adapter_fp32: bool):
    from peft import LoraConfig, get_peft_model

    def run(tokens):
        torch.manual_seed(0)
        base = torch.nn.Sequential(torch.nn.Linear(IN, OUT, bias=False)).to(torch.bfloat16)
        base.requires_grad_(False)
        m = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=["0"]))
        if not adapter_fp32:  # a pure-bf16 run casts the whole model (Answer.AI's train.py --precision bf16)
            m.to(torch.bfloat16)
        x = torch.randn(tokens, IN, dtype=torch.bfloat16, requires_grad=True)

        def forward():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                return m(x)

        return forward, lambda y: y.backward(torch.ones_like(y))

    return run


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16"])
def test_lora_adapter_traffic_equals_the_aten_bytes_of_peft(precision):
    """PEFT 0.21 ``lora.Linear`` on a bf16 base: under autocast with fp32 adapters (HF Trainer
    bf16-mixed, PEFT's ``autocast_adapter_dtype``), and in pure bf16 with the adapters cast to bf16
    (``model.to(bfloat16)`` after ``get_peft_model``, as Answer.AI's train.py), the bytes its
    non-GEMM ops move per token are exactly ``adapter_traffic_bytes`` x (in features, out
    features), forward and backward.

    Not modelled: a pure-bf16 run that keeps PEFT's fp32 adapters (its default) casts every input to
    fp32 and the sum back (6 B per input element and 24 per output element forward, against the 0
    and 10 priced here), while the memory model counts those adapters at 4 bytes."""
    mixed = precision == "bf16-mixed"
    job = Job(method="lora", precision=precision, lora=LoraSpec(r=16, alpha=32, dropout=0.0))
    in_f, in_b, out_f, out_b = adapter_traffic_bytes(job, efficiency())
    fwd, bwd, ops = bytes_per_token(_adapter_run(autocast=mixed, adapter_fp32=mixed))
    assert fwd == in_f * IN + out_f * OUT, ops
    assert bwd == in_b * IN + out_b * OUT


LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256,
         "intermediate_size": 688, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 1000, "max_position_embeddings": 1024}


def test_decoder_layer_inventory_is_within_two_percent_of_the_aten_bytes():
    """transformers' ``LlamaDecoderLayer`` (sdpa) on a bf16 stream: the eager inventory (84 B per
    hidden, 10 per intermediate, 20 per q/k, 4 per attention-output element) is 1.3 % above what
    its ops move, for three reasons, each counted here: the attention output's
    ``transpose(1, 2).contiguous()`` copies nothing (the sdpa kernel writes it in that layout: -4 B
    per attention-output element); rotary reads its cos / sin tables (+8 B per head dimension);
    each RMSNorm's per-token variance (mean's output, ``+ eps``, ``rsqrt``, read by the multiply:
    +24 B per norm). Backward: ``elementwise.backward_factor`` (2x the forward) against the layer's
    input-gradient ops, within 15 %."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**LLAMA)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    model.requires_grad_(False)
    layer = model.model.layers[0]

    def run(tokens):
        x = torch.randn(1, tokens, LLAMA["hidden_size"], dtype=torch.bfloat16, requires_grad=True)
        pos = torch.arange(tokens)[None]
        pe = model.model.rotary_emb(x, pos)

        def forward():
            out = layer(x, attention_mask=None, position_ids=pos, position_embeddings=pe)
            return out[0] if isinstance(out, tuple) else out

        return forward, lambda y: y.backward(torch.ones_like(y))

    fwd, bwd, ops = bytes_per_token(run)
    spec = model_from_config(LLAMA)
    eff = efficiency()
    predicted = _elementwise_dims(spec, Job(method="lora", precision="bf16", lora=LoraSpec(target_modules=("lm_head",))),
                                  1, eff)[0]
    head_dim = LLAMA["hidden_size"] // LLAMA["num_attention_heads"]
    attn_out = LLAMA["num_attention_heads"] * head_dim
    exact = predicted - eff.elementwise_eager.per_attn_out * attn_out + 8 * head_dim + 2 * 24
    assert fwd == exact, ops
    assert eff.elementwise_backward_factor * predicted == pytest.approx(bwd, rel=0.15)


@pytest.mark.parametrize("job", [Job(method="lora"), Job(method="full")], ids=["bf16-joined", "fp32-joined"])
def test_gpt_oss_eager_score_traffic(job):
    """transformers' gpt_oss eager attention (sinks joined with ``torch.cat``, the row max
    subtracted, the softmax in the joined dtype) moves per score element what
    ``runtime.sinks_eager_bytes_per_score`` prices: measured on CPU over every aten op but the
    GEMMs (whose score write and read the inventory adds, one compute-dtype element each) and
    with the mask read per head, as the inventory's convention counts it (the real broadcast mask
    is read once for all heads). LoRA on a bf16 base joins in bf16; mixed-precision full
    fine-tuning joins the bf16 scores with fp32 sinks, in fp32, and casts back for the value
    matmul. Per-row terms are separated from per-score ones with two sequence lengths."""
    from types import SimpleNamespace

    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    from ftplan.measure.opbytes import OpBytes
    from ftplan.runtime import sinks_eager_bytes_per_score

    b, heads, kv, d = 2, 8, 4, 16
    sink_dtype = torch.float32 if job.method == "full" else torch.bfloat16

    def score_bytes(s: int) -> int:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(b, h, s, d, generator=g, dtype=torch.bfloat16) for h in (heads, kv, kv))
        mask = torch.zeros(b, 1, s, s, dtype=torch.bfloat16)
        module = SimpleNamespace(num_key_value_groups=heads // kv, sinks=torch.zeros(heads, dtype=sink_dtype),
                                 training=True)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), OpBytes() as ob:
            eager_attention_forward(module, q, k, v, mask, scaling=d ** -0.5)
        return sum(ob.by_op.values())

    s1 = 64
    per_score = (score_bytes(2 * s1) - 2 * score_bytes(s1)) / (2 * s1 * s1) / (b * heads)
    c = 2
    assert sinks_eager_bytes_per_score(job, "torch") == pytest.approx(per_score + 2 * c + c * (1 - 1 / heads),
                                                                        abs=1e-9)
