"""torchtune's chunked-output cross-entropy, measured on CPU (bytes live and saved, every backend).

torchtune's recipes (``full_finetune_distributed`` / ``lora_finetune_distributed``, 0.3.x, the
ones behind the README's "Memory and training speed" table) train their own decoder with
``loss: CEWithChunkedOutputLoss``: the model applies its final norm, then its output projection
per chunk (``TransformerDecoder.chunked_output``: ``[self.output(chunk) for chunk in
last_hidden_state.chunk(self.num_output_chunks, dim=1)]``, 8 chunks; no ``.float()``), and the
loss upcasts and scores one chunk at a time (``compute_cross_entropy``: ``F.cross_entropy(
logits.float(), labels, ignore_index=-100, reduction="sum")``). With ``compile: True`` the recipe
compiles each decoder layer and only ``compute_cross_entropy`` of the loss
(``training.compile_loss``; backend ``inductor`` unless ``TORCH_COMPILE_BACKEND``). The train step
shifts the labels with ``torch.hstack((labels[..., 1:], self.ignore_labels_cache[:b]))``, calls the
loss, deletes the logits list (``del logits``) and runs ``loss.backward()``; the shifted labels
stay referenced by the loop through backward.

Sources (torchtune 0.3.1 wheel, PyPI; pytorch/torchtune@0031bfb for the README):
``torchtune/modules/loss/ce_chunked_output_loss.py``, ``torchtune/modules/transformer.py``
(``chunked_output``, ``forward``: ``h = self.norm(h)`` then the chunks),
``torchtune/modules/rms_norm.py``, ``torchtune/training/_compile.py`` (``compile_loss``),
``recipes/full_finetune_distributed.py`` / ``recipes/lora_finetune_distributed.py`` (``train``).

:func:`measure_tail` runs that tail (final norm, chunked output projection, chunked loss) on a
leaf standing for the last decoder layer's output, in bf16 (``dtype: bf16``: weights, activations
and gradients in bf16), the output projection trained (full) or frozen (LoRA/QLoRA: torchtune
puts no adapter on it unless ``apply_lora_to_output``). Every allocation is read from the
profiler's allocation events (``profile_memory=True``: the CPU allocator reports each one, also
inside inductor's generated code, which no ``TorchDispatchMode`` sees); the parameters' gradients
and the leaf's gradient are left out (ftplan counts them elsewhere). ``torchtune_dir``: take the
loss class and the norm from an unpacked torchtune wheel (``pip download --no-deps
torchtune==0.3.1`` and unzip; their files import torch only) instead of the transcriptions here.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import warnings
from pathlib import Path

import torch

from .torchtune_modules import ChunkedCE as _ChunkedCE
from .torchtune_modules import RMSNorm as _RMSNorm

__all__ = ["BACKENDS", "TailMeasure", "measure_tail"]

#: eager (``compile: False``), and the backends ``compute_cross_entropy`` can be compiled with
BACKENDS = ("eager", "aot_eager", "inductor")


def _load(torchtune_dir: str | None):
    """(loss class, norm class, where from)."""
    if not torchtune_dir:
        return _ChunkedCE, _RMSNorm, "transcribed (torchtune 0.3.1)"
    root = Path(torchtune_dir) / "torchtune" / "modules"

    def mod(rel: str, name: str):
        spec = importlib.util.spec_from_file_location(name, root / rel)
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
        return m

    return (mod("loss/ce_chunked_output_loss.py", "tt_ce_chunked").CEWithChunkedOutputLoss,
            mod("rms_norm.py", "tt_rms_norm").RMSNorm, str(root))


@dataclasses.dataclass(frozen=True)
class TailMeasure:
    """Bytes of one forward + backward of the tail, above its weights, the leaf and the labels."""

    method: str  #: "full" (output projection trained) or "lora" (frozen)
    backend: str  #: one of BACKENDS
    batch: int
    seq_len: int
    hidden: int
    vocab: int
    chunks: int
    #: live after the loss and ``del logits``, before backward: what the graph keeps (+ the loss
    #: and the shifted labels the loop holds)
    forward_end_bytes: int
    #: peak within the forward (norm, projections, loss)
    forward_peak_bytes: int
    #: peak over forward and backward
    peak_bytes: int
    source: str = "transcribed (torchtune 0.3.1)"


#: the CPU matmul kernels (oneDNN): their bf16 paths allocate scratch inside the op (an fp32 copy of
#: the weight, a workspace) and free it before the op returns; CUDA's cuBLAS has no such buffers
#: (its workspace is ftplan's ``cublas_workspace_bytes``), so they are left out
_MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear")


def _allocations(prof) -> list[tuple[int, int, int]]:
    """(time, address, bytes) of every allocation (> 0) and free (< 0) the profiler saw, in
    order, without the matmul kernels' own scratch (:data:`_MATMUL_OPS`)."""
    from torch._C._profiler import _EventType

    out = []  # (time, ptr, bytes, end of the innermost matmul op around it or None)
    stack = [(e, None) for e in prof.profiler.kineto_results.experimental_event_tree()]
    while stack:
        e, mm_end = stack.pop()
        if e.tag == _EventType.Allocation:
            out.append((e.start_time_ns, e.extra_fields.ptr, e.extra_fields.alloc_size, mm_end))
        elif e.tag == _EventType.TorchOp and e.name in _MATMUL_OPS:
            mm_end = e.end_time_ns
        stack.extend((c, mm_end) for c in e.children)
    out.sort(key=lambda r: r[0])
    # a free and the next allocation at the same address can carry the same timestamp and come
    # out in the wrong order: put each block's free before the address is allocated again
    fixed: list = []
    live_at: dict[int, int] = {}
    owed: dict[int, int] = {}
    for t, ptr, n, mm_end in out:
        if n > 0:
            if ptr in live_at:
                fixed.append((t, ptr, -live_at[ptr], None))
                owed[ptr] = owed.get(ptr, 0) + 1
            live_at[ptr] = n
            fixed.append((t, ptr, n, mm_end))
        elif owed.get(ptr):
            owed[ptr] -= 1
        else:
            live_at.pop(ptr, None)
            fixed.append((t, ptr, n, mm_end))
    out = fixed
    scratch: set[int] = set()  # indices of allocations freed inside their matmul op, and their frees
    open_at: dict[int, int] = {}
    for i, (t, ptr, n, mm_end) in enumerate(out):
        if n > 0:
            open_at[ptr] = i
        elif ptr in open_at:
            j = open_at.pop(ptr)
            end = out[j][3]
            if end is not None and t <= end:
                scratch |= {i, j}
    return [(t, ptr, n) for i, (t, ptr, n, _e) in enumerate(out) if i not in scratch]


#: bytes of the block allocated (and freed) between the forward and the backward, as a mark
_MARK = 12347


def _replay(events, stop: int | None, exclude: set[int]) -> tuple[int, int]:
    """(peak, final) live bytes of the blocks allocated in ``events[:stop]`` (frees of older
    blocks ignored), leaving out the blocks still live at the end of ``events`` at the addresses
    in ``exclude`` (the gradients; an address can hold other blocks earlier)."""
    last = {ptr: i for i, (_t, ptr, n) in enumerate(events) if n > 0 and ptr in exclude}
    skip = set(last.values())
    live: dict[int, int] = {}
    cur = peak = 0
    for i, (_t, ptr, n) in enumerate(events[:stop]):
        if abs(n) == _MARK or i in skip:
            continue
        if n > 0:
            live[ptr] = n
            cur += n
        elif ptr in live:
            cur -= live.pop(ptr)
        peak = max(peak, cur)
    return peak, cur


def measure_tail(*, batch: int, seq_len: int, hidden: int = 64, vocab: int = 4096, chunks: int = 8,
                 method: str = "lora", backend: str = "eager", torchtune_dir: str | None = None,
                 seed: int = 0, counter: str = "profiler") -> TailMeasure:
    """One forward + backward of torchtune's tail as the recipe runs it (see the module doc).
    ``counter="dispatch"`` (eager only, no profiler start-up: the fast CI check): count the op
    outputs with :mod:`~ftplan.measure.distributed`'s storage tracker instead of the allocator's
    events (the same bytes: the matmul kernels' scratch is not an op output)."""
    from torch.profiler import ProfilerActivity, profile

    if method not in ("full", "lora") or backend not in BACKENDS:
        raise ValueError(f"method full|lora, backend one of {BACKENDS} (got {method!r}, {backend!r})")
    if counter not in ("profiler", "dispatch") or (counter == "dispatch" and backend != "eager"):
        raise ValueError("counter: profiler, or dispatch with the eager backend (a dispatch mode does not see "
                         "inside compiled code)")
    loss_cls, norm_cls, where = _load(torchtune_dir)
    torch.manual_seed(seed)
    norm = norm_cls(hidden).to(torch.bfloat16)
    output = torch.nn.Linear(hidden, vocab, bias=False).to(torch.bfloat16)
    for p in [*norm.parameters(), *output.parameters()]:
        p.requires_grad_(method == "full")
    loss_fn = loss_cls(num_output_chunks=chunks)
    if backend != "eager":
        torch._dynamo.reset()
        loss_fn.compute_cross_entropy = torch.compile(loss_fn.compute_cross_entropy, backend=backend)
    ignore_labels_cache = torch.full((batch, 1), -100, dtype=torch.long)

    def step(x, tokens):
        h = norm(x)  # TransformerDecoder.forward: h = self.norm(h)
        logits = [output(chunk) for chunk in h.chunk(chunks, dim=1)]  # chunked_output
        del h
        labels = torch.hstack((tokens[..., 1:], ignore_labels_cache[: tokens.shape[0]]))
        loss = loss_fn(logits, labels)
        del logits  # "free logits otherwise it peaks backward memory"
        mark = torch.empty(_MARK, dtype=torch.uint8)
        del mark
        loss.backward()
        return loss, labels

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokens = torch.randint(0, vocab, (batch, seq_len))
        x0 = torch.randn(batch, seq_len, hidden, dtype=torch.bfloat16, requires_grad=True)
        step(x0, tokens)  # compile, warm up
        for p in [x0, *norm.parameters(), *output.parameters()]:
            p.grad = None
        x = torch.randn(batch, seq_len, hidden, dtype=torch.bfloat16, requires_grad=True)
        gc.collect()
        if counter == "dispatch":
            return _dispatch_measure(step, x, tokens, [*norm.parameters(), *output.parameters()],
                                     ignore_labels_cache, TailMeasure(
                                         method=method, backend=backend, batch=batch, seq_len=seq_len,
                                         hidden=hidden, vocab=vocab, chunks=chunks, forward_end_bytes=0,
                                         forward_peak_bytes=0, peak_bytes=0, source=where))
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            loss, labels = step(x, tokens)
        grads = {p.grad.untyped_storage().data_ptr() for p in [x, *norm.parameters(), *output.parameters()]
                 if p.grad is not None}
        del loss, labels
    events = _allocations(prof)
    mid = next(i for i, (_t, _p, n) in enumerate(events) if n == _MARK)
    fwd_peak, fwd_end = _replay(events, mid, grads)
    peak, _ = _replay(events, None, grads)
    return TailMeasure(method=method, backend=backend, batch=batch, seq_len=seq_len, hidden=hidden, vocab=vocab,
                       chunks=chunks, forward_end_bytes=fwd_end, forward_peak_bytes=fwd_peak, peak_bytes=peak,
                       source=where)


def _dispatch_measure(step, x, tokens, params, cache, blank: TailMeasure) -> TailMeasure:
    from .distributed import StorageTracker, replay_peak

    tr = StorageTracker()
    for t in [*params, x, tokens, cache]:
        tr.register_tensor(t)
    with tr:
        tr.phase = "forward"
        loss, labels = step(x, tokens)  # its mark block: forward phase, freed at once
    grads = {k for p in [x, *params] if p.grad is not None for k in tr.key_of(p.grad)}
    mark = {sid for _ph, sid, d in tr.events if d == _MARK}
    events = [(ph, sid, d) for ph, sid, d in tr.events if sid not in mark]
    # the forward ends at the mark: split the events there
    cut = next(i for i, (_ph, sid, _d) in enumerate(tr.events) if sid in mark)
    before = [e for e in tr.events[:cut] if e[1] not in mark]
    registered = {sid for sid, (phase, _o) in tr.meta.items() if phase == "init"}
    keep = lambda k: k not in grads and k not in registered  # noqa: E731
    fwd_end = sum(d for _ph, k, d in before if keep(k))
    del loss, labels
    return dataclasses.replace(blank, forward_end_bytes=fwd_end,
                               forward_peak_bytes=replay_peak(before, keep, {"forward"}),
                               peak_bytes=replay_peak(events, keep, {"forward"}))
