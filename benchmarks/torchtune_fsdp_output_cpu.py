"""torchtune's chunked output projection under FSDP2 on CPU (gloo, 2 ranks): what changes.

    python benchmarks/torchtune_fsdp_output_cpu.py

torchtune's ``full_finetune_distributed`` (0.3.x, ``custom_sharded_layers: ['tok_embeddings',
'output']``) makes the output projection an FSDP2 unit of its own (``fully_shard(output)``,
``reshard_after_forward=True``), and ``TransformerDecoder.chunked_output`` calls it once per chunk.
This runs the tail of ``ftplan.measure.torchtune_loss`` (final norm, 8 output chunks, the compiled
``CEWithChunkedOutputLoss``) twice on rank 0 of a 2-rank gloo group, plain and with the output
unit and the root sharded as torchtune does, and prints the bytes above weights and inputs
(gradients left out) and the trail of the large allocations (>= one logits chunk) around the
mark between forward and backward.

What it shows (torch 2.13, gloo; step peak 1.54 MB plain, 2.52 MB under FSDP2 at this size): under
FSDP2 the output unit is all-gathered and resharded once *per chunk* in the forward (the forward
peaks at a chunk's gather, 2.07 MB against 0.57 MB plain), and gathered again per chunk in
backward; the chunks' weight gradients accumulate unsharded and are reduce-scattered once, at
the end (the one half-weight shard). Plain autograd sums the 8 chunks' weight gradients in its
input buffer (two head-sized gradients at the second chunk, ``memory._torchtune_loss_bytes``).
Since 2026-11-25 ftplan's FSDP2 schedule has units called several times per step
(``sharding.Unit.calls``, torchtune's wrapping ``Layout.fsdp_wrap="torchtune"``): each chunk's
post-backward reshards the output unit with nothing to reduce, because autograd sums the chunks'
weight gradients in its input buffer (out of place, on CPU) before the parameter's gradient exists;
held byte for byte on a whole tiny model by ``benchmarks/torchtune_wrap_cpu.py``.

Last, FSDP2 without a mixed-precision policy (torchtune's pure bf16; ftplan's ``precision=bf16``):
a unit holding a bf16 weight and an fp32 one all-gathers 2 + 4 bytes per element (one uint8
all-gather of both), which ``sharding.fsdp2_transient_bytes(param_b=None)`` plans (it gathered
everything at the trainable dtype's 4 bytes before 2026-11-25).
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

H, V, B, S, N = 64, 4096, 2, 32, 8


def _run(rank: int, world: int, mode: str, port: int) -> None:
    import gc

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.profiler import ProfilerActivity, profile

    import ftplan.measure.torchtune_loss as T

    warnings.simplefilter("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)

    class Tail(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = T._RMSNorm(H)
            self.output = torch.nn.Linear(H, V, bias=False)

        def forward(self, x):
            h = self.norm(x)
            return [self.output(c) for c in h.chunk(N, dim=1)]

    m = Tail().to(torch.bfloat16)
    if mode == "fsdp2":
        fully_shard(m.output)  # custom_sharded_layers: output
        fully_shard(m)  # the root
    loss_fn = T._ChunkedCE(N)
    loss_fn.compute_cross_entropy = torch.compile(loss_fn.compute_cross_entropy, backend="inductor")
    cache = torch.full((B, 1), -100, dtype=torch.long)
    tokens = torch.randint(0, V, (B, S))

    def step(x):
        logits = m(x)
        labels = torch.hstack((tokens[..., 1:], cache[:B]))
        loss = loss_fn(logits, labels)
        del logits
        mark = torch.empty(T._MARK, dtype=torch.uint8)
        del mark
        loss.backward()
        return loss, labels

    step(torch.randn(B, S, H, dtype=torch.bfloat16, requires_grad=True))
    for p in m.parameters():
        p.grad = None
    x = torch.randn(B, S, H, dtype=torch.bfloat16, requires_grad=True)
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss, labels = step(x)
    ev = T._allocations(prof)
    grads = set()
    for p in [x, *m.parameters()]:
        if p.grad is not None:
            g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            grads.add(g.untyped_storage().data_ptr())
    if rank == 0:
        mid = next(i for i, (_t, _p, nb) in enumerate(ev) if nb == T._MARK)
        fwd_peak, fwd_end = T._replay(ev, mid, grads)
        peak, _ = T._replay(ev, None, grads)
        trail = ([f"{nb:+d}" for _t, _p, nb in ev[:mid] if abs(nb) >= B * S // N * V * 2] + ["| backward |"]
                 + [f"{nb:+d}" for _t, _p, nb in ev[mid:] if abs(nb) >= B * S // N * V * 2])
        print(f"{mode}: after forward {fwd_end:,} B, forward peak {fwd_peak:,} B, step peak {peak:,} B "
              f"(one logits chunk {B * S // N * V * 2:,} B, the head weight {V * H * 2:,} B)\n  " + " ".join(trail),
              flush=True)
    dist.destroy_process_group()


def _dtypes(rank: int, world: int, port: int) -> None:
    """FSDP2 without a mixed-precision policy on a unit holding a frozen bf16 weight and an fp32
    adapter (torchtune's / pure-bf16 LoRA): the sizes of the forward's allocations."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.profiler import ProfilerActivity, profile

    import ftplan.measure.torchtune_loss as T

    warnings.simplefilter("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)

    class Unit(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.base = torch.nn.Linear(256, 256, bias=False).to(torch.bfloat16).requires_grad_(False)
            self.a = torch.nn.Linear(256, 8, bias=False)  # fp32

        def forward(self, x):
            return self.base(x) + torch.nn.functional.pad(self.a(x.float()).to(x.dtype), (0, 248))

    m = torch.nn.Sequential(Unit(), Unit())
    for u in m:
        fully_shard(u)
    fully_shard(m)
    x = torch.randn(4, 256, dtype=torch.bfloat16, requires_grad=True)
    m(x).sum().backward()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        m(x)
    if rank == 0:
        sizes = [n for _t, _p, n in T._allocations(prof) if abs(n) >= 4096]
        print(f"no param_dtype, bf16 base 256x256 ({256 * 256 * 2:,} B) + fp32 adapter 8x256 ({256 * 8 * 4:,} B): "
              f"forward allocations {sizes} (all-gather output = the two in their own dtypes, "
              f"{256 * 256 * 2 + 256 * 8 * 4:,} B; at 4 B each it would be {(256 * 256 + 256 * 8) * 4:,})", flush=True)
    dist.destroy_process_group()


def main() -> int:
    import torch.multiprocessing as mp

    for i, mode in enumerate(("plain", "fsdp2")):
        mp.spawn(_run, args=(2, mode, 29611 + i), nprocs=2)
    mp.spawn(_dtypes, args=(2, 29615), nprocs=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
