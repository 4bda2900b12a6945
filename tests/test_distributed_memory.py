"""Per-rank memory of DDP, FSDP1/FSDP2 and DeepSpeed ZeRO-1/2/3 against real multi-process runs.

Every case runs in gloo process groups on CPU (``ftplan.measure.distributed``: one spawn per
group of cases), on tiny real Hugging Face models (llama, qwen2 with tied embeddings and q/k/v
biases, mixtral as the MoE family; deepseek_v3's LoRA for its fp32 router in a bf16 base and its
full fine-tuning under FSDP2's autocast; gpt_oss for its sinks and biased experts; glm4_moe with
LoRA under FSDP2 and in full under FSDP1/FSDP2 and ZeRO-3; qwen3_5 with LoRA under FSDP2 and in full
under FSDP2 and ZeRO-3; qwen3_5_moe in full under ZeRO-3, with LoRA under FSDP2 and ZeRO-3; qwen3_next
in full and with LoRA under FSDP2 and ZeRO-3; olmo3 in full and LoRA under ZeRO-3, smollm3 with LoRA
under FSDP2; llama4_text in full and with LoRA under FSDP2 and ZeRO-3, in full under FSDP1, QLoRA under
FSDP2; glm4_moe_lite with LoRA under FSDP2 and in full under ZeRO-3; minimax_m2 with LoRA under
FSDP2 and ZeRO-3), and
every byte each rank holds is counted through a
``TorchDispatchMode``. The formulas (``ftplan.sharding.layout_memory``, CPU form) must give:

* byte-exact: the parameter shards (or replicas), the gradients alive when backward ends, the
  optimizer states, DeepSpeed's fp32 master partitions, the bytes offloaded to the host, and the
  engine's transient peak of FSDP1/FSDP2 (gathered units, prefetches, unsharded gradients,
  reduce-scatter buffers, unit by unit), and the saved activations on the engines' bf16 weights
  (FSDP under accelerate's autocast, DeepSpeed's bf16 mode without it: ``sharding.engine_compute``),
  LoRA and QLoRA included: PEFT's adapters are bf16 during compute, so it casts nothing and each
  ``lora_A`` keeps the layer's own input; ZeRO-3's ``F.linear`` replacement keeps the inputs of
  frozen linears too;
* within a stated bound, where the engine keeps bytes the formula does not name one by one:
  a late DeepSpeed ZeRO-1/2 gradient (timing), its small scalars and ZeRO-3's persistent
  parameters gathered twice, which ZeRO-3 LoRA/QLoRA prefetch group is held twice in forward,
  DDP's broadcast of the model buffers (see ``BOUNDS``).

What runs where and what does not (with the errors) is in ``benchmarks/notes/distributed_cpu.md``.

CI runs every strategy on llama, qwen2 and mixtral and every family above at least once; the cases
in :data:`BY_HAND` (ZeRO-3 cases of a family whose mechanisms another CI case holds: gemma4 within
gemma4_moe, qwen3_5 and qwen3_next within qwen3_5_moe, llama4_text LoRA within its QLoRA, mistral4
within glm4_moe_lite and glm4_moe; ~2-8 s each on 2 cores) run by hand, in the same process group
and with the same checks::

    FTPLAN_DIST_ALL=1 PYTHONPATH=src python -m pytest -p no:cacheprovider -q tests/test_distributed_memory.py
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from fractions import Fraction

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from ftplan.catalog.constants import memory_constants  # noqa: E402
from ftplan.measure import torchref as TR  # noqa: E402
from ftplan.measure.distributed import Case, RankMeasure, run_cases  # noqa: E402
from ftplan.job import lora_targets  # noqa: E402
from ftplan.memory import model_states, saved_activation_bytes  # noqa: E402
from ftplan.model import model_from_config  # noqa: E402
from ftplan.sharding import activation_job, engine_compute, layout_memory, zero12_rank_bytes  # noqa: E402

pytestmark = pytest.mark.torch

HAS_DS = importlib.util.find_spec("deepspeed") is not None
HAS_PEFT = importlib.util.find_spec("peft") is not None
HAS_BNB = importlib.util.find_spec("bitsandbytes") is not None

#: 2-rank cases (all run in one process group)
TORCH_CASES = [
    Case(family="llama", engine="fsdp2"),
    Case(family="qwen2", engine="fsdp2"),
    Case(family="mixtral", engine="fsdp2"),
    Case(family="llama", engine="fsdp2", reshard_after_forward=False),
    Case(family="mixtral", engine="fsdp2", reshard_after_forward=False),
    Case(family="qwen2", engine="fsdp2", reshard_after_forward=False),
    Case(family="qwen2", engine="fsdp2", offload_params=True),
    Case(family="mixtral", engine="fsdp2", offload_params=True),
    Case(family="llama", engine="fsdp2", offload_params=True),
    # torchtitan's fp32 gradient reduce-scatter (MixedPrecisionPolicy / MixedPrecision reduce_dtype)
    Case(family="llama", engine="fsdp2", reduce_fp32=True),
    Case(family="mixtral", engine="fsdp2", reduce_fp32=True, offload_params=True),
    Case(family="llama", engine="fsdp1"),
    Case(family="llama", engine="fsdp1", reduce_fp32=True),
    Case(family="qwen2", engine="fsdp1", reshard_after_forward=False),
    Case(family="mixtral", engine="fsdp1", offload_params=True),
    Case(family="llama", engine="fsdp1", offload_params=True),
    Case(family="qwen2", engine="fsdp1", offload_params=True),
    Case(family="mixtral", engine="fsdp1"),
    Case(family="llama", engine="ddp"),
    Case(family="qwen2", engine="ddp", ddp_bucket_view=True),
    Case(family="mixtral", engine="ddp"),
    # gpt_oss: attention sinks, biased experts and router, eager attention
    Case(family="gpt_oss", engine="fsdp2"),
    Case(family="gpt_oss", engine="fsdp1", offload_params=True),
    # the fp32 router path (deepseek_v3's, repeated by glm4_moe) on FSDP's bf16 router weight under
    # accelerate's autocast: the upcast weight and input are cast back to bf16, the logits, scores
    # and top-k weights are bf16, and the linear saves a fresh bf16 copy of the weight
    # (sharding.engine_compute "autocast"; DeepSpeed's bf16 mode has no autocast: glm4_moe ZeRO-3 below)
    Case(family="glm4_moe", engine="fsdp2"),
    Case(family="deepseek_v3", engine="fsdp2"),
    Case(family="glm4_moe", engine="fsdp1"),
    # qwen3_5's torch delta rule under the same autocast: its matmuls save bf16 copies of their fp32
    # operands (ftplan left them out before: 311,296 B over per rank)
    Case(family="qwen3_5", engine="fsdp2"),
    # qwen3_next: fused DeltaNet projections, qwen2_moe's block with its 1-row shared_expert_gate
    # (on rank 0 alone: BOUNDS["fsdp2_one_row_states"]), a dense layer
    Case(family="qwen3_next", engine="fsdp2"),
    # llama4_text: dense-dispatch experts (bmm), a shared expert, chunked / NoPE attention
    Case(family="llama4_text", engine="fsdp2"),
    Case(family="llama4_text", engine="fsdp1"),
    # gemma4: sliding/full layers of two head sizes (the units in the layers' interleaved order),
    # k = v on the full ones, fp32 norms that copy the gathered bf16 weights
    Case(family="gemma4", engine="fsdp2"),
    # gemma4's MoE block: a dense MLP beside the experts, the router's Linear and two scale vectors
    Case(family="gemma4_moe", engine="fsdp2"),
    # mistral4: MLA, DeepSeek-V3's block with a compute-dtype softmax router, llama-4 query scaling
    Case(family="mistral4", engine="fsdp2"),
]
PEFT_CASES = [Case(family="mixtral", engine="fsdp2", method="lora"),
              # PEFT's all-linear adapts only gpt_oss's attention: its experts stay frozen
              Case(family="gpt_oss", engine="fsdp2", method="lora"),
              # a bf16 base whose router transformers (>= 5.24) keeps in fp32: FSDP2 shards each
              # parameter in its own dtype
              Case(family="deepseek_v3", engine="fsdp2", method="lora"),
              # glm4_moe (its q/k/v biases, q/k norms, dense first layer, shared experts, fp32 router);
              # its full fine-tuning is held under FSDP1/FSDP2 above and ZeRO-3 below
              Case(family="glm4_moe", engine="fsdp2", method="lora"),
              # qwen3_5: Gated DeltaNet layers (conv1d, dt_bias, A_log, gated norm) around a gated-attention
              # layer; its full fine-tuning is held under FSDP2 above and ZeRO-3 below
              Case(family="qwen3_5", engine="fsdp2", method="lora"),
              # qwen2_moe's block: the wrapped router and the gate's LoRA read the block's input, one
              # storage (ftplan counted it twice before: 12,288 B over per rank); qwen3_5_moe: its
              # shared expert's and gate's adapters share it too (18,432 B over before)
              Case(family="qwen3_next", engine="fsdp2", method="lora"),
              Case(family="qwen3_5_moe", engine="fsdp2", method="lora"),
              # smollm3: a NoPE layer among llama layers (tied embeddings). Not olmo2/olmo3: OLMo's
              # rotary tables are fp32 and FSDP2 (cast_forward_inputs) casts them to bf16 at every
              # decoder layer's pre-forward, engine-made copies the layers save, which this harness
              # files under the engine (tests/test_olmo.py holds them apart)
              Case(family="smollm3", engine="fsdp2", method="lora"),
              # llama4_text: the LoRA targets all-linear stands for (PEFT wraps its router and fails)
              Case(family="llama4_text", engine="fsdp2", method="lora"),
              Case(family="gemma4", engine="fsdp2", method="lora"),
              Case(family="gemma4_moe", engine="fsdp2", method="lora"),
              # FSDP1 as HF Trainer wraps a PEFT model: PEFT's fsdp_auto_wrap_policy (every lora_A /
              # lora_B its own unit), accelerate's fp32 upcast of trainable flat parameters; llama's
              # second step: the adapters' bf16 views PEFT sees from the first unshard on (the
              # first step's views are still fp32: see _check)
              Case(family="llama", engine="fsdp1", method="lora", steps=2),
              Case(family="qwen2", engine="fsdp1", method="lora"),
              # with CPU offload: FSDP1's pinned CPU gradient buffer exists for the frozen flat
              # parameters too (a second copy of the frozen shards in host RAM)
              Case(family="qwen2", engine="fsdp1", method="lora", offload_params=True),
              Case(family="qwen2", engine="fsdp2", method="lora", reduce_fp32=True),
              Case(family="qwen2", engine="fsdp1", method="lora", reduce_fp32=True),
              # the LoRA base loaded in fp32 (TRL's default for a model id): fp32 shards, gathered in bf16
              Case(family="llama", engine="fsdp1", method="lora", base_fp32=True),
              Case(family="qwen2", engine="fsdp2", method="lora", base_fp32=True),
              # LoRA dropout on the bf16 adapters: the dropout's bf16 output and (on CPU) bf16 mask
              Case(family="llama", engine="fsdp2", method="lora", lora_dropout=0.1),
              # glm4_moe_lite: MLA (equal q/k and v head dims) with the wrapped fp32 router and experts
              Case(family="glm4_moe_lite", engine="fsdp2", method="lora"),
              # mistral4: PEFT's all-linear adapts the nn.Linear modules only (no MoE mapping)
              Case(family="mistral4", engine="fsdp2", method="lora"),
              # minimax_m2: whole-projection q/k norms, a half rotary, the wrapped sigmoid router and
              # experts (FSDP2 full and ZeRO-3 full hold too, run by hand, not added)
              Case(family="minimax_m2", engine="fsdp2", method="lora")]
QLORA_CASES = [Case(family="llama", engine="fsdp2", method="qlora"), Case(family="qwen2", engine="fsdp2", method="qlora"),
               Case(family="mixtral", engine="fsdp2", method="qlora"), Case(family="gpt_oss", engine="fsdp2", method="qlora"),
               # FSDP1 QLoRA (bf16 quant storage: transformers' update_fsdp_plugin_peft mixed precision)
               Case(family="llama", engine="fsdp1", method="qlora"), Case(family="qwen2", engine="fsdp1", method="qlora"),
               Case(family="llama", engine="fsdp1", method="qlora", offload_params=True),
               # llama4_text: its 3-D experts and router stay bf16 (no Linear4bit)
               Case(family="llama4_text", engine="fsdp2", method="qlora")]
#: ZeRO-3 runs two steps: DeepSpeed traces the module order in the first one and from then on
#: keeps gathered what its trace reuses soon (the steady state)
DS_CASES = [
    Case(family="llama", engine="deepspeed", zero_stage=1),
    Case(family="qwen2", engine="deepspeed", zero_stage=1),
    Case(family="mixtral", engine="deepspeed", zero_stage=1),
    Case(family="llama", engine="deepspeed", zero_stage=2),
    Case(family="qwen2", engine="deepspeed", zero_stage=2),
    Case(family="mixtral", engine="deepspeed", zero_stage=2),
    Case(family="llama", engine="deepspeed", zero_stage=3, steps=2),
    Case(family="qwen2", engine="deepspeed", zero_stage=3, steps=2),
    Case(family="mixtral", engine="deepspeed", zero_stage=3, steps=2),
    Case(family="gpt_oss", engine="deepspeed", zero_stage=3, steps=2),
    Case(family="glm4_moe", engine="deepspeed", zero_stage=3, steps=2),
    Case(family="qwen3_5", engine="deepspeed", zero_stage=3, steps=2),
    # qwen3_5_moe: the hybrid layers with Qwen3.5's MoE block (fused experts, shared expert and its
    # 1-row shared_expert_gate: under FSDP2 on rank 0 alone, see BOUNDS["fsdp2_one_row_states"])
    Case(family="qwen3_5_moe", engine="deepspeed", zero_stage=3, steps=2),
    Case(family="qwen3_next", engine="deepspeed", zero_stage=3, steps=2),
    # olmo3: post-norms, whole-projection q/k norms, fp32 rope tables (one pair per layer type),
    # sliding/full layers; DeepSpeed's bf16 mode has no autocast and casts no forward inputs
    Case(family="olmo3", engine="deepspeed", zero_stage=3, steps=2),
    Case(family="llama4_text", engine="deepspeed", zero_stage=3, steps=2),
    # glm4_moe_lite: MLA attention and DeepSeek-V3's MoE block in DeepSpeed's bf16 mode (fp32 router path)
    Case(family="glm4_moe_lite", engine="deepspeed", zero_stage=3, steps=2),
    Case(family="qwen2", engine="deepspeed", zero_stage=2, offload_optimizer=True),
    Case(family="llama", engine="deepspeed", zero_stage=2, offload_optimizer=True),
    Case(family="mixtral", engine="deepspeed", zero_stage=2, offload_optimizer=True),
    Case(family="llama", engine="deepspeed", zero_stage=3, offload_optimizer=True, offload_params=True, steps=2),
    Case(family="qwen2", engine="deepspeed", zero_stage=3, offload_optimizer=True, offload_params=True, steps=2),
    Case(family="mixtral", engine="deepspeed", zero_stage=3, offload_optimizer=True, offload_params=True, steps=2),
    # an explicit reduce_bucket_size (Layout.ds_reduce_bucket_size; DeepSpeed's own default, 5e8,
    # when no JSON config is given): the ipg bucket is allocated at that size (a bucket smaller than
    # the largest gradient keeps the flush regime of the auto bucket: see distributed_cpu.md)
    Case(family="qwen2", engine="deepspeed", zero_stage=3, steps=2, reduce_bucket_size=3_000),
    Case(family="gemma4", engine="deepspeed", zero_stage=3, steps=2),
    Case(family="gemma4_moe", engine="deepspeed", zero_stage=3, steps=2),
    Case(family="mistral4", engine="deepspeed", zero_stage=3, steps=2),
]
#: ZeRO-1/2 + LoRA (before the ZeRO-3 cases, whose F.linear replacement stays for the process).
#: gpt_oss ZeRO-2 LoRA: its flat adapters put a partition boundary inside a bucket of small
#: gradients that ZeRO-2 all-reduces as one flattened copy (sharding.zero12_rank_bytes; 7,172 B
#: under before, exact since on most runs). In about 1 run of 3 (2026-11-25) a rank still held
#: that copy when backward ended: filed under grads (17,408 B on both ranks, 18,432 B on rank 0 in 2
#: of 5 runs alone, against 10,240) and out of the transient (17,412 against 25,600):
#: BOUNDS["ds_flat_copy"]; 5 of 5 runs alone within it
DS_LORA12_CASES: list[Case] = [Case(family="gpt_oss", engine="deepspeed", zero_stage=2, method="lora")]
#: ZeRO-3 + QLoRA (bitsandbytes nf4 in bf16 quant storage)
#: (mixtral is not in CI: its prefetch group of an expert weight can be held next to one more
#: buffer on rank 0, 4,916 B above the formula's upper bound in 1 run of 2 on 2026-11-25 (36,864 B
#: above the former bound in about 1 run of 4 before); see benchmarks/notes/distributed_cpu.md)
DS_QLORA_CASES = [Case(family="llama", engine="deepspeed", zero_stage=3, method="qlora", steps=2),
                  # qwen2: tied embeddings (the embedding is the lm_head: gathered through backward)
                  Case(family="qwen2", engine="deepspeed", zero_stage=3, method="qlora", steps=2),
                  # llama4_text: its text model reads embed_tokens.weight in its own forward, which
                  # makes the embedding an external parameter of that module, held all step
                  Case(family="llama4_text", engine="deepspeed", zero_stage=3, method="qlora", steps=2),
                  # LoRA on DeepSpeed's bf16 cast: bf16 adapters (no cast of the input), ZeRO-3's
                  # linear keeping the frozen lm_head's input; mixtral: PEFT's wrapped router
                  Case(family="llama", engine="deepspeed", zero_stage=3, method="lora", steps=2),
                  Case(family="mixtral", engine="deepspeed", zero_stage=3, method="lora", steps=2),
                  # frozen base linears whose inputs only ZeRO-3's linear keeps, with dropout
                  Case(family="qwen2", engine="deepspeed", zero_stage=3, method="lora", steps=2,
                       lora_targets="q_proj,k_proj,down_proj", lora_dropout=0.1),
                  # the wrapped fp32 router path on DeepSpeed's cast: an fp32 copy of the merged weight
                  Case(family="glm4_moe", engine="deepspeed", zero_stage=3, method="lora", steps=2),
                  # Gated DeltaNet layers: ZeRO-3's F.linear keeps the in_proj_* / out_proj inputs too
                  Case(family="qwen3_5", engine="deepspeed", zero_stage=3, method="lora", steps=2),
                  # the MoE block's input, kept by the router (wrapped, or ZeRO-3's linear), the frozen
                  # shared expert and the gate's adapter: one storage (24,576 B over per rank before)
                  Case(family="qwen3_next", engine="deepspeed", zero_stage=3, method="lora", steps=2),
                  Case(family="qwen3_5_moe", engine="deepspeed", zero_stage=3, method="lora", steps=2),
                  # olmo3: q/k/v and gate/up read the residual stream (no input norm) under ZeRO-3's linear
                  Case(family="olmo3", engine="deepspeed", zero_stage=3, method="lora", steps=2),
                  # llama4_text: the LoRA targets all-linear stands for (PEFT wraps its router and fails)
                  Case(family="llama4_text", engine="deepspeed", zero_stage=3, method="lora", steps=2),
                  Case(family="gemma4", engine="deepspeed", zero_stage=3, method="lora", steps=2),
                  Case(family="gemma4_moe", engine="deepspeed", zero_stage=3, method="lora", steps=2),
                  # minimax_m2: the wrapped router and experts in DeepSpeed's bf16 mode, ZeRO-3's linear
                  Case(family="minimax_m2", engine="deepspeed", zero_stage=3, method="lora", steps=2)]
#: ZeRO-3 with stage3_max_live_parameters / max_reuse_distance (20,000) and the prefetch bucket
#: (5,000) lowered under the tiny model's size, the regime of every real model under ftplan's 1e9:
#: checked by tests/test_zero3_live_limit.py (an upper bound, not by _check), run in this process
#: group to save a spawn. mixtral LoRA: its MoE block is a DeepSpeed default leaf module (gathered
#: whole) and the expert adapters' views outlive their release
DS_LIVE_CASES = [Case(family="mixtral", engine="deepspeed", zero_stage=3, method="lora", steps=2,
                      max_live=20_000, reuse_distance=20_000, prefetch_bucket=5_000)]
#: torchtune's own FSDP2 wrapping (pure bf16, its units, the output called per loss chunk, CPU
#: offload): run in this process group to save a spawn, checked by tests/test_torchtune_wrapping.py
#: (the grid: benchmarks/torchtune_wrap_cpu.py), not by _check
TORCHTUNE_WRAP_CASES = [Case(family="llama", engine="fsdp2", method="full", fsdp_wrap="torchtune", seq_len=24,
                             offload_params=True)]
#: OLMo 3 LoRA under FSDP2 with the saved-tensor log: run in this process group to save a spawn,
#: checked by tests/test_olmo.py (the engine's bf16 copies of the fp32 RoPE tables), not by _check
OLMO_SAVED_CASES = [Case(family="olmo3", engine="fsdp2", method="lora", saved_log=True)]
#: run by hand only (``FTPLAN_DIST_ALL=1``, see the module docstring): ZeRO-3 cases whose mechanisms
#: a CI case holds, each named below. Each costs 2-8 s of the 2-core CI (DeepSpeed's per-module
#: hooks over two steps); every one of them held when they were moved out (2026-11-25)
BY_HAND = {
    # gemma4_moe's tiny config is gemma4's plus the MoE block (every layer keeps its dense MLP):
    # gemma4_moe ZeRO-3 full and LoRA hold all of gemma4's layers (gemma4 FSDP2 stays in CI)
    Case(family="gemma4", engine="deepspeed", zero_stage=3, steps=2),
    Case(family="gemma4", engine="deepspeed", zero_stage=3, method="lora", steps=2),
    # qwen3_5_moe has qwen3_5's layers (Gated DeltaNet with its in_proj_* / out_proj, the gated
    # attention, mrope) with the MoE block: its ZeRO-3 full and LoRA cases hold them (the tied
    # embedding under ZeRO-3: qwen2); qwen3_5 FSDP2 full and LoRA stay in CI
    Case(family="qwen3_5", engine="deepspeed", zero_stage=3, steps=2),
    Case(family="qwen3_5", engine="deepspeed", zero_stage=3, method="lora", steps=2),
    # qwen3_next: the DeltaNet (fused in_proj_qkvz / in_proj_ba: plain linears to ZeRO-3) and the
    # shared expert's gate whose block input is one storage (held by qwen3_5_moe ZeRO-3 LoRA, the
    # same fix); qwen3_next FSDP2 full and LoRA stay in CI
    Case(family="qwen3_next", engine="deepspeed", zero_stage=3, steps=2),
    Case(family="qwen3_next", engine="deepspeed", zero_stage=3, method="lora", steps=2),
    # llama4_text ZeRO-3 LoRA: the same all-linear targets, frozen bf16 experts/router and frozen
    # embedding held all step as its ZeRO-3 QLoRA case (in CI), LoRA vs QLoRA on ZeRO-3: llama
    Case(family="llama4_text", engine="deepspeed", zero_stage=3, method="lora", steps=2),
    # mistral4 ZeRO-3 full: MLA under DeepSpeed's bf16 mode is glm4_moe_lite's, the DeepSeek-V3
    # block glm4_moe's and glm4_moe_lite's (its compute-dtype router is the plain path); mistral4
    # FSDP2 full and LoRA stay in CI
    Case(family="mistral4", engine="deepspeed", zero_stage=3, steps=2),
}
#: FTPLAN_DIST_ALL=1: the BY_HAND cases run too
RUN_ALL = os.environ.get("FTPLAN_DIST_ALL", "") not in ("", "0")
#: the two_ranks results of this session (tests/test_zero3_live_limit.py reads its cases here)
TWO_RANK_RESULTS: dict = {}
#: 4 ranks: shard degree 4, and HSDP (2 replicas x 2 shards)
FOUR_CASES = [
    Case(family="llama", engine="fsdp2"),
    # HSDP keeps every unit's all-reduce buffer until backward ends (torch 2.13 _all_reduce_state):
    # on untied llama the tail unit's, reduced first, is still alive at layer 0's backward
    Case(family="llama", engine="fsdp2", replicate=2),
    Case(family="qwen2", engine="fsdp2", replicate=2),
    Case(family="mixtral", engine="fsdp2", replicate=2),
]


#: FSDP2's buffer lifetimes as the installed torch has them (2.15 frees two earlier than 2.13)
_CONSTS = dataclasses.replace(memory_constants(), fsdp2_schedule_torch=float(
    ".".join(torch.__version__.split("+")[0].split(".")[:2])))


def _predict(case: Case, world: int, first_step_views: bool = False) -> dict[str, Fraction]:
    spec = model_from_config(TR.TINY_CONFIGS[case.family])
    job, layout = case.job(), case.layout(world)
    st = model_states(spec, job)
    lm = layout_memory(spec, job, layout, st, _CONSTS, "cpu")
    act_job = activation_job(job, lm)
    # the harness's token ids are made before the forward (not counted); the formula counts them
    # where the embedding saves them for its gradient (full fine-tuning)
    # (FSDP runs under accelerate's autocast, DeepSpeed's bf16 mode without: sharding.engine_compute)
    ids = job.micro_batch * job.seq_len * 8 if job.method == "full" else 0
    ec = engine_compute(job, layout)
    if first_step_views:
        # FSDP1 (use_orig_params=False), first step: PEFT reads the adapters' dtype from the views
        # FSDP1 made of the fp32 flat parameter at wrap time and casts the input to fp32 (autocast
        # makes a bf16 copy of it per adapter, as on one GPU); from the first unshard on the views
        # are of the bf16 unsharded flat parameter
        ec = ""
    act = saved_activation_bytes(spec, act_job, layout, backend="cpu", engine_compute=ec,
                                 quantized_base=job.method == "qlora") - ids
    return {"frozen": lm.frozen_weights, "trainable": lm.trainable_weights, "master": lm.master_weights,
            "grads": lm.gradients, "optimizer": lm.optimizer_states, "buffers": lm.comm_buffers,
            "transient": lm.transient, "host": lm.host, "activations": act, "engine": layout.engine,
            "offloaded": layout.offload_params or layout.offload_optimizer}


def _check(case: Case, world: int, m: RankMeasure) -> list[str]:
    """Differences between the measured rank ``m`` and the prediction (empty: all hold)."""
    p = _predict(case, world)
    bad = []

    def eq(name, measured, predicted, bound=0):
        if not abs(measured - predicted) <= bound:
            bad.append(f"{name}: measured {measured}, predicted {float(predicted):.0f} (bound {bound})")

    eng = p["engine"]
    params = p["frozen"] + p["trainable"]
    if eng in ("fsdp1", "fsdp2"):
        # FSDP1 keeps a bf16 copy of the model's buffers (MixedPrecision buffer_dtype), made in forward
        cast = BOUNDS["fsdp1_buffer_cast"] if eng == "fsdp1" else 0
        persistent = m.engine_persistent - m.detail.get("persistent_by_owner", {}).get("init:model", 0)
        if case.offload_params:
            # on CPU the host and the "device" are one memory: the offloaded shards are measured
            # where the engine keeps them, and all of them are host bytes
            # (on some ranks gloo's work object still references the last unit's reduce-scatter
            # input when backward ends: at most one unit's unsharded bf16 gradients)
            slack = BOUNDS["offload_last_reduce"](case)
            # bitsandbytes' quantization states are not FSDP parameters: they stay on the device
            # (the formula's only device-resident model state here); the harness counts them with
            # the parameters, all host memory on CPU
            qstate = p["frozen"]
            eq("host", m.host - qstate - (cast + slack) / 2, p["host"], (cast + slack) / 2)
            assert p["trainable"] == p["optimizer"] == 0
            assert p["grads"] == 0 or eng == "fsdp1"
            assert qstate == 0 or case.method == "qlora"
            if eng == "fsdp1":
                # FSDP1's offload keeps one more fp32 gradient shard (its CPU gradient buffer next
                # to the gradient it copies in; on a GPU the latter is a device transient)
                persistent -= m.params - qstate
        else:
            qstate = m.detail.get("persistent_by_owner", {}).get("init:model", 0)  # bnb quant states
            eq("params", m.params + qstate, params)
            # (on some ranks the last reduced unit's unsharded bf16 gradient is still referenced by
            # gloo's reduce-scatter work when backward ends: timing-dependent, seen as +65,664 B
            # (FSDP1 qwen2), +65,536 B (FSDP2 mixtral), +58,944 B (FSDP2 mixtral LoRA) in about 1 run of 3)
            late = cast + BOUNDS["last_reduce_input"](case, world)
            eq("grads", m.grads - late / 2, p["grads"], late / 2)
            # (FSDP2: a 1-row trainable tensor lives on rank 0 alone; ftplan's figure is that rank's)
            one_row = BOUNDS["fsdp2_one_row_states"](case) if eng == "fsdp2" and m.rank > 0 else 0
            eq("optimizer", m.optimizer + one_row, p["optimizer"])
        if eng == "fsdp1":
            # the reduced gradient shards FSDP1 keeps on the device (``_saved_grad_shard``) until its
            # post-backward final callback, read from the engine: the formula's device gradients,
            # with CPU offload too
            eq("device gradient shards (_saved_grad_shard)", m.detail["fsdp1_saved_grad_peak"], p["grads"])
        eq("master", m.master, 0)
        eq("engine persistent", persistent, 0, BOUNDS["fsdp_scalars"])
        if not (eng == "fsdp1" and case.offload_params):
            # (FSDP1's offload copies each gradient shard into its CPU buffer asynchronously; on the
            # CPU stand-in when the source is freed depends on the rank's timing: not compared)
            # (gloo's staging copies of a reduce-scatter may outlive it on a rank, by timing; seen as
            # +6,688 B (4 ranks) and +10,432 B (2 ranks) on a loaded machine, in about 1 run of 3:
            # bounded above by one unit's bf16 gradient shard)
            slack = BOUNDS["gloo_rs_staging"](case, world)
            eq("transient", m.engine_transient_peak - slack / 2, p["transient"], slack / 2)
        if eng == "fsdp1" and case.method == "lora" and case.steps == 1:
            eq("activations (first step)", m.activations, _predict(case, world, first_step_views=True)["activations"])
        else:
            # PEFT's adapters in bf16 during compute (FSDP's param_dtype): lora_A saves its input
            eq("activations", m.activations, p["activations"])
    elif eng == "ddp":
        eq("params", m.params, params)
        eq("optimizer", m.optimizer, p["optimizer"])
        # gradients and buckets: with gradient_as_bucket_view the gradients are the buckets
        eq("grads + buckets", m.grads + m.engine_persistent, p["grads"] + p["buffers"])
        eq("transient", m.engine_transient_peak, p["transient"], BOUNDS["ddp_buffer_broadcast"])
    else:  # DeepSpeed
        stage = case.zero_stage
        lg = BOUNDS["ds_largest_grad"](case)
        # bf16 mode without autocast: an fp32 path of transformers runs in fp32 on the cast weights,
        # the adapters are bf16; ZeRO-3's linear saves every linear's input
        eq("activations", m.activations, p["activations"])
        if case.offload_optimizer or case.offload_params:
            # on CPU the host and the "device" are one memory (and the offload path's staging
            # buffers cannot be told from device ones): the resident total is checked, host and
            # device together; the engine's transient is not
            total = m.params + m.master + m.optimizer + m.engine_persistent + m.grads
            predicted = params + p["master"] + p["grads"] + p["optimizer"] + p["buffers"] + p["host"]
            eq("resident total (host + device)", total, predicted, BOUNDS["ds_offload"](case)
               + (BOUNDS["ds_inflight_grad"](case) if stage < 3 else 0))
        else:
            eq("master", m.master, p["master"])
            eq("optimizer", m.optimizer, p["optimizer"])
            if stage < 3:
                eq("params", m.params, params)
                # this rank's own gradient partition buffer and backward transient (the layout's
                # prediction is the worst rank's: see test_deepspeed_zero12_worst_rank)
                g_rank, t_rank = _zero12_rank(case, world, m.rank)
                flat = BOUNDS["ds_flat_copy"](case)
                late = BOUNDS["ds_late_grad"](case) + flat
                eq("grads (this rank)", m.grads - late / 2, g_rank, late / 2)
                # exact on a quiet run; gloo's asynchronous reductions decide whether a large
                # gradient in flight is freed before or after the peak (BOUNDS["ds_inflight_grad"]),
                # and whether a flattened copy is freed in backward or after (BOUNDS["ds_flat_copy"])
                eq("transient (this rank)", m.engine_transient_peak, t_rank,
                   BOUNDS["ds_inflight_grad"](case) + BOUNDS["ds_scalars"] + flat)
                return bad
            else:
                # persistent (small) parameters are whole on every rank; ZeRO-3 keeps its gradient
                # partition buffer and ipg bucket for the whole run
                extra = m.params + m.engine_persistent + m.grads - (params + p["buffers"] + p["grads"])
                b = BOUNDS["ds_persistent"](case)
                if case.method in ("lora", "qlora"):
                    # ZeRO-3 + LoRA/QLoRA (for QLoRA: bnb Params4bit in bf16 storage partitioned
                    # after init, the QuantState whole on every rank; the small parameters, frozen
                    # ones included, persisted whole from the first step): the adapters' gradients
                    # are small, the flattened copy of the last ipg bucket may still be alive when
                    # backward ends (LoRA: seen as +8,192 B of grads on rank 0 of qwen2 in 1 run of
                    # 3 alone, and +3,593 B on gemma4_moe in CI, 2026-11-24)
                    b += BOUNDS["ds_bucket_copy"](case)
                eq("params + persistent (one gathered parameter at most extra)", extra, (b - 256) / 2, (b + 256) / 2)
            # the formula is an upper bound (see sharding.py and BOUNDS): 0 <= predicted - measured
            # <= lg (+ DeepSpeed's scalars either way); LoRA/QLoRA, whose peak is in forward: by at
            # most one coalesced prefetch group (BOUNDS["ds_gather_group"])
            if case.method in ("lora", "qlora"):
                lg = BOUNDS["ds_gather_group"](case)
            eq("transient (upper bound)", m.engine_transient_peak, p["transient"] - lg / 2,
               lg / 2 + BOUNDS["ds_scalars"])
    return bad


def _ds_bucket(case: Case) -> int:
    return TR.TINY_CONFIGS[case.family]["hidden_size"] ** 2 * 2


def _zero12_rank(case: Case, world: int, rank: int) -> tuple[int, int]:
    """(gradient partition bytes, backward transient bytes) ZeRO-1/2 predict for ``rank``: the
    partition buffer over whole parameters, the large gradients in flight (ZeRO-1: kept when another
    rank owns them) and the two bf16 ipg buckets."""
    spec = model_from_config(TR.TINY_CONFIGS[case.family])
    bucket = TR.TINY_CONFIGS[case.family]["hidden_size"] ** 2  # HF's auto reduce_bucket_size
    g, t = zero12_rank_bytes(spec, case.job(), world, bucket, case.zero_stage, rank)
    return 2 * g, 2 * t + 2 * _ds_bucket(case)


#: documented bounds (bytes) where DeepSpeed/DDP keep bytes the formula does not list one by one
BOUNDS = {
    # FSDP: a rank tensor of the device mesh and the loss cast, a few bytes
    "fsdp_scalars": 16,
    # FSDP2 shards every parameter on dim 0: a trainable (1, n) tensor (qwen2_moe's block:
    # shared_expert_gate in full fine-tuning, its LoRA lora_B) is whole on rank 0 and empty on the
    # others, which hold no AdamW states for it; ftplan's per-rank figure is rank 0's (the worst).
    # Exact: the other ranks hold exactly these states less
    "fsdp2_one_row_states": lambda case: _one_row_states(case),
    # FSDP1 MixedPrecision(buffer_dtype=bf16): a bf16 copy of the rotary inv_freq buffers (0-64 B)
    "fsdp1_buffer_cast": 64,
    # gloo's reduce-scatter staging may outlive the collective on a rank (timing)
    "gloo_rs_staging": lambda case, world: _largest_unit_bf16(case) // world,
    # FSDP1/FSDP2: the last unit's bf16 reduce-scatter input may outlive backward on a rank (gloo's
    # work object): at most the largest unit's padded bf16 gradient
    "last_reduce_input": lambda case, world: _last_unit_grad_bf16(case, world),
    # CPU offload on the CPU stand-in: the last unit's reduce-scatter input may outlive backward
    "offload_last_reduce": lambda case: _largest_unit_bf16(case),
    # DDP broadcasts the model's buffers every forward (the rotary inv_freq): a copy of them
    "ddp_buffer_broadcast": 128,
    # DeepSpeed: the loss scaler's scalars and flags (4-byte tensors) in backward
    "ds_scalars": 256,
    # ZeRO-1/2 LoRA: the flattened copy of a bucket of small gradients across a partition boundary
    # (allreduce_bucket's _flatten_dense_tensors, gloo's asynchronous work) may still be alive when
    # backward ends on a rank (about 1 run of 3 on gpt_oss: 7,168 and 8,192 B): counted in the
    # transient by the formula, it is then measured as gradients and missing from the transient. At
    # most one reduce bucket + one slice in bf16 (a bucket is closed once it exceeds reduce_bucket_size)
    "ds_flat_copy": lambda case: (_ds_bucket(case) + 2 * _ds_largest_numel(case)
                                  if case.method != "full" and case.zero_stage < 3 else 0),
    # ZeRO-1/2: the bf16 gradient of the largest tensor (the embedding, the last computed in
    # backward) may not be reduced and freed yet on a rank when backward ends, by timing: seen as
    # +61,440 B above the whole-parameter partition buffer on both ranks of llama ZeRO-2 (read back
    # from +69,568 / +61,504 B over the former part-size prediction; not one tensor's gradient: not
    # explained) in full-suite runs on the 2-core machine, never when the cases run alone
    "ds_late_grad": lambda case: 2 * _ds_largest_numel(case),
    # ZeRO-1/2: a gradient larger than the bucket skips it and is reduced on its own, asynchronously
    # (gloo's work thread): whether it (or the bucket it follows) is freed before the backward peak
    # or the end of the step is timing. Exact on quiet runs; in full-suite runs on the 2-core
    # machine (2026-11-24) seen per rank: transient -34,940 / -19,580 B (qwen2 ZeRO-1/2), +15,108 B
    # (llama ZeRO-2); with optimizer offload the resident total +92,756 B (qwen2) / +36,124 B
    # (mixtral) beyond "ds_offload". Bounded by one largest bf16 gradient either way
    "ds_inflight_grad": lambda case: 2 * _ds_largest_numel(case),
    # ZeRO-3 LoRA/QLoRA: the flattened copy of an ipg bucket (reduce_scatter_coalesced's torch.cat of
    # the padded partitions, not in the formula) may still be alive at the end of backward on a
    # rank (timing; seen as +8,192 B = one auto bucket on rank 0 of llama ZeRO-3 QLoRA)
    "ds_bucket_copy": lambda case: _ds_bucket(case),
    # ZeRO-3 gathers its persistent (small) parameters twice in the first steps, plus scalars;
    # and on some runs a rank still holds one gathered parameter when the step ends (DeepSpeed's
    # in-flight/prefetch bookkeeping is timing-dependent): up to the largest parameter in bf16
    "ds_persistent": lambda case: 1024 + _ds_largest_grad(case) // (3 if case.zero_stage == 1 else 2),
    # DeepSpeed's backward transient depends on where the largest gradient falls among the
    # buckets and gathered modules and on which rank owns its partition: the formula counts it
    # (and its reduction copy) in full, a rank holds part of it, or none
    "ds_largest_grad": lambda case: _ds_largest_grad(case),
    # ZeRO-3 LoRA/QLoRA: the forward peak is every parameter the backward uses gathered plus one
    # prefetch group held twice (its flat all-gather buffer and the per-parameter copies split out
    # of it); the formula counts the largest group possible, stage3_prefetch_bucket_size plus the
    # largest gathered parameter; which group is split while the rest is gathered is the trace's
    # business. Measured 2026-11-25 (one group over the gathered set: 9,984-38,912 B, 69,376 B on
    # llama QLoRA and 69,632 B on mixtral LoRA whose group holds the lm_head / an expert weight):
    # the formula is above by 3,532 B (llama QLoRA) to 62,924 B (qwen2 QLoRA); bound 72,908 B
    # (130,252 B on mixtral)
    "ds_gather_group": lambda case: 2 * _ds_gather_group(case),
    # optimizer offload: DeepSpeed's host-side accumulation buffers beyond the fp32 partitions
    # (ZeRO-1/2: up to two fp32 buckets), plus scalars; ZeRO-3 may still hold one gathered
    # parameter when the step ends (as in "ds_persistent"; seen on mixtral with parameter offload:
    # +65,536 B, the lm_head in bf16, on rank 0 in some runs)
    "ds_offload": lambda case: 2 * _ds_bucket(case) * 2 + 1024
    + (2 * _ds_largest_numel(case) if case.zero_stage == 3 else 0),
}


def _reduce_b(case: Case) -> int:
    """Bytes per element of the FSDP reduce-scatter (bf16, or fp32 with ``reduce_fp32``)."""
    return 4 if case.reduce_fp32 else 2


def _largest_unit_bf16(case: Case) -> int:
    """The largest unit in the reduce dtype (bf16 unless ``reduce_fp32``)."""
    from ftplan.sharding import fsdp_units

    spec = model_from_config(TR.TINY_CONFIGS[case.family])
    return _reduce_b(case) * max(u.numel() for u in fsdp_units(spec, case.job(), case.engine))


def _last_unit_grad_bf16(case: Case, world: int) -> int:
    """Padded gradient, in the reduce dtype, of the largest unit with trainable parameters (FSDP1:
    its flat gradient; FSDP2: its tensors padded on dim 0)."""
    from ftplan.sharding import fsdp_units

    spec = model_from_config(TR.TINY_CONFIGS[case.family])
    units = fsdp_units(spec, case.job(), case.engine)
    return _reduce_b(case) * max(max(-(-u.numel(True) // world) * world,
                                     sum(t.padded(world) for t in u.tensors if t.trainable)) for u in units)


def _ds_largest_numel(case: Case) -> int:
    from ftplan.sharding import fsdp_units

    spec = model_from_config(TR.TINY_CONFIGS[case.family])
    return max(t.numel for u in fsdp_units(spec, case.job()) for t in u.tensors if t.trainable)


def _ds_gather_group(case: Case) -> int:
    """Elements of the largest ZeRO-3 prefetch group: HF's auto stage3_prefetch_bucket_size
    (int(0.9 x hidden^2)) plus the largest parameter above the persistence threshold (10 x hidden)."""
    from ftplan.sharding import fsdp_units

    cfg = TR.TINY_CONFIGS[case.family]
    spec = model_from_config(cfg)
    h = spec.hidden_size
    return int(0.9 * h * h) + max(t.numel for u in fsdp_units(spec, case.job()) for t in u.tensors if t.numel > 10 * h)


def _ds_largest_grad(case: Case) -> int:
    from ftplan.sharding import fsdp_units

    spec = model_from_config(TR.TINY_CONFIGS[case.family])
    units = fsdp_units(spec, case.job())
    # bf16 gradient + its reduction copy (fp32 in ZeRO-1)
    per = 2 + (4 if case.zero_stage == 1 else 2)
    return per * max(t.numel for u in units for t in u.tensors if t.trainable)


def _failures(cases, world, results) -> list[str]:
    failures = []
    for case, res in zip(cases, results):
        if isinstance(res, str):
            failures.append(f"{case.label}: did not run: {res.splitlines()[0]}")
            continue
        for m in res:
            for d in _check(case, world, m):
                failures.append(f"{case.label} rank {m.rank}: {d}")
    return failures


def _one_row_states(case: Case) -> int:
    """AdamW state bytes (two fp32 moments) of the trainable 1-row tensors of ``case``'s tiny model:
    each MoE layer's shared_expert_gate weight (1, hidden) in full fine-tuning, its lora_B (1, r) in
    LoRA when all-linear wraps the gate."""
    spec = model_from_config(TR.TINY_CONFIGS[case.family])
    job = case.job()
    if case.method == "full":
        per = spec.hidden_size
    elif "shared_expert_gate" in lora_targets(spec, job.lora):
        per = job.lora.r
    else:
        return 0
    return sum(g.count * per * 8 for g in spec.groups if g.moe is not None and g.moe.shared_gate)


def _two_rank_cases() -> list[Case]:
    cases = list(TORCH_CASES) + TORCHTUNE_WRAP_CASES
    if HAS_PEFT:
        cases += PEFT_CASES + OLMO_SAVED_CASES
        if HAS_BNB:
            cases += QLORA_CASES
    if HAS_DS:
        if HAS_PEFT:
            cases += DS_LORA12_CASES
        cases += DS_CASES
        if HAS_PEFT and HAS_BNB:
            cases += DS_QLORA_CASES
        if HAS_PEFT:
            cases += DS_LIVE_CASES
    return cases if RUN_ALL else [c for c in cases if c not in BY_HAND]


@pytest.fixture(scope="module")
def two_ranks():
    """Every 2-rank case in one process group (one spawn: the imports dominate the cost)."""
    cases = _two_rank_cases()
    TWO_RANK_RESULTS.update(zip(cases, run_cases(cases, 2, timeout_s=600)))
    return dict(TWO_RANK_RESULTS)


def _check_group(results, cases, world):
    failures = _failures(cases, world, [results[c] for c in cases])
    if failures:
        # when gloo's asynchronous work frees a buffer depends on the ranks' timing (on a loaded
        # machine, about 1 run in 3 shows a difference beyond the bounds above on some case):
        # the failing cases run again, in a fresh process group, and must hold there in one of two
        # runs (mixtral/fsdp1/full/offload-params alone: rank 0 kept 131,200 B more after the step
        # in 1 of 3 runs on the 2-core machine, 2026-11-25, both runs of one CI)
        bad = [c for c in cases if any(f.startswith((c.label + " rank", c.label + ":")) for f in failures)]
        print("first run (timing-dependent, re-run):\n" + "\n".join(failures))
        for _ in range(2):
            again = _failures(bad, world, run_cases(bad, world, timeout_s=600))
            bad = [c for c in bad if any(f.startswith((c.label + " rank", c.label + ":")) for f in again)]
            if not bad:
                break
        assert not again, "\n".join(again)


def test_fsdp2_two_ranks(two_ranks):
    """FSDP2 with accelerate's units and bf16 mixed precision: llama, qwen2 (tied embeddings),
    mixtral; reshard after forward off; CPU offload; LoRA and QLoRA (4-bit weights in bf16 storage)."""
    _check_group(two_ranks, [c for c in two_ranks if c.engine == "fsdp2" and c.fsdp_wrap == "accelerate"
                                 and c not in OLMO_SAVED_CASES], 2)


def test_fsdp1_two_ranks(two_ranks):
    """FSDP1 FULL_SHARD / SHARD_GRAD_OP / CPU offload, bf16 MixedPrecision, BACKWARD_PRE; LoRA and
    QLoRA with PEFT's wrap policy (adapters as units of their own)."""
    _check_group(two_ranks, [c for c in two_ranks if c.engine == "fsdp1"], 2)


def test_ddp_two_ranks(two_ranks):
    """DDP's buckets, with and without gradient_as_bucket_view."""
    _check_group(two_ranks, [c for c in two_ranks if c.engine == "ddp"], 2)


@pytest.mark.skipif(not HAS_DS, reason="deepspeed is not installed")
def test_deepspeed_zero_two_ranks(two_ranks):
    """DeepSpeed ZeRO-1/2/3 (bf16, HF Trainer's ``auto`` buckets as ftplan exports them), with
    optimizer and parameter offload, on DeepSpeed's CPU accelerator over gloo."""
    _check_group(two_ranks, [c for c in two_ranks if c.engine == "deepspeed" and not c.max_live], 2)


@pytest.mark.skipif(not HAS_DS, reason="deepspeed is not installed")
def test_deepspeed_zero12_worst_rank(two_ranks):
    """ZeRO-1/2: the layout's per-rank figures are the worst rank's (a parameter cut by a partition
    boundary is in two ranks' gradient buffers; ZeRO-1 keeps the other ranks' large gradients
    through backward): the largest measured rank must equal them."""
    def worst_rank_failures(results: dict) -> dict:
        bad = {}
        for case, res in results.items():
            if case.engine != "deepspeed" or case.zero_stage == 3 or case.offload_optimizer or isinstance(res, str):
                continue
            p = _predict(case, 2)
            g, t = max(m.grads for m in res), max(m.engine_transient_peak for m in res)
            if not 0 <= g - p["grads"] <= BOUNDS["ds_late_grad"](case) + BOUNDS["ds_flat_copy"](case):
                bad[case] = f"{case.label}: largest rank's gradients {g}, predicted {float(p['grads']):.0f}"
            if abs(t - p["transient"]) > (BOUNDS["ds_inflight_grad"](case) + BOUNDS["ds_scalars"]
                                          + BOUNDS["ds_flat_copy"](case)):
                bad[case] = f"{case.label}: largest rank's transient {t}, predicted {float(p['transient']):.0f}"
        return bad

    bad = worst_rank_failures(two_ranks)
    if bad:  # timing-dependent frees (see _check_group): the failing cases run once more
        print("first run (timing-dependent, re-run):\n" + "\n".join(bad.values()))
        again = worst_rank_failures(dict(zip(bad, run_cases(list(bad), 2, timeout_s=600))))
        assert not again, "\n".join(again.values())


def test_fsdp2_four_ranks_and_hsdp():
    """Shard degree 4 (padding and the backend's reduce-scatter copy scale with it) and HSDP:
    a 2-D (replicate, shard) mesh of 2 x 2 ranks, sharded within a "node", replicated across."""
    results = dict(zip(FOUR_CASES, run_cases(FOUR_CASES, 4, timeout_s=600)))
    _check_group(results, FOUR_CASES, 4)
    assert not _communicator_failures(results, 4)


def _communicator_failures(results, world) -> list[str]:
    """The process groups each rank's collectives ran on (wrap, forward, backward, step), plus the
    default group that the launcher's barriers use (accelerate / HF Trainer), against
    ``sharding.communicator_groups``: on GPUs each group is one NCCL communicator with its own
    device buffers (``nccl_buffers``)."""
    from ftplan.sharding import communicator_groups

    bad = []
    for case, res in results.items():
        if isinstance(res, str):
            continue
        want = sorted(n for _, n in communicator_groups(case.layout(world)))
        for m in res:
            got = dict(m.groups)
            got.setdefault(m.detail["world_group"], world)
            if sorted(got.values()) != want:
                bad.append(f"{case.label} rank {m.rank}: groups {m.groups} (world {m.detail['world_group']}), "
                           f"predicted {communicator_groups(case.layout(world))}")
    return bad


def test_communicators_two_ranks(two_ranks):
    """Which process groups DDP, FSDP1/FSDP2 and DeepSpeed ZeRO run their collectives on: one
    NCCL communicator each on GPUs (DeepSpeed: the world group and its clone for data
    parallelism)."""
    bad = _communicator_failures(two_ranks, 2)
    assert not bad, "\n".join(bad)


def test_fsdp2_transient_as_torch_2_15_measured():
    """FSDP2's transient peaks measured under torch 2.15 (a separate venv; CI runs 2.13) against the
    2.15 schedule (``fsdp2_schedule_torch`` = 2.15): each within the gloo staging bound above the
    prediction, as the live runs are held."""
    import json
    from pathlib import Path

    global _CONSTS
    doc = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "measurements"
                      / "fsdp2_transient_torch215_cpu.json").read_text())
    cases = {(2, c.label): c for c in TORCH_CASES + PEFT_CASES + QLORA_CASES if c.engine == "fsdp2"}
    cases |= {(4, c.label): c for c in FOUR_CASES}
    saved = _CONSTS
    try:
        _CONSTS = dataclasses.replace(saved, fsdp2_schedule_torch=2.15)
        n = 0
        for world, rows in doc["transient_bytes"].items():
            for label, measured in rows.items():
                case = cases[(int(world), label)]
                p = _predict(case, int(world))["transient"]
                slack = BOUNDS["gloo_rs_staging"](case, int(world))
                for m in measured:
                    assert 0 <= m - p <= slack, (world, label, m, float(p), slack)
                    n += 1
                # the 2.13 schedule over-predicts every one of them
                _CONSTS = dataclasses.replace(saved, fsdp2_schedule_torch=2.13)
                assert _predict(case, int(world))["transient"] > min(measured)
                _CONSTS = dataclasses.replace(saved, fsdp2_schedule_torch=2.15)
        assert n >= 19
    finally:
        _CONSTS = saved


