"""Expert parallelism measured on CPU: transformers' own EP engine on gloo, N processes.

transformers 5 trains MoE models expert-parallel natively: ``from_pretrained(...,
distributed_config=DistributedConfig(fsdp_size=N, ep_size=E))`` shards the routed experts over
``E`` ranks (``grouped_gemm`` style, ``num_experts / E`` whole experts each), installs the
all-to-all token dispatch (``AllToAllEP``: ``all_to_all_single`` for the split sizes,
``all_to_all_single_autograd`` for the rows) on every experts module, and FSDP2-shards the rest
over the data-parallel mesh and the experts over the ``efsdp`` mesh. All of it runs on CPU with
gloo, which is what this module does (``torch.multiprocessing`` spawn, no torchrun): every rank
loads a tiny real model of the family, routes its own random tokens, and records

* the local bytes of parameters, gradients and AdamW states (DTensor local shards), split into
  routed experts and the rest;
* the bytes autograd saves in each MoE layer's block (:class:`~ftplan.measure.torchref.
  SavedTensorTracker`, parameter views excluded) and the (token, expert) rows the rank received
  per layer (the ``AllToAllEP`` dispatch, wrapped);

so that the memory formulas (``ftplan.expert_parallel``) can be held against them. torch and
transformers are imported lazily (in the workers).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import sys
import tempfile
import traceback
from typing import Any

from .configs import default_attention

__all__ = ["EpRankMeasure", "run_ep"]


@dataclasses.dataclass
class EpRankMeasure:
    family: str
    rank: int
    world: int
    ep: int
    tokens: int  # tokens this rank routes per MoE layer (batch x seq)
    local_experts: int
    rows: list[int]  # (token, expert) rows received per MoE layer
    moe_saved: list[int]  # saved bytes of each MoE layer's block (router + experts + EP path)
    param_bytes: int
    expert_param_bytes: int
    grad_bytes: int
    expert_grad_bytes: int
    optimizer_bytes: int
    expert_optimizer_bytes: int
    #: ``"full"``, or ``"lora"`` / ``"qlora"``: PEFT LoRA applied after the sharded load (see
    #: :func:`run_ep_cases`)
    method: str = "full"
    checkpointing: bool = False
    frozen_bytes: int = 0  # local bytes of the frozen parameters (the base under LoRA)
    trainable_bytes: int = 0  # local bytes of the trainable parameters (the adapters under LoRA)
    #: every storage autograd keeps at the forward's end (parameter views excluded), the loss's too
    saved_bytes: int = 0
    #: autocast's saved low-precision copies of fp32 parameters (the LoRA adapters under bf16-mixed)
    weight_copy_bytes: int = 0


class _AnyParam(dict):
    """Names every leaf reached through views as a parameter: FSDP2's unsharded parameters and
    EP's local expert tensors are not in ``named_parameters`` when the tracker is built."""

    def get(self, key, default=None):  # noqa: D401
        return "param"


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _nbytes(t) -> int:
    t = _local(t)
    return t.numel() * t.element_size()


def _measure(family: str, path: str, rank: int, world: int, ep: int, batch: int, seq: int,
             method: str = "full", lora_targets: str | list[str] = "all-linear",
             checkpointing: bool = False, autocast: bool = False) -> EpRankMeasure:
    import torch
    from transformers.distributed import DistributedConfig
    from transformers.distributed import expert_parallel as EPM

    from .hf import strip_peft_prefix
    from .torchref import SavedTensorTracker

    cfg = DistributedConfig(fsdp_size=world, ep_size=ep)
    # pure bf16 (no autocast): a precision the single-process formulas are held byte-exact in
    with open(os.path.join(path, "config.json")) as f:
        attn = default_attention(json.load(f))
    from .hf import CausalLM  # (mistral4: no AutoModelForCausalLM mapping)

    kwargs = {}
    if method == "qlora":  # bitsandbytes NF4 at load, as ftplan's exported train.py asks for it
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                           bnb_4bit_compute_dtype=torch.bfloat16)
    model = CausalLM.from_pretrained(path, distributed_config=cfg, dtype=torch.bfloat16,
                                     attn_implementation=attn, **kwargs)
    if method in ("lora", "qlora"):
        # as TRL / PEFT do with a model transformers sharded at load time: get_peft_model after the
        # load. The adapters are plain tensors next to the DTensor base (FSDP2 and EP never see
        # them); transformers' Trainer broadcasts them from rank 0 and averages their gradients
        # (Trainer._sync_replicated_trainable_parameters), done here the same way
        from .hf import apply_lora

        model = apply_lora(model, r=4, alpha=8, dropout=0.0, target_modules=lora_targets).model
        for p in model.parameters():
            if p.requires_grad and not hasattr(p.data, "to_local"):
                with torch.no_grad():
                    torch.distributed.broadcast(p.data, src=0)
                p.register_post_accumulate_grad_hook(
                    lambda q: torch.distributed.all_reduce(q.grad, op=torch.distributed.ReduceOp.AVG))
    if checkpointing:
        from .hf import set_gradient_checkpointing

        set_gradient_checkpointing(model, True)
    model.train()
    rows: list[int] = []
    orig = EPM.AllToAllEP._dispatch_tokens

    def dispatch(self, hidden_states, top_k_index, top_k_weights):
        out = orig(self, hidden_states, top_k_index, top_k_weights)
        rows.append(int(out[0].shape[0]))
        return out

    EPM.AllToAllEP._dispatch_tokens = dispatch
    try:
        torch.manual_seed(1000 + rank)
        vocab = model.config.vocab_size
        ids = torch.randint(0, vocab, (batch, seq))
        tracker = SavedTensorTracker(None)
        tracker.model = model  # (only to wrap the checkpoint function: its closures are saved too)
        tracker._names = {id(m): strip_peft_prefix(n) for n, m in model.named_modules()}
        tracker._param_names = _AnyParam()
        def exclude_params(module, args):
            # runs after FSDP2's own pre-forward (registered later): the unsharded / local
            # weights the module computes with are parameters, not activations. Only while the
            # module runs: FSDP frees them after, and the allocator reuses the addresses.
            keys = set()
            for p in module.parameters(recurse=False):
                try:
                    keys.add(_local(p).untyped_storage().data_ptr())
                except RuntimeError:
                    pass
            module._ftplan_excluded = keys - tracker._excluded
            tracker._excluded |= keys

        def include_again(module, args, output):
            tracker._excluded -= getattr(module, "_ftplan_excluded", set())

        hooks = [m.register_forward_pre_hook(exclude_params) for m in model.modules()]
        hooks += [m.register_forward_hook(include_again) for m in model.modules()]
        amp = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
        with tracker, amp:  # (autocast: HF Trainer's bf16=True on the bf16 model, bf16-mixed)
            out = model(input_ids=ids, labels=ids)
        for h in hooks:
            h.remove()
        if os.environ.get("FTPLAN_EP_DEBUG") and rank == 0:
            for r in tracker.alive_records():
                if os.environ["FTPLAN_EP_DEBUG"] == "all" or (
                        ".mlp" in r.module and r.module.split(".")[2] == os.environ["FTPLAN_EP_DEBUG"]):
                    print(family, r.module, r.op, r.shape, r.dtype, r.nbytes, r.producer, r.param_copy, flush=True)
        loss = out.loss
        del out
        moe: dict[str, int] = {}
        saved = copies = 0
        for r in tracker.alive_records():
            if r.param_copy:
                # a view of a parameter (FSDP's unsharded weight, a local expert), or autocast's
                # low-precision copy of one (of a plain fp32 adapter: a storage of its own)
                copies += r.nbytes if method != "full" and r.dtype != "float32" else 0
                continue
            saved += r.nbytes
            parts = r.module.split(".")
            if "mlp" in parts and "layers" in parts:
                key = ".".join(parts[: parts.index("mlp") + 1])
                moe[key] = moe.get(key, 0) + r.nbytes
        loss.backward()
    finally:
        EPM.AllToAllEP._dispatch_tokens = orig
    named = [(strip_peft_prefix(n), p) for n, p in model.named_parameters()]
    is_exp = {n: ".experts." in n for n, _ in named}
    pb = sum(_nbytes(p) for _, p in named)
    epb = sum(_nbytes(p) for n, p in named if is_exp[n])
    gb = sum(_nbytes(p.grad) for _, p in named if p.grad is not None)
    egb = sum(_nbytes(p.grad) for n, p in named if p.grad is not None and is_exp[n])
    trainable = [(n, p) for n, p in named if p.requires_grad]
    opt = torch.optim.AdamW([p for _, p in trainable], lr=1e-4, foreach=False)
    opt.step()
    ob = eob = 0
    for n, p in named:
        st = opt.state.get(p, {})
        b = sum(_nbytes(v) for v in st.values() if torch.is_tensor(v))
        ob += b
        eob += b if is_exp[n] else 0
    local = next((m.num_experts for n, m in model.named_modules() if n.endswith("mlp.experts")), 0)
    layer_keys = sorted(moe, key=lambda k: int(k.split(".")[-2]))
    modules = {strip_peft_prefix(n) for n, _ in model.named_modules()}
    moe_layers = [k for k in layer_keys if f"{k}.experts" in modules]
    return EpRankMeasure(family=family, rank=rank, world=world, ep=ep, tokens=batch * seq, local_experts=int(local),
                         rows=rows, moe_saved=[moe[k] for k in moe_layers], param_bytes=pb, expert_param_bytes=epb,
                         grad_bytes=gb, expert_grad_bytes=egb, optimizer_bytes=ob, expert_optimizer_bytes=eob,
                         method=method, checkpointing=checkpointing,
                         frozen_bytes=sum(_nbytes(p) for _, p in named if not p.requires_grad),
                         trainable_bytes=sum(_nbytes(p) for _, p in trainable), saved_bytes=saved,
                         weight_copy_bytes=copies)


def _worker(rank: int, world: int, port: int, jobs: list[tuple], ep: int, batch: int, seq: int,
            outdir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
    import warnings

    import torch
    import torch.distributed as dist

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    result: dict[str, Any] = {}
    try:
        for label, family, path, kwargs in jobs:
            try:
                result[label] = dataclasses.asdict(_measure(family, path, rank, world, ep, batch, seq, **kwargs))
            except Exception as e:  # noqa: BLE001 - reported to the parent, per case
                result[label] = f"error: {type(e).__name__}: {e}\n" + traceback.format_exc(limit=6)
            dist.barrier()
    finally:
        with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ep(families: list[str], *, world: int = 2, ep: int = 2, batch: int = 2, seq: int = 32,
           configs: dict[str, dict] | None = None) -> dict[str, list[EpRankMeasure] | str]:
    """Measure every family on ``world`` gloo processes with ``ep``-way expert parallelism and
    FSDP over all of them; per family a list of per-rank measurements (or an error text)."""
    return run_ep_cases({fam: {"family": fam} for fam in families}, world=world, ep=ep, batch=batch, seq=seq,
                        configs=configs)


def run_ep_cases(cases: dict[str, dict[str, Any]], *, world: int = 2, ep: int = 2, batch: int = 2, seq: int = 32,
                 configs: dict[str, dict] | None = None) -> dict[str, list[EpRankMeasure] | str]:
    """Like :func:`run_ep`, one spawn for several cases: ``{label: {"family": ..., "method": "full" |
    "lora" | "qlora", "lora_targets": "all-linear" | [names], "checkpointing": bool, "autocast":
    bool}}``. LoRA (rank 4, alpha 8, no dropout) is applied with PEFT after transformers' sharded
    load, the way a TRL / Trainer script does with ``from_pretrained(distributed_config=...)``
    (``qlora``: a bitsandbytes NF4 load first); ``autocast``: the forward under bf16 autocast
    (bf16-mixed, HF Trainer's ``bf16=True``), else pure bf16. Per label the per-rank measurements,
    or the error text a rank raised (``"error: ExceptionType: message ..."``)."""
    import torch.multiprocessing as mp

    from .torchref import TINY_CONFIGS, build_model

    with tempfile.TemporaryDirectory(prefix="ftplan-ep-") as tmp:
        jobs = []
        built: dict[str, str] = {}
        for label, case in cases.items():
            fam = case["family"]
            if fam not in built:
                cfg = (configs or {}).get(fam, TINY_CONFIGS[fam])
                built[fam] = os.path.join(tmp, fam)
                build_model(cfg, dtype="bf16").save_pretrained(built[fam])
            jobs.append((label, fam, built[fam], {k: v for k, v in case.items() if k != "family"}))
        ctx = mp.start_processes(_worker, args=(world, _free_port(), jobs, ep, batch, seq, tmp), nprocs=world,
                                 join=False, start_method="spawn")
        while not ctx.join():
            pass
        per_rank = []
        for r in range(world):
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                per_rank.append(json.load(f))
    out: dict[str, list[EpRankMeasure] | str] = {}
    for fam in cases:
        vals = [pr.get(fam) for pr in per_rank]
        err = next((v for v in vals if isinstance(v, str) or v is None), None)
        out[fam] = err or "missing" if err is not None else [EpRankMeasure(**v) for v in vals]
    return out


if __name__ == "__main__":  # pragma: no cover - manual runs: python -m ftplan.measure.ep_run qwen3_moe
    res = run_ep(sys.argv[1:] or ["qwen3_moe"])
    print(json.dumps({k: v if isinstance(v, str) else [dataclasses.asdict(x) for x in v] for k, v in res.items()},
                     indent=1))
