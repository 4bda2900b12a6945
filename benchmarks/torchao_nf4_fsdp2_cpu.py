"""torchtune's QLoRA (torchao NF4 weights) under FSDP2 on 2 gloo processes, on CPU (by hand).

A tiny llama (hidden 256: every linear a multiple of 16384 elements, as torchao needs) built in
bf16, its decoder linears swapped for torchtune 0.3.1's QLoRA linears
(``ftplan.measure.torchtune_nf4``), ``fully_shard`` on every decoder layer and on the root as
torchtune's ``lora_finetune_distributed`` does (``shard_model`` with ``_is_layer_name``), no mixed
precision (torchtune's pure bf16), one forward + backward + AdamW step. Per rank it records:

* the bytes of every parameter's local shard (NF4 shards through their inner tensors: codes,
  scalers, factors and the per-tensor tables), frozen and trainable;
* per ``foreach_all_gather`` call, the bytes of the all-gather output (FSDP2 views mixed dtypes as
  uint8: an NF4 weight sends its codes, int8 scalers and bf16 factors, ``fsdp_pre_all_gather``);
* whether FSDP2 refuses a weight that does not split into whole rows and whole factor blocks.

Writes ``benchmarks/measurements/torchao_nf4_fsdp2_cpu.json``, which
``tests/test_torchao_nf4_qlora.py`` holds ``ftplan.sharding`` to (per-rank frozen / trainable
bytes, the decoder layer's gathered bytes). Run:
``PYTHONPATH=src python benchmarks/torchao_nf4_fsdp2_cpu.py`` (~30 s).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import warnings
from pathlib import Path

OUT = Path(__file__).resolve().parent / "measurements" / "torchao_nf4_fsdp2_cpu.json"
TARGETS = ("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
CONFIG = {"model_type": "llama", "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 256, "tie_word_embeddings": False}
RANK, ALPHA, BATCH, SEQ = 8, 16, 2, 16


def _worker(rank: int, world: int, port: int, outdir: str) -> None:
    warnings.simplefilter("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as C
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as G

    from ftplan.measure.lowprec_ref import param_storage_bytes
    from ftplan.measure.torchref import build_model
    from ftplan.measure.torchtune_nf4 import fsdp2_shard_bytes, quantize_like_torchtune

    dist.init_process_group("gloo", rank=rank, world_size=world)
    res: dict = {"rank": rank}
    gathers: list[int] = []
    orig = C.foreach_all_gather

    def recording(*a, **k):
        r = orig(*a, **k)
        if r is not None:
            gathers.append(r.all_gather_output.numel() * r.all_gather_output.element_size())
        return r

    C.foreach_all_gather = G.foreach_all_gather = recording
    try:
        model = build_model(CONFIG, dtype="bf16", attn_implementation="sdpa")
        quantize_like_torchtune(model, set(TARGETS), RANK, ALPHA)
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)

        def local(p):
            return p._local_tensor if hasattr(p, "_local_tensor") else p

        params = list(model.parameters())
        res["frozen_shard_bytes"] = param_storage_bytes(local(p) for p in params if not p.requires_grad)
        res["trainable_shard_bytes"] = param_storage_bytes(local(p) for p in params if p.requires_grad)
        torch.manual_seed(0)
        ids = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ))
        opt = torch.optim.AdamW([p for p in params if p.requires_grad], lr=1e-4)
        res["gathers_before_forward"] = len(gathers)
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        res["forward_gathers"] = list(gathers[res.pop("gathers_before_forward"):])
        loss.backward()
        opt.step()
        res["all_gathers"] = list(gathers)
        res["grad_shard_bytes"] = param_storage_bytes(local(p.grad) for p in params if p.grad is not None)
        res["ok"] = True
    except Exception as e:  # recorded, not raised: the other rank must not hang
        res.update(ok=False, error=f"{type(e).__name__}: {e}")
    # what torchao does with weights that do not split (torchtune's loader cuts the NF4 tensor itself)
    refused = {}
    for rows, cols in ((3, 16384), (512, 32), (2, 16384)):
        try:
            fsdp2_shard_bytes(rows, cols, world)
            refused[f"{rows}x{cols}"] = ""
        except Exception as e:
            refused[f"{rows}x{cols}"] = f"{type(e).__name__}: {e}"[:120]
    res["split"] = refused
    # a weight that FSDP2's own fully_shard cannot pad: 3 rows over 2 ranks
    try:
        from ftplan.measure.torchtune_nf4 import FrozenNF4Linear

        m = torch.nn.Sequential(FrozenNF4Linear(torch.randn(3, 16384, dtype=torch.bfloat16)))
        fully_shard(m)
        res["fully_shard_3_rows"] = ""
    except Exception as e:
        res["fully_shard_3_rows"] = f"{type(e).__name__}: {e}"[:160]
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()


def main() -> int:
    import torch
    import torch.multiprocessing as mp

    import torchao

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(_worker, args=(2, port, d), nprocs=2, start_method="spawn")
        ranks = [json.loads(Path(d, f"rank{r}.json").read_text()) for r in range(2)]
    doc = {"_doc": "torchtune 0.3.1 QLoRA linears (torchao NF4) under FSDP2, 2 gloo ranks on CPU, "
                   "benchmarks/torchao_nf4_fsdp2_cpu.py; bytes per rank",
           "torch": torch.__version__, "torchao": torchao.__version__, "config": CONFIG,
           "targets": list(TARGETS), "lora_r": RANK, "lora_alpha": ALPHA, "batch": BATCH, "seq_len": SEQ,
           "world": 2, "ranks": ranks}
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(ranks, indent=1))
    return 0 if all(r.get("ok") for r in ranks) else 1


if __name__ == "__main__":
    sys.exit(main())
