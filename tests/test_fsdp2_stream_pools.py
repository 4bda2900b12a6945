"""FSDP2's CUDA stream pools (``sharding.fsdp2_moment_peak``'s ``pool_peaks``, ``memory.estimate_memory``'s
``stream_pools`` component): each pool's peak derived by hand from llama-3.1-8b's sizes (config.json:
hidden 4096, 8 KV heads of 128, intermediate 14336, vocabulary 128256, 32 layers, untied head) under
8-GPU FSDP2 with accelerate's wrapping, bf16 ``param_dtype`` / ``reduce_dtype`` and fp32 sharded
parameters. What each stream allocates is read in torch 2.13's ``_fsdp_collectives.py`` (see the
docstrings); no GPU measured it. No torch needed."""

from __future__ import annotations

from fractions import Fraction

from ftplan.catalog.constants import memory_constants
from ftplan.catalog.models import resolve_model
from ftplan.job import Job, Layout
from ftplan.memory import estimate_memory, model_states
from ftplan.sharding import ActivationSchedule, fsdp2_moment_peak, layout_memory

MODEL = resolve_model("llama-3.1-8b")
FULL = Job(method="full", micro_batch=1, seq_len=2048, gradient_checkpointing=True)
FSDP8 = Layout(8, 1, "fsdp")
N = 8

H, KV, I, V = 4096, 8 * 128, 14336, 128256
LAYER = 2 * H * H + 2 * KV * H + 3 * H * I + 2 * H  # q, o; k, v; gate, up, down; two RMSNorm weights
EMBED = V * H
TAIL = H + V * H  # final norm, lm_head
TOTAL = EMBED + 32 * LAYER + TAIL  # (every dim 0 divides by 8: no padding)


def _pools(job: Job = FULL, layout: Layout = FSDP8, acts_grads: bool = True):
    lm = layout_memory(MODEL, job, layout, model_states(MODEL, job), memory_constants(), "cuda")
    units, n, kw, grad_scale = lm.fsdp2_walk
    acts = ActivationSchedule(Fraction(0), (Fraction(0),) * MODEL.num_layers, Fraction(0), Fraction(0),
                              Fraction(0), Fraction(0), grad_scale=grad_scale if acts_grads else Fraction(0))
    return units, n, kw, fsdp2_moment_peak(list(units), n, acts, **kw)


def test_the_units_are_the_hand_sizes():
    units, n, kw, _ = _pools()
    assert n == N and kw["param_b"] == 2 and kw["reduce_b"] == 2 and not kw["hsdp"]
    assert [(u.name, u.count, u.numel()) for u in units] == [("embed", 1, EMBED), ("layer0", 32, LAYER),
                                                             ("tail", 1, TAIL)]


def test_all_gather_pool_is_the_largest_pair_of_consecutive_gathers():
    """Forward: a unit's bf16 all-gather output lives until the next unit's copy-out, beside the
    next one's cast shard (fp32 -> bf16: a copy of every tensor, 1/8 of its output) and output; the
    largest pair in forward order is the last layer then the final norm + head."""
    *_, mp = _pools()
    pairs = [(EMBED, LAYER), (LAYER, LAYER), (LAYER, TAIL)]
    want = max(2 * a + 2 * b + 2 * b // N for a, b in pairs)
    assert want == 2 * LAYER + 2 * TAIL + 2 * TAIL // N
    assert mp.pool_peak("all_gather") == want


def test_reduce_scatter_pool_holds_every_gradient_shard():
    """Every fp32 gradient shard (cast on the reduce-scatter stream, kept until zero_grad frees it
    into that pool), and beside the last one its bf16 reduce-scatter output: the embedding's, the
    last unit reduced."""
    *_, mp = _pools()
    grads = 4 * TOTAL // N
    assert mp.pool_peak("reduce_scatter") == grads + 2 * EMBED // N
    assert mp.pool_peak("reduce_scatter") >= grads
    assert mp.pool_peak("all_reduce") == 0
    # no kept gradients placed (CPU offload, accumulation's): only the largest bf16 output, the
    # final norm + head's (the first unit reduced)
    *_, none = _pools(acts_grads=False)
    assert none.pool_peak("reduce_scatter") == 2 * TAIL // N


def test_hsdp_casts_on_the_all_reduce_stream():
    """HSDP: the bf16 reduce-scatter outputs stay in the reduce-scatter pool until backward ends
    (``_all_reduce_state``), the fp32 shards are cast on the all-reduce stream."""
    *_, mp = _pools(layout=Layout(8, 2, "fsdp", hsdp=True))
    assert mp.pool_peak("reduce_scatter") == 2 * TOTAL // N
    assert mp.pool_peak("all_reduce") == 4 * TOTAL // N


def test_pools_cover_the_allocated_peak():
    """Each pool's own peak: together at least the walk's total at its peak (the peaks need not
    coincide)."""
    *_, mp = _pools()
    assert sum(b for _, b in mp.pool_peaks) >= mp.total
    assert mp.pool_peak("default") < mp.total


def test_estimate_reserves_the_pools_on_cuda_only():
    consts = memory_constants()
    cuda = estimate_memory(MODEL, FULL, FSDP8)
    c = cuda.components
    assert sum(c.values()) == cuda.device_total_bytes
    assert cuda.peak_reserved_bytes == cuda.peak_allocated_bytes + c["stream_pools"] + c["allocator_reserve"]
    # the allocated peak keeps its composition
    assert sum(v for k, v in c.items() if k not in ("cuda_context", "nccl_buffers", "stream_pools",
                                                    "allocator_reserve")) == cuda.peak_allocated_bytes
    assert c["stream_pools"] > 0 and any("cannot reuse" in n and "stream_pools" in n for n in cuda.notes)
    # reserved without the reserve holds at least the resident shards and states (default pool)
    # beside both side pools as derived by hand
    resident = 4 * TOTAL // N + c["optimizer_states"]
    side = 2 * LAYER + 2 * TAIL + 2 * TAIL // N + 4 * TOTAL // N + 2 * EMBED // N
    assert cuda.peak_reserved_bytes - c["allocator_reserve"] >= resident + side + consts.cublas_workspace_bytes
    # CPU: no streams, the old composition
    cpu = estimate_memory(MODEL, FULL, FSDP8, backend="cpu")
    assert cpu.components["stream_pools"] == 0
    assert cpu.peak_reserved_bytes == cpu.peak_allocated_bytes + cpu.components["allocator_reserve"]
    # other engines: no side pools planned
    z3 = estimate_memory(MODEL, FULL, Layout(8, 1, "zero3"))
    assert z3.components["stream_pools"] == 0
