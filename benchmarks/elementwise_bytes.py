"""Memory-bound traffic of a real decoder layer, per token, against ftplan's op inventory.

    python benchmarks/elementwise_bytes.py [--write]

A tiny Llama layer (transformers, sdpa, hidden 256, intermediate 688) on CPU, counted by
``ftplan.measure.opbytes`` (aten ops' bytes, GEMMs and attention left out, per token from two
token counts), in the three stream dtypes ftplan plans for on one GPU:

* ``bf16 stream``: a bf16 base (LoRA / QLoRA with the TRL recipe, pure bf16 full fine-tuning):
  the inventory the runtime model uses (tests/test_elementwise_bytes_vs_torch.py holds it);
* ``fp32 stream, autocast``: mixed-precision full fine-tuning with fp32 weights on one GPU / DDP
  (HF Trainer ``bf16=True``): the embeddings are fp32, so the residual stream and the norms run in
  fp32 and autocast casts each linear's input separately; priced today with the bf16 inventory.

``--write`` stores the figures in benchmarks/measurements/elementwise_bytes_cpu.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256,
         "intermediate_size": 688, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 1000, "max_position_embeddings": 1024}


def measure() -> dict:
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    from ftplan.catalog.efficiency import efficiency
    from ftplan.job import Job, LoraSpec
    from ftplan.measure.opbytes import bytes_per_token
    from ftplan.model import model_from_config
    from ftplan.runtime import _elementwise_dims

    cfg = AutoConfig.for_model(**LLAMA)
    cfg._attn_implementation = "sdpa"
    eff = efficiency()
    inventory = _elementwise_dims(model_from_config(LLAMA), Job(method="lora", precision="bf16",
                                                                lora=LoraSpec(target_modules=("lm_head",))), 1, eff)[0]
    out = {"torch": torch.__version__, "transformers": transformers.__version__, "config": LLAMA,
           "inventory_forward_bytes_per_token": inventory,
           "inventory_backward_bytes_per_token": inventory * eff.elementwise_backward_factor, "cases": {}}
    for case, fp32 in (("bf16 stream", False), ("fp32 stream, autocast", True)):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg)
        if not fp32:
            model = model.to(torch.bfloat16)
            model.requires_grad_(False)
        dt = torch.float32 if fp32 else torch.bfloat16
        layer = model.model.layers[0]

        def run(tokens, layer=layer, model=model, dt=dt, fp32=fp32):
            x = torch.randn(1, tokens, LLAMA["hidden_size"], dtype=dt, requires_grad=True)
            pos = torch.arange(tokens)[None]
            pe = model.model.rotary_emb(x, pos)

            def forward():
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=fp32):
                    y = layer(x, attention_mask=None, position_ids=pos, position_embeddings=pe)
                return y[0] if isinstance(y, tuple) else y

            return forward, lambda y: y.backward(torch.ones_like(y))

        fwd, bwd, ops = bytes_per_token(run)
        out["cases"][case] = {"forward_bytes_per_token": fwd, "backward_bytes_per_token": bwd,
                              "by_op": {k: v for k, v in sorted(ops.items()) if v}}
    return out


def main(argv: list[str]) -> int:
    data = measure()
    inv_f, inv_b = data["inventory_forward_bytes_per_token"], data["inventory_backward_bytes_per_token"]
    print(f"tiny Llama layer (hidden 256, intermediate 688, sdpa), torch {data['torch']}, "
          f"transformers {data['transformers']}: bytes per token, aten ops vs ftplan's inventory")
    print(f"{'case':24s} {'forward':>9s} {'x inv.':>7s} {'backward':>9s} {'x inv.':>7s}")
    print(f"{'inventory (bf16)':24s} {inv_f:9.0f} {1:7.2f} {inv_b:9.0f} {1:7.2f}")
    for case, c in data["cases"].items():
        print(f"{case:24s} {c['forward_bytes_per_token']:9.0f} {c['forward_bytes_per_token'] / inv_f:7.2f} "
              f"{c['backward_bytes_per_token']:9.0f} {c['backward_bytes_per_token'] / inv_b:7.2f}")
    if "--write" in argv:
        path = ROOT / "benchmarks" / "measurements" / "elementwise_bytes_cpu.json"
        path.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
