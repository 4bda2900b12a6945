"""Per-rank memory of data-parallel engines: DDP, DeepSpeed ZeRO-1/2/3, FSDP1 and FSDP2.

``layout_memory(model, job, layout, states) -> LayoutMemory``: what one rank holds of the model
states (sharded or replicated, on the device or offloaded to the host), the engine's persistent
buffers, and the engine's transient peak during forward/backward (gathered parameters, unsharded
gradients, reduce-scatter and bucket buffers), for the engine the layout names
(``Layout.engine``). Pure functions, bytes; no torch.

What each engine keeps (read in the installed torch 2.13 / deepspeed 0.19 / accelerate 1.15 code,
held against real multi-process gloo runs by ``tests/test_distributed_memory.py``):

* **FSDP2** (``fully_shard``, accelerate's ``fsdp2_prepare_model`` with ``mixed_precision=bf16``):
  trainable parameters upcast to fp32 and sharded on dim 0 (each tensor padded to a multiple of the
  shard degree); they are the master copy. ``MixedPrecisionPolicy(param_dtype=bf16,
  reduce_dtype=bf16)``: a unit (decoder layer, input embedding, [final norm, lm_head]) is gathered in
  bf16, its gradients are bf16 and reduce-scattered in bf16, then cast to fp32 into the sharded
  gradient (a view of one flat fp32 shard per unit). Transients follow the unit schedule of
  :func:`fsdp2_transient_bytes`; the per-rank peak is the largest moment of that walk with the
  activations placed on it (:func:`fsdp2_moment_peak`: each layer's saved tensors from its forward
  to its backward, the loss around the head, a layer's recompute at its backward, the gradient
  shards as each unit's post-backward makes them; ``memory.estimate_memory``), held per rank on
  gloo by ``tests/test_fsdp2_moment_peak.py``. The other engines' peaks stay the sum of the
  separate peaks (saved activations + the largest activation transient + the engine's transient).
* **FSDP1** (``FullyShardedDataParallel``, ``use_orig_params=False``): one flat fp32 parameter per
  wrapped unit, sharded; same mixed precision; one fp32 ``step`` per flat parameter.
* **DeepSpeed ZeRO-1/2** (``bf16.enabled``): the module is cast to bf16 and kept whole (a flat bf16
  buffer), fp32 master and AdamW states are partitioned, gradients are reduced into a bf16
  partition (fp32 during the step), HF Trainer's torch optimizer over the flat fp32 partition (one
  ``step`` scalar); an ``ipg`` bucket of ``reduce_bucket_size`` elements (two with
  ``overlap_comm``).
* **DeepSpeed ZeRO-3**: bf16 partitions (parameters under ``stage3_param_persistence_threshold``
  elements are also kept whole), fp32 master and states partitioned, a persistent bf16 gradient
  partition buffer and ipg bucket; modules are gathered as they run.
* **DDP**: replicated states; the reducer keeps one bucket buffer per group of gradients, as large
  as all gradients together (with ``gradient_as_bucket_view`` the gradients are views of it).
"""

from __future__ import annotations

import dataclasses
import functools

from dataclasses import dataclass, field
from fractions import Fraction

from .catalog.constants import MemoryConstants
from .job import PRECISIONS, Job, Layout, lora_targets, lora_wraps_experts
from .model import LAYER_INPUT_PROJECTIONS, LayerGroup, ModelSpec, layer_group_order, layer_linears, mlp_linears
from .torchao_nf4 import nf4_element_bytes, nf4_table_bytes
from .units import dtype_bytes

__all__ = ["LayoutMemory", "layout_memory", "communicator_groups", "activation_job", "engine_compute", "fsdp_units",
           "fsdp2_transient_bytes", "fsdp2_moment_peak", "ActivationSchedule", "MomentPeak", "Tensor", "Unit", "layer_linears", "quant_state_bytes", "ds_flat_order",
           "zero12_rank_bytes"]



def communicator_groups(layout: Layout) -> tuple[tuple[str, int], ...]:
    """The process groups one rank runs collectives on, as (name, ranks): each is one NCCL/RCCL
    communicator with its own device buffers (``MemoryConstants.communicator_bytes``).

    The default (world) group: accelerate / HF Trainer barriers and, without TP/PP, the
    data-parallel collectives of DDP and FSDP (a 1-D device mesh over the world reuses it).
    DeepSpeed clones the world group for its data-parallel group (``deepspeed/utils/groups.py``
    ``_clone_world_group``: ``dist.new_group`` over every rank), a second communicator. HSDP adds the
    shard group (within a node) and the replicate group (across nodes); TP, PP and EP add their own
    groups, and with TP/PP the data-parallel group is a group of its own."""
    world = layout.world_size
    if world <= 1:
        return ()
    groups = [("world", world)]
    dp = layout.dp
    if layout.engine == "deepspeed":
        groups.append(("deepspeed data-parallel", dp))
    elif dp != world and dp > 1:
        groups.append(("data-parallel", dp))
    if layout.hsdp and layout.strategy == "fsdp":
        groups += [("hsdp shard", layout.shard_degree), ("hsdp replicate", max(1, dp // layout.shard_degree))]
    if layout.tp > 1:
        groups.append(("tensor-parallel", layout.tp))
    if layout.pp > 1:
        groups.append(("pipeline-parallel", layout.pp))
    if getattr(layout, "ep", 1) > 1:
        groups.append(("expert-parallel", layout.ep))
    return tuple((name, n) for name, n in groups if n > 1)


def quant_state_bytes(model: ModelSpec, job: Job) -> int:
    """bitsandbytes 4-bit quantization state of every quantized linear (``QuantState``): per tensor
    the 16-entry fp32 nf4/fp4 code and either an fp32 absmax per block, or (double quant) a uint8
    absmax per block + ``state2``: an fp32 absmax per 256 absmax-blocks, a 256-entry fp32 code and
    an fp32 offset. Held byte-exact against bitsandbytes 0.50 on CPU."""
    q = job.quant
    skip = set(q.skip_modules)
    total = 0
    if job.torchao_nf4:
        # torchao's NF4Tensor: only its scaler mean and 16-entry code stay whole on every rank
        # (the codes, scalers and factors are the tensor's elements: _layer_tensors)
        table = nf4_table_bytes(int(dtype_bytes(q.compute_dtype)))
        return sum(lin.count * table for lin in model.linears() if lin.is_module and lin.module not in skip)
    for lin in model.linears():
        if lin.is_module and lin.module not in skip:
            blocks = -(-(lin.in_features * lin.out_features) // q.blocksize)
            per = 16 * 4 + (blocks + 4 * -(-blocks // 256) + 256 * 4 + 4 if q.double_quant else 4 * blocks)
            total += lin.count * per
    return total


@dataclass(frozen=True)
class Tensor:
    """One parameter tensor as the engine stores it."""

    dim0: int
    numel: int  # stored elements (bitsandbytes 4-bit: packed elements of the storage dtype)
    nbytes: Fraction  # stored bytes per element
    trainable: bool

    def padded(self, n: int) -> int:
        """Elements after padding dim 0 to a multiple of ``n`` (FSDP2 ``Shard(0)``)."""
        if n <= 1 or self.dim0 <= 0:
            return self.numel
        rest = self.numel // self.dim0
        return -(-self.dim0 // n) * n * rest


@dataclass(frozen=True)
class Unit:
    """An FSDP unit (a ``fully_shard`` call / an FSDP1 wrapped module): ``count`` identical ones."""

    name: str
    tensors: tuple[Tensor, ...]
    count: int = 1
    reshard_after_forward: bool = True
    #: elements of the trainable tensor whose gradient arrives last in the unit's backward (torch
    #: 2.13's ``foreach_reduce`` loop variable still holds it while the unit's post-backward
    #: reduce-scatters: freed after; torch 2.15 frees it with the others)
    late: int = 0
    #: tied embedding unit, gathered by the embedding at the start of forward and reduced at the
    #: end of backward: its final-norm gradient (``early`` elements) is made at the start of
    #: backward, and the lm_head's gradient contribution (``held`` elements, in autograd's input
    #: buffer of the shared weight) waits there for the embedding's
    early: int = 0
    held: int = 0
    #: forward calls per step (torchtune's output projection: once per loss chunk). Each call
    #: gathers and reshards the unit; in backward each call's pre-backward gathers it again and
    #: its post-backward reshards it, with no gradient to reduce until the last one (autograd sums
    #: the calls' weight gradients in its input buffer before the parameter's gradient exists:
    #: those partial sums are planned here, not in ``memory._torchtune_loss_bytes``)
    calls: int = 1

    def numel(self, trainable: bool | None = None) -> int:
        return sum(t.numel for t in self.tensors if trainable is None or t.trainable == trainable)


@dataclass(frozen=True)
class LayoutMemory:
    """Per-rank bytes (Fractions: exact) of the model states and the engine's buffers."""

    frozen_weights: Fraction
    trainable_weights: Fraction
    master_weights: Fraction
    gradients: Fraction
    optimizer_states: Fraction
    comm_buffers: Fraction  # persistent engine buffers (DDP buckets, ZeRO-3 ipg/gradient buffers)
    transient: Fraction  # engine transient peak during forward/backward (not resident)
    step_transient: Fraction  # engine temporaries of the optimizer step (ZeRO fp32 gradients)
    host: Fraction  # offloaded to CPU RAM
    #: activations run in the compute dtype (FSDP mixed precision / DeepSpeed bf16 cast the weights;
    #: sharded QLoRA computes on compute-dtype non-quantized weights)
    pure_compute_dtype: bool = False
    notes: tuple[str, ...] = field(default=())
    #: gradient bytes autograd holds outside the engine during backward (FSDP2, tied embeddings:
    #: the lm_head's contribution waits for the embedding's); part of the peak, not of ``transient``
    autograd_held: Fraction = Fraction(0)
    #: FSDP2 under torchtune's wrapping (``Layout.fsdp_wrap``): the engine's forward peak, apart
    #: from ``transient`` (then the backward's): the root's all-gather output is still held when the
    #: first layer is copied out, at the very start of the forward, where the activations are not
    #: yet saved. ``forward_layers_done``: the share of the decoder layers whose forward has ended at
    #: that peak (1: at or after the output projection)
    forward_transient: Fraction | None = None
    forward_layers_done: Fraction = Fraction(1)
    #: FSDP2: the arguments of this layout's walk (units, shard degree, the keyword arguments of
    #: ``fsdp2_moment_peak``, the kept gradient bytes per byte of trainable shards on the device),
    #: for ``memory.estimate_memory``'s moment-by-moment peak; () for the other engines
    fsdp2_walk: tuple = ()


def activation_job(job: Job, lm: "LayoutMemory") -> Job:
    """The job whose single-GPU activations the engine's forward matches: FSDP's mixed precision
    (``param_dtype``) and DeepSpeed's bf16 mode run the model on compute-dtype weights, like pure
    compute-dtype training (no autocast copies, a compute-dtype residual stream); sharded QLoRA
    computes on compute-dtype non-quantized weights (TRL skips ``prepare_model_for_kbit_training``
    for a float quant storage, and FSDP gathers in ``param_dtype`` anyway), like LoRA on a
    compute-dtype base."""
    if not lm.pure_compute_dtype:
        return job
    compute = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}
    if job.method == "qlora":
        return job.with_(method="lora", precision=compute[job.quant.compute_dtype])
    if job.precision.endswith("-mixed"):
        # an fp32-loaded LoRA base is gathered (FSDP) or cast (DeepSpeed) to the compute dtype too
        return job.with_(precision=job.precision[: -len("-mixed")], base_dtype="compute")
    return job


def engine_compute(job: Job, layout: Layout) -> str:
    """How the engine runs the forward of a mixed-precision job on compute-dtype weights (what
    ``activation_job`` turns into pure compute-dtype training), where that still differs from it:

    * ``"autocast"``: FSDP1/FSDP2 as accelerate runs them with ``mixed_precision="bf16"`` (or fp16):
      FSDP's ``param_dtype`` copies *and* ``torch.autocast`` around the forward (accelerate 1.15
      ``Accelerator.__init__`` sets ``native_amp`` for every distributed type but DeepSpeed and
      Megatron, ``prepare_model`` wraps ``model.forward`` in
      ``utils/modeling.get_mixed_precision_context_manager``, which lists ``DistributedType.FSDP``):
      an explicit fp32 upcast before a matmul is cast back by autocast;
    * ``"cast"``: DeepSpeed's bf16/fp16 mode: the whole module cast to the compute dtype, no
      autocast (``native_amp`` stays off for DeepSpeed): an fp32 upcast runs in fp32;
    * ``""``: the job's own dtypes (one device, DDP: HF Trainer's autocast on the stored weights
      iff ``-mixed``; pure compute-dtype precisions everywhere).

    Only transformers' fp32 paths tell them apart: the deepseek_v3 / glm4_moe router
    (``memory._moe_saved``)."""
    if not job.precision.endswith("-mixed"):
        return ""
    if layout.engine in ("fsdp1", "fsdp2"):
        return "autocast"
    return "cast" if casts_whole_module(job, layout.engine) else ""


# ---------------------------------------------------------------------------------------------
# the parameter tensors, unit by unit
# ---------------------------------------------------------------------------------------------
def casts_whole_module(job: Job, engine: str) -> bool:
    """DeepSpeed's bf16/fp16 mode casts every parameter to the compute dtype (deepspeed 0.19
    ``engine._cast_module_mixed_precision``; its ``keep_in_fp32_modules`` covers buffers only)."""
    return engine == "deepspeed" and job.precision.endswith("-mixed")


def _stored_bytes(job: Job, engine: str) -> tuple[Fraction, Fraction]:
    """(trainable, frozen) bytes per element as the engine stores them."""
    prec = PRECISIONS[job.precision]
    if casts_whole_module(job, engine):
        # DeepSpeed's bf16/fp16 mode casts the whole module to the compute dtype (fp32 masters
        # live in the optimizer)
        c = dtype_bytes(prec["compute"])
        return c, c
    if job.method == "full":
        return dtype_bytes(prec["trainable"]), dtype_bytes(prec["trainable"])
    # PEFT keeps adapters in fp32. Sharded QLoRA (FSDP) loads the model in the quant storage dtype
    # and skips prepare_model_for_kbit_training's fp32 upcast (TRL's is_sharded_qlora path, PEFT's
    # FSDP-QLoRA recipe, ftplan's exported train.py; FSDP1's flat parameters need one dtype): the
    # non-quantized weights stay in that dtype
    if job.torchao_nf4:  # torchtune's QLoRA: adapters and unquantized weights in its one dtype
        return dtype_bytes(job.adapter_dtype), dtype_bytes(job.unquantized_dtype)
    if job.method == "qlora":
        return Fraction(4), _quant_storage_bytes(job) if engine in ("fsdp1", "fsdp2") else Fraction(4)
    return Fraction(4), dtype_bytes(job.frozen_dtype)


def _layer_tensors(model: ModelSpec, g: LayerGroup, job: Job, tb: Fraction, fb: Fraction,
                   ep: int = 1, engine: str = "fsdp2") -> list[Tensor]:
    h = model.hidden_size
    full = job.method == "full"
    out: list[Tensor] = []
    targets = lora_targets(model, job.lora) if job.uses_lora else frozenset()
    skip = set(job.quant.skip_modules)
    r = job.lora.r
    wb = tb if full else fb
    if g.attention is not None and g.attention.sinks:  # gpt_oss: the attention module's own parameter, registered first
        out.append(Tensor(g.attention.num_heads, g.attention.num_heads, wb, full))
    la = g.linear_attention
    if la is not None:  # Gated DeltaNet: conv1d weight (C, 1, K), dt_bias, A_log, the gated norm, then its linears
        out += [Tensor(la.conv_dim, la.conv_dim * la.conv_kernel, wb, full),
                Tensor(la.num_v_heads, la.num_v_heads, wb, full), Tensor(la.num_v_heads, la.num_v_heads, wb, full),
                Tensor(la.v_head_dim, la.v_head_dim, wb, full)]
    sc = g.short_conv
    if sc is not None:  # LFM2's short convolution: the Conv1d weight (h, 1, K) and bias, then its linears
        out.append(Tensor(h, h * sc.conv_kernel, wb, full))
        if sc.bias:
            out.append(Tensor(h, h, wb, full))
    for lin in layer_linears(model, g):
        n = lin.in_features * lin.out_features
        if job.torchao_nf4 and lin.module not in skip:
            # torchao's NF4Tensor, sharded on dim 0 (its rows) and gathered as its codes, int8 block
            # scalers and factors (NF4Tensor.fsdp_pre_all_gather); the tables: quant_state_bytes
            out.append(Tensor(lin.out_features, n, nf4_element_bytes(int(dtype_bytes(job.quant.compute_dtype))), False))
        elif job.method == "qlora" and lin.module not in skip:
            # Params4bit with a float quant storage (bnb_4bit_quant_storage): n/2 bytes packed into
            # n / (2 * storage bytes) elements, shape (elements, 1)
            sb = _quant_storage_bytes(job)
            k = n // int(2 * sb)
            out.append(Tensor(k, k, sb, False))
        else:
            out.append(Tensor(lin.out_features, n, wb, full))
        if lin.bias:
            out.append(Tensor(lin.out_features, lin.out_features, wb, full))
        if lin.module in targets:
            out.append(Tensor(r, r * lin.in_features, tb, True))
            out.append(Tensor(lin.out_features, lin.out_features * r, tb, True))
    a = g.attention
    # registration order as in Hugging Face's decoder layers (DeepSpeed flattens the parameters in
    # this order): attention (its q/k norms), the MLP or MoE block, then the layer norms
    if a is not None and a.qk_norm:
        out += [Tensor(size, size, wb, full) for size in a.qk_norm_sizes]
    if a is not None and a.is_mla:
        out.append(Tensor(a.kv_lora_rank, a.kv_lora_rank, wb, full))
        if a.q_lora_rank:
            out.append(Tensor(a.q_lora_rank, a.q_lora_rank, wb, full))
    if g.moe is not None:
        m = g.moe
        e, i = m.num_experts // max(1, ep), m.expert_intermediate_size  # a rank's experts under EP
        # router; a family's fp32 router (MoeSpec.router_fp32) stays fp32 unless DeepSpeed's bf16
        # mode casts the whole module
        rb = max(wb, Fraction(4)) if m.router_fp32 and not casts_whole_module(job, engine) else wb
        if m.router_is_module:  # gemma4: router.proj is among the linears; its two scale vectors
            out += [Tensor(h, h, wb, full), Tensor(m.num_experts, m.num_experts, wb, full)]
        else:
            out.append(Tensor(e, e * h, rb, full))
        if m.frozen_bias_param:  # ernie4_5_moe: the frozen fp32 (1, E) e_score_correction_bias
            out.append(Tensor(1, m.num_experts, rb, False))
        if m.bias:  # gpt_oss: router bias, and each fused expert weight followed by its (E, out) bias
            out.append(Tensor(e, e, wb, full))
        out.append(Tensor(e, e * 2 * i * h, wb, full))  # fused gate_up_proj (E, 2I, h)
        if m.bias:
            out.append(Tensor(e, e * 2 * i, wb, full))
        out.append(Tensor(e, e * h * i, wb, full))  # fused down_proj (E, h, I)
        if m.bias:
            out.append(Tensor(e, e * h, wb, full))
        if job.uses_lora and lora_wraps_experts(model, job.lora):
            # PEFT ParamWrapper: lora_A [r_eff * E, in], lora_B [out, r_eff * E] (gate_up at 2r)
            out += [Tensor(e * 2 * r, e * 2 * r * h, tb, True), Tensor(2 * i, 2 * i * e * 2 * r, tb, True),
                    Tensor(e * r, e * r * i, tb, True), Tensor(h, h * e * r, tb, True),
                    Tensor(r, r * h, tb, True), Tensor(e, e * r, tb, True)]
    # (phimoe's nn.LayerNorm: weight then bias, per norm)
    out += [Tensor(h, h, wb, full)] * (g.norms_per_layer * (2 if model.norm_bias else 1))
    return out


def _quant_storage_bytes(job: Job) -> Fraction:
    """``bnb_4bit_quant_storage`` of sharded QLoRA: the compute dtype (what ftplan exports)."""
    return dtype_bytes(job.quant.compute_dtype)


#: torchtune's ``CEWithChunkedOutputLoss(num_output_chunks=8)`` default, which every recipe config
#: uses (torchtune 0.3.1 modules/loss/ce_chunked_output_loss.py)
TORCHTUNE_OUTPUT_CHUNKS = 8


def torchtune_output_calls(job: Job) -> int:
    """How many times torchtune's decoder calls its output projection in one micro-batch: once per
    chunk of ``CEWithChunkedOutputLoss`` (``torch.chunk`` of the sequence: ceil(s / 8) positions
    per chunk, so fewer chunks when s < 8 or s is just above a multiple), once otherwise."""
    if job.loss != "torchtune":
        return 1
    size = -(-job.seq_len // TORCHTUNE_OUTPUT_CHUNKS)
    return -(-job.seq_len // size)


def fsdp_units(model: ModelSpec, job: Job, engine: str = "fsdp2", reshard_after_forward: bool = True,
               ep: int = 1, wrap: str = "accelerate") -> list[Unit]:
    """The units accelerate wraps, in forward order: the input embedding (untied), every decoder
    layer, then [final norm, lm_head (and the tied embedding)] with ``reshard_after_forward=False``
    (FSDP2); FSDP1's transformer auto-wrap makes the decoder layers units and leaves the rest to
    the root unit. With expert parallelism (``ep`` > 1) a rank's layer holds ``num_experts / ep``
    routed experts (what it gathers).

    ``wrap="torchtune"`` (FSDP2, ``Layout.fsdp_wrap``): torchtune 0.3.x ``training.shard_model``
    (``reversed(model.named_modules())``: ``fully_shard`` on every ``layers.i`` and on the
    ``custom_sharded_layers``, then on the whole model), as its recipes call it: LoRA / QLoRA
    (``lora_finetune_distributed``) shards the decoder layers only, so the root unit holds the
    embedding, the final norm and the output projection; full fine-tuning
    (``full_finetune_distributed`` with its configs' ``custom_sharded_layers: ['tok_embeddings',
    'output']``) makes the embedding and the output projection units of their own (resharded
    after forward like the layers), the root holding the final norm. The root is gathered first
    and never resharded after forward (the torch of torchtune 0.3.x, 2.4/2.5, kept every root
    gathered; torch 2.13 does so when ``reshard_after_forward`` is left unset, while torchtune's
    explicit ``True`` would reshard it there); the output unit is called once per loss chunk
    (``Unit.calls``)."""
    tb, fb = _stored_bytes(job, engine)
    full = job.method == "full"
    h, v = model.hidden_size, model.vocab_size
    wb = tb if full else fb
    emb = Tensor(v, v * h, wb, full)
    norm = Tensor(h, h, wb, full)
    lm_head = Tensor(v, v * h, wb, full)
    # phimoe: the final LayerNorm's bias, the lm_head's bias (``lm_head_bias``)
    norms = (norm, Tensor(h, h, wb, full)) if model.norm_bias else (norm,)
    heads = (lm_head, Tensor(v, v, wb, full)) if model.lm_head_bias else (lm_head,)
    # the input norm's weight gradient is a layer's last (LoRA: the first adapter's lora_A)
    layers = []
    for i, g in enumerate(model.groups):
        ts = tuple(_layer_tensors(model, g, job, tb, fb, ep, engine))
        late = h if full else next((t.numel for t in ts if t.trainable), 0)
        layers.append(Unit(f"layer{i}", ts, g.count, reshard_after_forward, late=late))
    if _units_in_layer_order(model):
        layers = _layers_in_order(model, layers)
    if engine == "fsdp1":
        root = (emb, *norms) if model.tie_word_embeddings else (emb, *norms, *heads)
        return layers + [Unit("root", root, 1, False)]
    if wrap == "torchtune":
        if not full:
            return [Unit("root", (emb, norm, lm_head), 1, False)] + layers
        # the root's only parameter, the final norm's weight, gets its gradient once the output
        # unit's backward is done (``early``), and is reduced at the end of backward
        return ([Unit("root", (norm,), 1, False, late=h, early=h),
                 Unit("embed", (emb,), 1, reshard_after_forward, late=v * h)]
                + layers + [Unit("output", (lm_head,), 1, reshard_after_forward, late=v * h,
                                 calls=torchtune_output_calls(job))])
    out = []
    if model.tie_word_embeddings:
        # gathered by the embedding lookup, kept (reshard_after_forward=False), reduced last
        out.append(Unit("tail", (*norms, emb), 1, False, late=v * h if full else 0,
                        early=h if full else 0, held=v * h if full else 0))
        return out + layers
    out.append(Unit("embed", (emb,), 1, reshard_after_forward, late=v * h if full else 0))
    out += layers
    out.append(Unit("tail", (*norms, *heads), 1, False, late=v * h if full else 0))
    return out


def _units_in_layer_order(model: ModelSpec) -> bool:
    """Layer groups of different sizes that interleave (gemma4's sliding and full-attention layers
    with their own head size, LFM2's conv and attention layers, Qwen3.5's Gated DeltaNet and
    attention layers): the units follow the layers' real order, which decides which units are
    gathered together (FSDP2 prefetches the next one)."""
    return len(model.groups) > 1


def _layers_in_order(model: ModelSpec, layers: list[Unit]) -> list[Unit]:
    """One unit per run of consecutive layers of the same group, in layer order."""
    from .model import layer_group_order

    out: list[Unit] = []
    for gi in layer_group_order(model):
        if out and out[-1].name == layers[gi].name:
            out[-1] = dataclasses.replace(out[-1], count=out[-1].count + 1)
        else:
            out.append(dataclasses.replace(layers[gi], count=1))
    return out


# ---------------------------------------------------------------------------------------------
# FSDP2 transient schedule
# ---------------------------------------------------------------------------------------------
@dataclass
class _Sim:
    cur: Fraction = Fraction(0)
    peak: Fraction = Fraction(0)

    def add(self, x, pool: str = "default") -> None:
        self.cur += x
        if self.cur > self.peak:
            self.peak = self.cur


#: the CUDA caching allocator's pools an FSDP2 step allocates from (``fsdp2_moment_peak``'s
#: ``pool_peaks``): the caching allocator keeps its free blocks per stream and hands a block only to
#: an allocation on the stream it was allocated on (c10/cuda/CUDACachingAllocator.cpp,
#: ``get_free_block``), so what one stream frees the others cannot reuse
FSDP2_POOLS = ("default", "all_gather", "reduce_scatter", "all_reduce")


@dataclass(frozen=True)
class ActivationSchedule:
    """What one micro-batch's activations hold on one rank, to be placed on FSDP2's step
    (``memory.estimate_memory`` fills it from ``memory.ActivationParts``; bytes).

    ``start_bytes``: held from the start of the forward to the end of the backward (token ids,
    RoPE tables, the recompute closures, the embedding's output leaf); ``layer_saved_bytes``: what
    each decoder layer, in forward order, keeps for its backward (its checkpoint input when
    checkpointed), made in its forward and freed by its backward; ``layer_backward_bytes``: on top
    during a layer's backward (its recompute, eager attention's backward; NF4's dequantized weight);
    ``loss_saved_bytes``: the final norm, the head and the loss, from the head's forward to its
    backward; ``loss_forward_bytes`` / ``loss_backward_bytes``: the loss's transients on top of
    them (the logits and their upcast at the forward's end; the logits' gradients at the start of
    backward, until the head's backward ends); ``loss_in_forward``: the loss runs inside the root's
    forward (transformers' ``labels``: the last unit's all-gather output still held) rather than
    after it (torchtune's loop). ``grad_scale``: kept (sharded) gradient bytes per byte of a
    unit's trainable shards, made at the unit's post-backward (0: the gradients live elsewhere: CPU
    offload, or all of them already exist, ``grads_at_start``: gradient accumulation).
    ``held_bytes``: autograd's gradient bytes held through backward (tied embeddings, see
    ``LayoutMemory.autograd_held``)."""

    start_bytes: Fraction
    layer_saved_bytes: tuple[Fraction, ...]
    layer_backward_bytes: Fraction
    loss_saved_bytes: Fraction
    loss_forward_bytes: Fraction
    loss_backward_bytes: Fraction
    loss_in_forward: bool = True
    #: what the loss side holds during the head unit's backward, per forward call of it (one;
    #: torchtune's output projection: one per chunk), in place of the loss's saved tensors and
    #: backward transient (the cross-entropy's own tensors are freed by then); None: both stay
    head_backward_bytes: tuple[Fraction, ...] | None = None
    grad_scale: Fraction = Fraction(0)
    grads_at_start: Fraction = Fraction(0)
    held_bytes: Fraction = Fraction(0)


@dataclass(frozen=True)
class MomentPeak:
    """The largest moment of an FSDP2 step on one rank (``fsdp2_moment_peak``): ``total`` bytes
    above the resident parameter shards and optimizer states, as ``engine`` (FSDP2's buffers and
    autograd's unsharded / held gradients), ``grads`` (the kept sharded gradients made by then),
    ``saved`` (activations saved by the layers and the model level), ``loss_saved``,
    ``act_transient`` (the loss's or a layer's backward transient); ``moment`` names it."""

    total: Fraction
    engine: Fraction
    grads: Fraction
    saved: Fraction
    loss_saved: Fraction
    act_transient: Fraction
    moment: str
    #: every moment's largest total, in step order
    moments: tuple[tuple[str, Fraction], ...] = ()
    #: each stream pool's own peak over the step (``FSDP2_POOLS``; bytes above the resident
    #: parameter shards and optimizer states, which the default stream allocated), as (pool, bytes)
    pool_peaks: tuple[tuple[str, Fraction], ...] = ()

    def pool_peak(self, pool: str) -> Fraction:
        return dict(self.pool_peaks).get(pool, Fraction(0))


class _MomentSim(_Sim):
    """``_Sim`` with the activations and kept gradients beside the engine's bytes: ``cur`` /
    ``peak`` are the totals, ``parts`` the split, ``at_peak`` the split and moment at the peak;
    ``pool_cur`` / ``pool_peak`` the same bytes by the stream pool they were allocated from
    (``FSDP2_POOLS``), each pool's peak taken on its own."""

    def __init__(self) -> None:
        super().__init__()
        self.pool_cur = {p: Fraction(0) for p in FSDP2_POOLS}
        self.pool_peak = dict(self.pool_cur)
        self.parts = {"engine": Fraction(0), "grads": Fraction(0), "saved": Fraction(0),
                      "loss_saved": Fraction(0), "act_transient": Fraction(0)}
        self.where = "forward"
        self.at_peak: tuple[dict, str] = (dict(self.parts), self.where)
        #: the largest total of each moment
        self.by_moment: dict[str, Fraction] = {}

    def put(self, kind: str, x, pool: str = "default") -> None:
        self.parts[kind] += x
        self.pool_cur[pool] += x
        if self.pool_cur[pool] > self.pool_peak[pool]:
            self.pool_peak[pool] = self.pool_cur[pool]
        self.cur += x
        if self.cur > self.by_moment.get(self.where, -1):
            self.by_moment[self.where] = self.cur
        if self.cur > self.peak:
            self.peak = self.cur
            self.at_peak = (dict(self.parts), self.where)

    def add(self, x, pool: str = "default") -> None:
        self.put("engine", x, pool)

    def pool_overlap(self, pool: str, x) -> None:
        """``x`` more bytes in ``pool`` for an instant, the totals left as they are: a pool's
        allocation made before a free the walk orders first."""
        self.pool_peak[pool] = max(self.pool_peak[pool], self.pool_cur[pool] + x)


def _unit_label(u: Unit, layer: int | None) -> str:
    """How a moment names the unit it is at."""
    if layer is not None:
        return f"decoder layer {layer}"
    return {"embed": "the input embedding", "tail": "the final norm and head unit", "output": "the output projection",
            "root": "the root"}.get(u.name, u.name)


def _unit_sequence(units: list[Unit]) -> list[Unit]:
    """The units in forward order, each repeated ``count`` times (one entry per wrapped module)."""
    return [u for u in units for _ in range(u.count)]


def fsdp2_moment_peak(units: list[Unit], n: int, acts: ActivationSchedule, *, param_b: Fraction | None,
                      reduce_b: Fraction, hsdp: bool = False, offload: bool = False, backend: str = "cuda",
                      root_output_b: Fraction = Fraction(0), torch_version: float = 2.13) -> MomentPeak:
    """The per-rank peak of an FSDP2 step, moment by moment: ``fsdp2_transient_bytes``'s walk of
    the engine's buffers (same arguments) with the activations of ``acts`` placed where they live
    and the sharded gradients kept as each unit's post-backward makes them.

    Forward: ``start_bytes`` first; each decoder layer's saved tensors after its copy-out (its
    all-gather output, its unsharded parameters and the next unit's gather beside them); the
    loss's saved tensors and forward transient after the last unit's forward. Backward: the loss's
    backward transient from the start until the head's post-backward (the unit of the last forward
    call when it is not a decoder layer: accelerate's tail, torchtune's output projection; else
    until the first layer's pre-backward, the head being part of a unit gathered earlier), with
    the loss's saved tensors freed there too; each layer's backward transient from its
    pre-backward (after its unshard and the next unit's prefetch) to its post-backward, when its
    saved tensors are freed with it; the kept gradient shard of each unit at its post-backward.
    What the walk does not place: a layer's own forward transients (below its recompute in
    backward), the gradients of a layer's intermediate tensors during its backward (measured on
    gloo: 54 KB beside a tiny llama layer's recompute under torchtune's LoRA wrapping), and the
    logits torchtune's output projection makes chunk by chunk in the forward (placed after its last
    call). A layer's recompute and its unsharded weight gradients are counted whole together
    (full fine-tuning: an upper bound, see benchmarks/fsdp2_moment_peak_cpu.py's ``expectation``).

    ``pool_peaks``: the same bytes split by the CUDA stream that allocated them (``FSDP2_POOLS``;
    torch 2.13 ``_fsdp_collectives.py``, read, not measured on a GPU), each pool's own peak over the
    step: ``all_gather`` (``foreach_all_gather``: the cast or host-to-device copied shards and the
    all-gather outputs, allocated under ``all_gather_copy_in_stream``), ``reduce_scatter``
    (``foreach_reduce``: the reduce-scatter output under ``reduce_scatter_stream``, and the kept
    gradient shards cast on it as ``post_reduce_stream``), ``all_reduce`` (HSDP: the cast gradient
    shards, ``post_reduce_stream`` being the all-reduce stream), ``default`` (the rest: unsharded
    parameters of ``foreach_all_gather_copy_out``, autograd's unsharded gradients, the
    reduce-scatter input allocated on the current stream, the activations). The cast gradient shard
    is allocated before the reduce-dtype output is freed: the reduce-scatter pool sees both at once,
    while the total keeps the order held on gloo (output freed, then the shard). Not placed: the flat
    ``param_dtype`` copy ``_get_param_all_gather_inputs``' foreach path makes of shards already in
    that dtype (at most one shard of the unit: 1/n of its all-gather output)."""
    s = _MomentSim()
    _fsdp2_walk(s, units, n, param_b=param_b, reduce_b=reduce_b, hsdp=hsdp, offload=offload, backend=backend,
                root_output_b=root_output_b, torch_version=torch_version, acts=acts)
    parts, where = s.at_peak
    return MomentPeak(total=s.peak, engine=parts["engine"], grads=parts["grads"], saved=parts["saved"],
                      loss_saved=parts["loss_saved"], act_transient=parts["act_transient"], moment=where,
                      moments=tuple(s.by_moment.items()), pool_peaks=tuple(s.pool_peak.items()))


def fsdp2_transient_bytes(units: list[Unit], n: int, *, param_b: Fraction | None, reduce_b: Fraction,
                          hsdp: bool = False, offload: bool = False, backend: str = "cuda",
                          root_output_b: Fraction = Fraction(0), torch_version: float = 2.13,
                          phases: dict | None = None) -> Fraction:
    """Peak of FSDP2's own transient buffers in one forward + backward on one rank.

    The schedule of torch 2.13's ``FSDPParamGroup`` (``_fsdp_param_group.py``,
    ``_fsdp_collectives.py``), unit by unit (``torch_version`` >= 2.15: two buffers die earlier,
    see below):

    * unshard: a flat all-gather input (this rank's shard, cast to ``param_dtype``: a copy only of
      the tensors stored in another dtype), the padded all-gather output, then the copy-out into
      the unsharded parameters. In forward the previous unit's all-gather output is freed only
      after this unit's copy-out (implicit prefetch; 2.13's ``wait_for_unshard`` binds it to a
      local until it returns; 2.15 releases it before the copy-out); in backward it is freed right
      after the copy-out. Under CPU offload (CUDA) the fp32 shard is first copied to the device.
      A unit without trainable parameters first in forward (the frozen input embedding of LoRA /
      QLoRA) has no backward of its own: the previous unit's pre-backward prefetches it, and that
      all-gather output is never copied out; it lives until backward ends.
    * reshard after forward (if the unit does), or keep the unsharded parameters until backward.
    * backward: the unit's unsharded gradients (``param_dtype``); at pre-backward the next unit
      is prefetched (all-gather input + output); post-backward reshards, frees the previous unit's
      reduce-scatter input (``reduce_scatter_max_input_buffers = 1``), allocates the padded
      reduce-scatter input (``reduce_dtype``), frees the unsharded gradients (the last one the
      autograd engine still holds is freed after the reduction), allocates the reduce-scatter
      output (a shard; gloo works on a copy of the input, NCCL does not) and casts it to the
      parameter dtype: the kept sharded gradient (resident, not transient). HSDP all-reduces the
      output and keeps it until backward ends (every unit's: ``FSDPParamGroup._all_reduce_state``,
      cleared by ``finalize_backward``). The last unsharded gradient held "by the autograd engine"
      is 2.13's ``foreach_reduce`` loop variable; 2.15 moved that loop into a function
      (``_default_reduce_scatter_input_fn``) and frees it with the others.

    ``root_output_b``: the root's output cast (``output_dtype``: the loss in bf16, 2 bytes).
    ``param_b=None``: no ``param_dtype`` (FSDP2 without a mixed-precision policy, pure bf16 / fp32):
    each parameter is gathered and unsharded in its own dtype (tensors of different dtypes go
    through one uint8 all-gather; checked on gloo: a bf16 frozen weight with an fp32 adapter
    gathers 2 + 4 bytes per element, benchmarks/torchtune_fsdp_output_cpu.py's notes).

    ``phases``: a dict to receive the forward's peak (``forward``), the share of the decoder-layer
    units whose forward had ended at it (``forward_layers_done``) and the backward's peak
    (``backward``; the return value is the larger of the two).
    """
    s = _Sim()
    return _fsdp2_walk(s, units, n, param_b=param_b, reduce_b=reduce_b, hsdp=hsdp, offload=offload,
                       backend=backend, root_output_b=root_output_b, torch_version=torch_version, phases=phases)


def _fsdp2_walk(s: _Sim, units: list[Unit], n: int, *, param_b: Fraction | None, reduce_b: Fraction,
                hsdp: bool = False, offload: bool = False, backend: str = "cuda",
                root_output_b: Fraction = Fraction(0), torch_version: float = 2.13,
                phases: dict | None = None, acts: ActivationSchedule | None = None) -> Fraction:
    """The walk of ``fsdp2_transient_bytes`` on ``s``; with ``acts`` (``s`` a ``_MomentSim``) the
    activations and kept gradients too (``fsdp2_moment_peak``)."""
    seq = _unit_sequence(units)
    if not seq:
        return Fraction(0)
    m = s if acts is not None else None  # the moment walk

    def mark(where: str) -> None:
        if m is not None:
            m.where = where

    def act(kind: str, x, pool: str = "default") -> None:
        if m is not None and x:
            m.put(kind, x, pool)

    # the stream pool of each allocation (``fsdp2_moment_peak``'s ``pool_peaks``; torch 2.13
    # ``_fsdp_collectives.py``): ``foreach_all_gather`` casts the shards (``_get_param_all_gather_inputs``,
    # the offloaded shard's host-to-device copy: ``FSDPParam.all_gather_inputs``) and allocates the
    # all-gather output inside ``device_handle.stream(all_gather_copy_in_stream)`` (in forward and
    # pre-backward: ``FSDPParamGroup.get_all_gather_streams``), while ``foreach_all_gather_copy_out``
    # allocates the unsharded parameters on the current (default) stream; ``foreach_reduce``
    # allocates the reduce-scatter input on the current stream, the reduce-scatter output inside
    # ``device_handle.stream(reduce_scatter_stream)`` and the cast to the parameter dtype (the kept
    # sharded gradient) on ``post_reduce_stream``: the reduce-scatter stream, HSDP's all-reduce stream
    rs_pool = "reduce_scatter"

    def grad_pool(u: Unit) -> str:
        """The pool of a unit's kept sharded gradient: the reduce-scatter output itself when the
        reduce dtype is the parameter's, else its cast on ``post_reduce_stream``."""
        orig = max((t.nbytes for t in u.tensors if t.trainable), default=reduce_b)
        return "all_reduce" if hsdp and orig != reduce_b else rs_pool

    def sizes(u: Unit):
        pb = (lambda t: t.nbytes) if param_b is None else (lambda t: param_b)  # noqa: E731
        unsh = sum(t.numel * pb(t) for t in u.tensors)
        pad = sum(t.padded(n) * pb(t) for t in u.tensors)
        # FSDPParam.all_gather_inputs: the sharded data itself where it already is param_dtype
        shard_in = sum(t.padded(n) for t in u.tensors if t.nbytes != pb(t)) * (param_b or 0) / n
        h2d = sum(t.padded(n) * t.nbytes for t in u.tensors) / n if (offload and backend == "cuda") else 0
        g = sum(t.numel * pb(t) for t in u.tensors if t.trainable)
        gpad = sum(t.padded(n) for t in u.tensors if t.trainable)
        rs_in = gpad * reduce_b
        rs_out = gpad * reduce_b / n
        orig_b = max((t.nbytes for t in u.tensors if t.trainable), default=reduce_b)
        if orig_b == reduce_b:
            rs_out = 0  # the reduce-scatter output is the kept sharded gradient (resident)
        # gloo's reduce_scatter works on a copy of the input (NCCL reduce-scatters in place)
        comm_copy = rs_in if backend == "cpu" else 0
        return unsh, pad, shard_in, h2d, g, rs_in, rs_out, comm_copy

    def gather(u: Unit) -> Fraction:
        unsh, pad, shard_in, h2d, *_ = sizes(u)
        s.add(h2d, "all_gather")
        s.add(shard_in, "all_gather")
        s.add(-h2d, "all_gather")
        s.add(pad, "all_gather")
        s.add(-shard_in, "all_gather")
        return pad

    early_release = torch_version >= 2.15
    eb = param_b or reduce_b
    # one entry per forward call: (unit, its wrapped module, call), a module called several
    # times (``Unit.calls``) being one FSDP parameter group
    calls = []
    for gid, u in enumerate(seq):
        calls += [(u, gid, k) for k in range(u.calls)]
    held_ag = Fraction(0)
    unsharded: dict[int, bool] = {}
    n_layers = sum(1 for u in seq if u.name.startswith("layer"))
    layers_done = at_peak = 0
    if acts is not None:
        assert len(acts.layer_saved_bytes) == n_layers, (len(acts.layer_saved_bytes), n_layers)
        # (the earlier micro-batches' gradient shards: allocated by their reduce-scatters)
        act("grads", acts.grads_at_start, grad_pool(next((u for u in seq if u.numel(True)), seq[-1])))
        act("saved", acts.start_bytes)
    # the module each decoder-layer entry of ``seq`` is (its index among the layers)
    layer_of = {gid: i for i, gid in enumerate(g for g, u in enumerate(seq) if u.name.startswith("layer"))}
    # forward
    for u, gid, _k in calls:
        if unsharded.get(gid):
            continue  # kept gathered from an earlier call (not resharded after forward)
        before = s.peak
        mark(f"forward, {_unit_label(u, layer_of.get(gid))}")
        unsh = sizes(u)[0]
        pad = gather(u)
        if early_release:
            s.add(-held_ag, "all_gather")  # the previous all-gather output
            s.add(unsh)  # copy-out
        else:
            s.add(unsh)  # copy-out
            s.add(-held_ag, "all_gather")  # the previous all-gather output
        held_ag = pad
        unsharded[gid] = True
        if s.peak > before:
            at_peak = layers_done
        if acts is not None and gid in layer_of:
            act("saved", acts.layer_saved_bytes[layer_of[gid]])  # the layer's forward
        if u.reshard_after_forward:
            s.add(-unsh)
            unsharded[gid] = False
        layers_done += u.name.startswith("layer")

    def loss_forward() -> None:
        mark("forward, the loss")
        act("loss_saved", acts.loss_saved_bytes)
        act("act_transient", acts.loss_forward_bytes)
        act("act_transient", -acts.loss_forward_bytes)

    if acts is not None and acts.loss_in_forward:
        loss_forward()
    s.add(root_output_b)
    s.add(-held_ag, "all_gather")
    if acts is not None and not acts.loss_in_forward:
        loss_forward()
    forward_peak = s.peak
    if acts is None:
        s.peak = s.cur  # the backward's own peak from here
    # torchtune's root holding trainable parameters (the final norm): its forward input needs no
    # gradient, so its post-backward runs in the final callback, just before the embedding unit's
    # (the first unit in forward, reduced last); the norm's gradient arrives once the output
    # unit's backward is done
    root = seq[0] if seq[0].name == "root" and seq[0].numel(True) else None
    root_grad = root.early * eb if root is not None else Fraction(0)
    # backward: reverse order (a tied embedding unit, first in forward, is reduced last)
    early = sum(u.early for u in seq if u is not root) * eb
    # the head: the unit of the last forward call unless it is a decoder layer (then the head is
    # part of a unit gathered earlier, and the loss's backward ends before the last layer's)
    head_gid = calls[-1][1] if not calls[-1][0].name.startswith("layer") else None
    loss_live = acts is not None
    head_bwd = None if acts is None else acts.head_backward_bytes
    head_now = Fraction(0)
    if acts is not None:
        mark("backward, the loss")
        act("act_transient", acts.loss_backward_bytes)

    def head_backward(k: int) -> None:
        """The head unit's pre-backward of its call ``k``: the cross-entropy's backward is done."""
        nonlocal head_now
        if head_bwd is not None:
            if k == len(head_bwd) - 1:
                act("act_transient", -acts.loss_backward_bytes)
                act("loss_saved", -acts.loss_saved_bytes)
            act("act_transient", head_bwd[k] - head_now)
            head_now = head_bwd[k]

    def loss_done() -> None:
        nonlocal loss_live
        if loss_live:
            if head_bwd is not None and head_gid is not None:
                act("act_transient", -head_now)
            else:
                act("act_transient", -acts.loss_backward_bytes)
                act("loss_saved", -acts.loss_saved_bytes)
            act("engine", acts.held_bytes)  # (tied: the head's gradient contribution, until the embedding's)
            loss_live = False

    s.add(early)
    if head_gid is None:
        loss_done()
    order = list(range(len(calls) - 1, -1, -1))
    prefetched: dict[int, Fraction] = {}
    held_rs = Fraction(0)
    held_ar = Fraction(0)  # HSDP: every unit's all-reduce buffer, until backward ends

    def post_backward(u: Unit, gid: int) -> None:
        """Reshard, then reduce-scatter the unit's gradients (the previous unit's reduce-scatter
        input freed first)."""
        nonlocal held_rs, held_ar
        unsh, _pad, _si, _h2d, g, rs_in, rs_out, cast = sizes(u)
        late = 0 if early_release else u.late * eb
        s.add(-unsh)  # post-backward reshard
        unsharded[gid] = False
        kept = (sum(t.padded(n) * t.nbytes for t in u.tensors if t.trainable) / n * acts.grad_scale
                if acts is not None else 0)
        if g:
            s.add(-held_rs)
            s.add(rs_in)
            s.add(-(g - late))
            s.add(rs_out, rs_pool)
            if m is not None and rs_out and kept and grad_pool(u) == rs_pool:
                # the cast gradient is allocated while the reduce-dtype output lives (``foreach_reduce``
                # rebinds ``reduce_output`` to ``_to_dtype_if_needed``'s result): both in the pool
                m.pool_overlap(rs_pool, kept)
            s.add(cast, rs_pool)  # (the backend's copy of the input)
            s.add(-cast, rs_pool)  # then the cast to the parameter dtype: the kept, resident sharded gradient
            if hsdp:
                # all-reduced across replicas in place; the group keeps it (``_all_reduce_state``,
                # torch 2.13: so that the next unit's reduce-scatter cannot reuse the block while
                # the all-reduce runs) until ``finalize_backward`` at the end of backward
                held_ar += rs_out
            else:
                s.add(-rs_out, rs_pool)
            held_rs = rs_in
            s.add(-late)
            if acts is not None and acts.grad_scale:
                # the kept sharded gradient (resident from here)
                act("grads", kept, grad_pool(u))

    for pos, i in enumerate(order):
        u, gid, k = calls[i]
        unsh, pad, shard_in, h2d, g, rs_in, rs_out, cast = sizes(u)
        if u is root:
            continue  # reduced before the first unit's post-backward (below)
        if not g and i == 0:
            continue  # no backward of its own: only prefetched (held until backward ends)
        if gid != head_gid:
            loss_done()
        else:
            head_backward(k)
        mark(f"backward, {_unit_label(u, layer_of.get(gid))}")
        if not unsharded[gid]:
            ag = prefetched.pop(gid) if gid in prefetched else gather(u)
            s.add(unsh)
            s.add(-ag, "all_gather")
            unsharded[gid] = True
        if u.calls > 1 and g and k > 0:
            # autograd sums the calls' weight gradients in its input buffer (out of place: the
            # earlier sum, this call's fresh gradient and their sum), the first one kept as is
            s.add(g)  # this call's gradient
            if k < u.calls - 1:
                s.add(g)  # the new sum
                s.add(-g)  # the earlier sum
                s.add(-g)  # this call's gradient
        if k > 0:
            # a later call of a unit called several times: its post-backward reshards with no
            # gradient to reduce yet (autograd is still summing the calls' weight gradients);
            # its pre-backward's prefetch targets the unit itself
            s.add(-unsh)
            unsharded[gid] = False
            continue
        if pos + 1 < len(order):
            nxt, gj, _kj = calls[order[pos + 1]]
            if not unsharded[gj] and gj not in prefetched:
                prefetched[gj] = gather(nxt)
        if u.calls > 1 and g:
            # the first call's gradient (after the prefetch) and the sum that becomes the
            # parameter's gradient, the earlier sum and the fresh one freed
            s.add(g)
            s.add(g)
            s.add(-g)
            s.add(-g)
        bwd = acts.layer_backward_bytes if acts is not None and gid in layer_of else 0
        act("act_transient", bwd)  # the layer's recompute / backward working tensors
        s.add((g if u.calls == 1 else 0) - u.early * eb)  # autograd's unsharded gradients
        if acts is not None and gid in layer_of:
            act("act_transient", -bwd)
            act("saved", -acts.layer_saved_bytes[layer_of[gid]])  # freed by the layer's backward
        if gid == head_gid:
            loss_done()
        if root is not None and gid == 1:
            post_backward(root, 0)
        post_backward(u, gid)
        if g and root_grad:
            s.add(root_grad)  # the final norm's gradient, after the output unit's backward
            root_grad = Fraction(0)
    s.add(-held_rs)
    s.add(-sum(prefetched.values(), Fraction(0)), "all_gather")
    s.add(-held_ar, rs_pool)
    s.add(-root_output_b)
    if acts is not None:
        act("engine", -acts.held_bytes)
        act("saved", -acts.start_bytes)
    if phases is not None:
        phases.update(forward=forward_peak, backward=s.peak,
                      forward_layers_done=Fraction(at_peak, n_layers) if n_layers else Fraction(1))
    return max(forward_peak, s.peak)


# ---------------------------------------------------------------------------------------------
# per engine
# ---------------------------------------------------------------------------------------------
def _padded_shard(units: list[Unit], n: int, trainable: bool | None, per_element: bool = False
                  ) -> tuple[Fraction, int]:
    """(bytes of this rank's padded shards of the selected tensors, number of such tensors);
    ``per_element``: elements instead of bytes."""
    total = Fraction(0)
    count = 0
    for u in units:
        for t in u.tensors:
            if trainable is None or t.trainable == trainable:
                total += u.count * t.padded(n) * (1 if per_element else t.nbytes) / n
                count += u.count
    return total, count


def layout_memory(model: ModelSpec, job: Job, layout: Layout, st, consts: MemoryConstants,
                  backend: str = "cuda") -> LayoutMemory:
    """What one rank holds under ``layout`` (``st``: the whole-model ``ModelStates``)."""
    eng = layout.engine
    mp = layout.tp * layout.pp
    prec = PRECISIONS[job.precision]
    mixed = job.precision.endswith("-mixed")
    c = dtype_bytes(prec["compute"])
    notes: list[str] = []
    n_train = st.params_trainable
    zero = Fraction(0)
    if eng in ("torch", "ddp"):
        frozen, trainable, master = Fraction(st.frozen_weights), Fraction(st.trainable_weights), Fraction(st.master_weights)
        grads, opt = Fraction(st.gradients), Fraction(st.optimizer_states)
        buf = transient = zero
        if eng == "ddp":
            if layout.ddp_bucket_view:
                # the gradients are views of the buckets; each backward's autograd gradient is
                # copied in and dropped one tensor at a time
                transient = _largest_trainable_tensor(model, job) * dtype_bytes(PRECISIONS[job.precision]["grad"]
                                                                                 if job.method == "full" else "fp32")
                notes.append("ddp: gradient_as_bucket_view: gradients live in the reducer's buckets")
            else:
                buf = grads
                notes.append("ddp: the reducer's buckets hold a second copy of every gradient "
                             "(gradient_as_bucket_view=False, HF Trainer's default)")
        return LayoutMemory(frozen / mp, trainable / mp, master / mp, grads / mp, opt / mp, buf / mp,
                            transient / mp, zero, zero, False, tuple(notes))

    n = layout.shard_degree
    if eng in ("fsdp1", "fsdp2"):
        wrap = layout.fsdp_wrap if eng == "fsdp2" else "accelerate"
        units = fsdp_units(model, job, eng, layout.reshard_after_forward, wrap=wrap)
        trainable, n_tt = _padded_shard(units, n, True)
        frozen, _ = _padded_shard(units, n, False)
        if job.method == "qlora":
            frozen += quant_state_bytes(model, job)  # quant states stay whole on every rank
        gb = Fraction(4) if job.method != "full" else dtype_bytes(prec["grad"])
        tb = Fraction(4) if job.method != "full" else dtype_bytes(prec["trainable"])
        grads = trainable * gb / tb
        if eng == "fsdp2":
            opt = (_opt_shard_bytes(job, st, trainable, _padded_shard(units, n, True, per_element=True)[0])
                   + _opt_per_tensor(job) * n_tt)
        else:
            if any(len({t.nbytes for t in u.tensors if t.trainable == tr}) > 1
                   for u in units for tr in (True, False)):
                notes.append("fsdp1: a unit would mix parameter dtypes (the family's fp32 router in a "
                             "narrower model, transformers >= 5.24), which FSDP1's flat parameters refuse "
                             "('Must flatten tensors with uniform dtype'); load the model in fp32 "
                             "(mixed precision) or use FSDP2 (fsdp_version 2)")
            if job.method == "full" and any(not t.trainable for u in units for t in u.tensors):
                # (measured: FullyShardedDataParallel(use_orig_params=False) raises it on the tiny
                # ernie4_5_moe; use_orig_params=True wraps it)
                notes.append("fsdp1: a decoder layer mixes trainable and frozen parameters (the router's frozen "
                             "e_score_correction_bias), which FSDP1's flat parameters refuse with "
                             "use_orig_params=False ('Must flatten tensors with uniform requires_grad'); set "
                             "fsdp_use_orig_params true or use FSDP2 (fsdp_version 2)")
            if job.uses_lora and lora_wraps_experts(model, job.lora):
                notes.append("fsdp1: LoRA on the fused MoE experts (PEFT ParamWrapper) did not train under "
                             "FSDP1 in ftplan's CPU runs (torch 2.13, PEFT 0.21; use_orig_params False and "
                             "True both failed in the forward); FSDP2 (fsdp_version 2) trains it")
            # full: one flat parameter per unit with trainable parameters. LoRA / QLoRA: HF Trainer
            # sets PEFT's fsdp_auto_wrap_policy, which makes every leaf module with a trainable
            # weight (each lora_A / lora_B) a unit of its own: one flat parameter (padded to a
            # multiple of the shard degree) and one optimizer ``step`` per adapter tensor; the
            # frozen rest of a layer is the layer's flat parameter
            peft = job.method != "full"
            flats = sum(u.count * (sum(1 for t in u.tensors if t.trainable) if peft else 1)
                        for u in units if u.numel(True))
            opt = (_opt_shard_bytes(job, st, _flat_shard(units, n, True, peft),
                                    _flat_shard(units, n, True, peft, per_element=True))
                   + _opt_per_tensor(job) * flats)
            trainable = _flat_shard(units, n, True, peft)
            frozen = _flat_shard(units, n, False) + (quant_state_bytes(model, job) if job.method == "qlora" else 0)
            grads = trainable * gb / tb
        pb = c if mixed else tb
        # the reduce-scatter's dtype: the mixed-precision dtype (accelerate) or fp32 (torchtitan)
        rb = Fraction(4) if layout.fsdp_reduce_dtype == "fp32" else c if mixed else gb
        if layout.ep > 1:
            # expert parallelism: a rank gathers and reduces only its own experts (the states
            # are split by memory.estimate_memory through expert_parallel.ep_rank_states)
            units = fsdp_units(model, job, eng, layout.reshard_after_forward, ep=layout.ep, wrap=wrap)
        if eng == "fsdp2":
            # without mixed precision (pure bf16 / fp32) FSDP2 has no param_dtype: every tensor is
            # gathered in its own dtype (a LoRA job's bf16 base beside its fp32 adapters)
            phases: dict = {}
            walk_kw = dict(param_b=pb if mixed else None, reduce_b=rb, hsdp=layout.hsdp,
                           torch_version=consts.fsdp2_schedule_torch, offload=layout.offload_params,
                           backend=backend, root_output_b=c if mixed else 0)
            transient = fsdp2_transient_bytes(units, n, phases=phases, **walk_kw)
            walk = (tuple(units), n, walk_kw, Fraction(0) if layout.offload_params else gb / tb)
        else:
            transient = (_fsdp1_peft_transient(units, n, pb, rb, layout, backend, gb) if job.method != "full"
                         else _fsdp1_transient(units, n, pb, rb, layout, backend, gb))
        host = zero
        if layout.offload_params:
            # bitsandbytes' quantization states are tensors of the Params4bit objects, not FSDP
            # parameters: CPU offload moves the flat shards only, the states stay on the device
            qstate = quant_state_bytes(model, job) if job.method == "qlora" else 0
            host = frozen - qstate + trainable + grads + opt
            if eng == "fsdp1":
                # FSDP1 pre-allocates a pinned CPU gradient buffer (``_cpu_grad``, zeros like the
                # local shard) for every flat parameter, frozen ones included
                # (torch/distributed/fsdp/_flat_param.py, init_flat_param_attributes): LoRA / QLoRA
                # hold a second copy of the frozen shards in host RAM
                host += frozen - qstate
            # FSDP1 keeps each reduced gradient shard on the device as ``_saved_grad_shard`` until
            # its post-backward final callback: ``_offload_grad`` copies it into ``_cpu_grad`` but
            # leaves it referenced (torch/distributed/fsdp/_runtime_utils.py, _reduce_grad ->
            # _accumulate_sharded_grad; _flat_param.py prepare_gradient_for_optim deletes it), so
            # by the end of backward the device holds every gradient shard, as without offload.
            # FSDP2 copies each reduced shard to the host and drops it.
            dev_grads = grads if eng == "fsdp1" else zero
            frozen, trainable, grads, opt = Fraction(qstate), zero, dev_grads, zero
            notes.append(f"{eng}: CPU offload keeps the parameter shards, their gradients and the optimizer "
                         "(step on the CPU) in host RAM"
                         + ("; FSDP1 also pins a gradient buffer for every flat parameter, frozen ones "
                            "included, and keeps the reduced gradient shards on the GPU until backward ends"
                            if eng == "fsdp1" else ""))
        if wrap == "torchtune":
            calls = max(u.calls for u in units)
            notes.append("fsdp2: torchtune's units (`fsdp_wrap`): " + (
                "decoder layers, the input embedding and the output projection, the root holding the final norm"
                if job.method == "full" else
                "decoder layers; the root holds the input embedding, final norm and output projection, gathered "
                "from the start of forward to the end of backward")
                + (f"; the output unit gathered {calls} times in forward and in backward (once per loss chunk)"
                   if calls > 1 else ""))
        held = sum(u.held * u.count for u in units) * pb if eng == "fsdp2" else zero
        fwd, done = None, Fraction(1)
        if wrap == "torchtune":
            # the forward's engine peak is placed where it happens (memory.estimate_memory): under
            # torchtune's LoRA wrapping at the first layer's copy-out, beside the root's gathered
            # embedding, norm and output and its all-gather output, before any layer saved anything
            fwd, done, transient = phases["forward"] / mp, phases["forward_layers_done"], phases["backward"]
        return LayoutMemory(frozen / mp, trainable / mp, zero, grads / mp, opt / mp, zero, transient / mp,
                            zero, host / mp, mixed or job.method == "qlora", tuple(notes), held / mp,
                            forward_transient=fwd, forward_layers_done=done,
                            fsdp2_walk=walk if eng == "fsdp2" else ())

    # DeepSpeed ZeRO
    stage = int(layout.strategy[-1])
    wb = c if mixed else (dtype_bytes(prec["trainable"]) if job.method == "full" else Fraction(4))
    per_elem_opt = _opt_bytes_per_elem(job, st)
    master_b = Fraction(4) if mixed else Fraction(0)
    train_w = n_train * wb
    frozen_w = Fraction(st.frozen_weights) if job.method != "full" else zero
    qstate = zero
    if job.method == "lora" and mixed:
        frozen_w = Fraction(st.params_total) * c  # the module is cast to bf16 (it already is)
    elif job.method == "qlora" and mixed:
        # sharded QLoRA (as under FSDP): the 4-bit weights packed in the quant storage dtype, the
        # other frozen weights in the compute dtype (no prepare_model_for_kbit_training upcast;
        # DeepSpeed's bf16 mode casts the module anyway); the quantization states are whole
        units = fsdp_units(model, job, "deepspeed", ep=layout.ep)
        frozen_w = sum((t.numel * t.nbytes * u.count for u in units for t in u.tensors if not t.trainable),
                       Fraction(0))
        qstate = Fraction(quant_state_bytes(model, job))
    part = Fraction(_aligned(n_train, n), n)  # elements of this rank's flat partition
    master = part * master_b
    # DeepSpeed's optimizer steps one flat fp32 partition per group: HF Trainer hands it its own
    # torch optimizer (ftplan's ds_config.json has no "optimizer" section), which keeps one fp32
    # ``step`` for that flat partition (AdamW / Adafactor), not one per parameter tensor
    opt = part * per_elem_opt + _opt_per_tensor(job)
    bucket = _ds_reduce_bucket(model, consts, layout)
    largest = _largest_trainable_tensor(model, job, layout.ep) * c
    grads_part = part * c
    step_tmp = part * 4 if mixed else zero  # fp32 gradient partition built for the step
    host = zero
    buf = zero
    if stage in (1, 2):
        trainable = train_w
        frozen = frozen_w
        if job.method == "full":  # (ernie4_5_moe's frozen correction biases: whole, in the module's dtype)
            frozen = wb * sum(g.count * g.moe.num_experts for g in model.groups
                              if g.moe is not None and g.moe.frozen_bias_param)
        # the worst rank's gradient partition buffer and backward transient (see zero12_rank_bytes);
        # the two ipg buckets (overlap_comm) are in the compute dtype (DeepSpeed's grad_accum_dtype
        # defaults to the model dtype: ZeRO-1 reduces in bf16 too)
        order = tuple(ds_flat_order(model, job, layout.ep))
        ranks = [_zero12_rank(order, n, bucket, stage, r) for r in range(n)]  # zero12_rank_bytes
        grads = max(g for g, _t in ranks) * c
        transient = max(t for _g, t in ranks) * c + 2 * bucket * c
    else:
        persist_train, persist_frozen = _ds_persistent_elems(model, job, consts)
        trainable = part * wb + persist_train * wb
        frozen = (frozen_w / n if frozen_w else zero) + persist_frozen * c
        grads = zero
        buf = grads_part + bucket * c  # persistent gradient partition buffer and ipg bucket
        # modules are gathered as they run and stay gathered while DeepSpeed's trace says they are
        # reused within stage3_max_reuse_distance, up to stage3_max_live_parameters elements (both
        # 1e9 in ftplan's ds_config.json); backward adds the largest gradient and its
        # reduce-scatter copy (an upper bound by at most the largest gradient)
        gatherable = _ds_gatherable_elems(model, job, consts, layout.ep)
        live_cap, _reuse, prefetch = _ds_zero3_limits(model, consts, layout)
        # a model that is gathered whole (under stage3_max_live_parameters) keeps what the old
        # bound counts; above it, ``_ds_capped_gather_elems`` (deepspeed 0.19
        # partitioned_param_coordinator.py): the cap stops the prefetch, not a module's own fetch
        capped = _ds_capped_gather_elems(model, job, consts, layout)
        if job.method == "full":
            gathered = gatherable if gatherable <= live_cap else capped
            transient = gathered * c + 2 * largest
        else:
            # LoRA / QLoRA: the peak is in forward, not backward (read in deepspeed 0.19
            # runtime/zero/partitioned_param_coordinator.py and partition_parameters.py, traced on
            # the gloo ranks). A module's parameters are released after its forward unless the
            # trace uses them again within stage3_max_reuse_distance (``__params_to_release``);
            # a frozen module whose output needs no gradient has no backward hook, so it is not in
            # the trace's backward and is released at once: the input embedding and the first
            # layer's projections reading the grad-free layer input (``_ds_forward_only_elems``).
            # Everything else stays gathered until its backward. Prefetch (``fetch_sub_module``)
            # all-gathers the next parameters of the trace in groups of up to
            # stage3_prefetch_bucket_size elements plus the parameter that crosses it; a group of
            # several is gathered into one flat buffer and ``AllGatherCoalescedHandle.wait`` splits
            # it into a ``torch.cat`` copy per parameter before the buffer is freed, so one group
            # is held twice for a moment. LoRA's backward adds only the adapters' small gradients
            # and the ipg bucket's flattened copy (stage3.py ``__avg_scatter_grads`` ->
            # ``reduce_scatter_coalesced``) while modules are already being released: below the
            # forward's peak whenever a group exceeds them. The largest possible group is counted:
            # which group is split while the rest is gathered is the trace's business, so this is
            # an upper bound by up to one group (BOUNDS["ds_gather_group"] in the gloo tests)
            live = gatherable - _ds_forward_only_elems(model, job, consts)
            group = (prefetch + _ds_largest_gathered(model, job, consts, layout.ep) if gatherable else 0)
            if live > live_cap:
                # above the cap a module's own fetch (a fused-experts module, a leaf MoE block) is
                # one coalesced group too
                group = max(group, _ds_largest_fetch(model, job, consts, layout.ep))
            bwd = 2 * largest + min(bucket, n_train) * c
            transient = (live if live <= live_cap else capped) * c + max(group * c, bwd)
    if layout.offload_optimizer:
        # fp32 master, AdamW states and fp32 gradient partitions (DeepSpeed keeps an accumulation
        # copy of them too: ZeRO-3 in the compute dtype, ZeRO-1/2 in fp32) live in host RAM
        host += master + opt + part * 4 + (grads_part if stage == 3 else part * 4)
        master = opt = zero
        step_tmp = zero
        if stage == 3:
            buf -= grads_part
        else:
            grads = zero
        notes.append("deepspeed: optimizer offload keeps fp32 master weights, AdamW states and fp32 gradient "
                     "partitions in host RAM (the step runs on the CPU)")
    if layout.offload_params and stage == 3:
        host += trainable + frozen
        trainable = frozen = zero
    frozen += qstate  # bitsandbytes' quantization states: tensors of the Params4bit, not partitioned
    return LayoutMemory(frozen / mp, trainable / mp, master / mp, grads / mp, opt / mp, buf / mp, transient / mp,
                        step_tmp / mp, host / mp, mixed or (job.method == "qlora" and stage == 3), tuple(notes))


def ds_flat_order(model: ModelSpec, job: Job, ep: int = 1) -> list[int]:
    """Elements of each trainable parameter in the order DeepSpeed ZeRO-1/2 flattens them (the
    module's registration order, as HF's ``named_parameters``: the input embedding, every decoder
    layer (attention, MLP/MoE, layer norms), the final norm, the lm_head if untied)."""
    units = fsdp_units(model, job, "fsdp2", ep=ep)
    layers = [u for u in units if u.name.startswith("layer")]
    tail = next(u for u in units if u.name == "tail")
    if model.tie_word_embeddings:
        *norms, emb = tail.tensors
        head = [emb, *[t for u in layers for _ in range(u.count) for t in u.tensors], *norms]
    else:
        emb = next(u for u in units if u.name == "embed").tensors[0]
        head = [emb, *[t for u in layers for _ in range(u.count) for t in u.tensors], *tail.tensors]
    return [t.numel for t in head if t.trainable]


def zero12_rank_bytes(model: ModelSpec, job: Job, n: int, bucket: int, stage: int, rank: int,
                      ep: int = 1) -> tuple[int, int]:
    """(gradient partition elements, backward transient elements without the ipg buckets) of rank
    ``rank`` under DeepSpeed ZeRO-1/2 (bf16, ``overlap_comm`` and ``contiguous_gradients`` as HF
    Trainer's ``auto`` config and ftplan's export set them), read in deepspeed 0.19
    ``stage_1_and_2.py``:

    * the flat group (``ds_flat_order``, padded to a multiple of 2 x ranks) is cut into equal
      partitions; ``copy_grads_in_partition`` sizes ``grads_in_partition`` as the *whole* elements
      of every parameter that touches the rank's partition: a parameter cut by a partition
      boundary is counted in full on both ranks;
    * gradients arrive in backward order (the reverse of the flat order); a gradient of at most
      ``reduce_bucket_size`` elements is copied into the ipg bucket (the autograd tensor is freed);
      a larger one bypasses the bucket (``extra_large_param_to_reduce``) and stays alive until the
      next gradient arrives and flushes it. After its reduction ZeRO-2 frees it (copied into the
      partition, or cleared when another rank owns it); ZeRO-1 ("partition only optimizer
      state") frees only the gradients of its own partition: every other rank's large gradient
      stays alive until backward ends (the epilogue clears them);
    * the transient peak is at the arrival of a gradient: the pending large one + the arriving one
      (+ ZeRO-1's kept gradients);
    * a reduction whose elements reach two ranks' partitions is cut into one slice per partition;
      ``average_tensor`` puts every destination's slices under one all-reduce key
      (``use_multi_rank_bucket_allreduce``, on by default), ``allreduce_and_scatter`` groups them
      into small buckets closed once they exceed ``reduce_bucket_size`` elements and
      ``allreduce_bucket`` flattens a small bucket of two or more slices
      (``_flatten_dense_tensors``: a ``torch.cat``; a single slice is reduced in place): a bucket
      of small gradients across a boundary is copied whole, a large gradient only when its first
      slice is within the bucket size. The copy is made at the flush, while the arriving gradient
      is alive (or at the epilogue's last flush). Exact on gpt_oss LoRA ZeRO-2 (2 ranks: +8,192 B)
      and on 4 ranks on llama LoRA ZeRO-2, qwen2 ZeRO-1/2, mixtral ZeRO-2; 8,060 B over on llama
      ZeRO-2 (4 ranks), where the gradients arrive in the registration order reversed only
      approximately (a layer's input-norm gradient arrives after its attention's, and it, not the
      embedding's, triggers the flush of the copied bucket)."""
    return _zero12_rank(tuple(ds_flat_order(model, job, ep)), n, bucket, stage, rank)


@functools.lru_cache(maxsize=1024)
def _zero12_rank(order: tuple[int, ...], n: int, bucket: int, stage: int, rank: int) -> tuple[int, int]:
    """:func:`zero12_rank_bytes` of the flat order ``order`` (a pure function of its arguments:
    memoized, a search asks it for every rank of every ZeRO-1/2 layout)."""
    total = _aligned(sum(order), n)
    part = total // n
    lo, hi = rank * part, (rank + 1) * part
    touch = []
    offs = []
    pos = 0
    for k in order:
        touch.append(pos < hi and pos + k > lo)
        offs.append(pos)
        pos += k
    grads = sum(k for k, t in zip(order, touch) if t)

    def flat_copy(a: int, b: int) -> int:
        """Elements ``allreduce_and_scatter`` flattens when reducing flat elements [a, b): their
        per-partition slices, in order, go into small buckets closed once they exceed the bucket
        size; a small bucket of two or more slices is flattened (the largest one counts)."""
        cuts = [a] + [q * part for q in range(a // part + 1, (b - 1) // part + 1)] + [b]
        out = acc = count = 0
        for x, y in zip(cuts, cuts[1:]):
            acc, count = acc + y - x, count + 1
            if acc > bucket:
                out = max(out, acc if count > 1 else 0)
                acc = count = 0
        return max(out, acc if count > 1 else 0)

    kept = pending = 0
    pending_mine = True
    pending_off = 0
    content = c_lo = c_hi = 0  # the small gradients in the bucket and their flat range [c_lo, c_hi)
    peak = 0
    for k, mine, off in zip(reversed(order), reversed(touch), reversed(offs)):
        copy = 0
        if pending:  # the large gradient is reduced when the next one arrives
            copy = flat_copy(pending_off, pending_off + pending)
        elif content and content + k > bucket:
            copy = flat_copy(c_lo, c_hi)
            content = 0
        peak = max(peak, kept + pending + k + copy)
        if pending and stage == 1 and not pending_mine:
            kept += pending
        pending, pending_mine, pending_off = (k, mine, off) if k > bucket else (0, True, 0)
        if k <= bucket:
            c_hi = c_hi if content else off + k
            c_lo = off
            content += k
    # the epilogue reduces what is left
    if pending:
        peak = max(peak, kept + pending + flat_copy(pending_off, pending_off + pending))
    elif content:
        peak = max(peak, kept + flat_copy(c_lo, c_hi))
    if pending and stage == 1 and not pending_mine:
        kept += pending
    return grads, max(peak, kept)


def _aligned(numel: int, n: int) -> int:
    """DeepSpeed pads the flat group to a multiple of ``nccl_start_alignment_factor`` (2) x ranks."""
    a = 2 * n
    return -(-numel // a) * a


def _opt_bytes_per_elem(job: Job, st) -> Fraction:
    """Optimizer-state bytes per trainable element, without the per-tensor ``step`` scalars."""
    per_tensor = _opt_per_tensor(job) * st.n_trainable_tensors
    return Fraction(st.optimizer_states - per_tensor, max(1, st.params_trainable))


def _opt_shard_bytes(job: Job, st, shard_bytes: Fraction, shard_elems: Fraction) -> Fraction:
    """Optimizer states of a rank's trainable shards (``shard_bytes`` of parameters in
    ``shard_elems`` elements), without the ``step`` scalars. AdamW's and SGD's states are made
    like the parameters (``zeros_like``): a fixed multiple of the parameters' bytes, whatever each
    tensor's dtype (a family's fp32 router in a bf16 model); the other optimizers' states (8-bit,
    Adafactor) do not follow the parameter dtype: bytes per element."""
    if job.optimizer in ("adamw", "sgd") and st.trainable_weights:
        per_tensor = _opt_per_tensor(job) * st.n_trainable_tensors
        return shard_bytes * Fraction(st.optimizer_states - per_tensor, st.trainable_weights)
    return shard_elems * _opt_bytes_per_elem(job, st)


def _opt_per_tensor(job: Job) -> int:
    """AdamW keeps one fp32 ``step`` per parameter tensor (Adafactor an RMS scalar)."""
    return 4 if job.optimizer in ("adamw", "adafactor") else 0


def _flat_shard(units: list[Unit], n: int, trainable: bool, per_tensor: bool = False,
                per_element: bool = False) -> Fraction:
    """FSDP1: each unit's flat parameter (the selected tensors, concatenated) padded to a multiple
    of ``n`` and split; bytes (``per_element``: elements) of one shard. ``per_tensor``: every
    selected tensor is a flat parameter of its own (PEFT's wrap policy: each adapter module is a
    unit)."""
    total = Fraction(0)
    for u in units:
        sel = [t for t in u.tensors if t.trainable == trainable]
        if not sel:
            continue
        if per_tensor:
            total += u.count * sum(Fraction(-(-t.numel // n)) * (1 if per_element else t.nbytes) for t in sel)
            continue
        numel = sum(t.numel for t in sel)
        total += u.count * Fraction(-(-numel // n)) * (1 if per_element else sel[0].nbytes)
    return total


def _fsdp1_transient(units: list[Unit], n: int, pb: Fraction, rb: Fraction, layout: Layout,
                     backend: str, grad_b: Fraction) -> Fraction:
    """FSDP1 (``FullyShardedDataParallel``, ``use_orig_params=False``, BACKWARD_PRE,
    ``limit_all_gathers``): per unit one flat parameter padded to a multiple of the shard degree.
    Unshard: the low-precision copy of this rank's shard (``_mp_shard``), the padded flat parameter
    in ``param_dtype`` (``_full_param_padded``), then the shard copy is freed; the root unit (the
    embedding, final norm and lm_head) stays gathered from its forward to the end of backward;
    FULL_SHARD frees a layer after its forward (SHARD_GRAD_OP keeps it). Backward of a layer: the
    previous layer is prefetched, the flat gradient (``param_dtype``) is made, the layer is
    resharded, the reduce-scatter output (a shard, ``reduce_dtype``; gloo works on a copy of the
    input) is cast to the fp32 sharded gradient (resident), then the flat gradient is freed."""
    s = _Sim()
    seq = _unit_sequence(units)
    if not seq:
        return Fraction(0)
    root = seq[-1]
    layers = seq[:-1]

    def flat(u: Unit, trainable: bool | None = None) -> int:
        numel = sum(t.numel for t in u.tensors if trainable is None or t.trainable == trainable)
        return -(-numel // n) * n if numel else 0

    def gather(u: Unit) -> Fraction:
        full = flat(u) * pb
        s.add(full / n)
        s.add(full)
        s.add(-full / n)
        return full

    root_full = gather(root)
    full = {}
    for i, u in enumerate(layers):
        full[i] = gather(u)
        if layout.reshard_after_forward:
            s.add(-full[i])
            full[i] = Fraction(0)

    def reduce(u: Unit, keep: Fraction) -> None:
        g = flat(u, True)
        if g:
            _fsdp1_reduce(s, g, keep, n, pb, rb, backend, grad_b)

    for i in range(len(layers) - 1, -1, -1):
        if not full[i]:
            full[i] = gather(layers[i])
        if i - 1 >= 0 and not full[i - 1]:
            full[i - 1] = gather(layers[i - 1])
        reduce(layers[i], full[i])
        full[i] = Fraction(0)
    reduce(root, root_full)
    return s.peak


def _fsdp1_reduce(s: _Sim, g: int, keep: Fraction, n: int, pb: Fraction, rb: Fraction, backend: str,
                  grad_b: Fraction) -> None:
    """One FSDP1 unit's post-backward over ``g`` (padded) gradient elements (torch 2.13
    ``_post_backward_hook`` / ``_reduce_grad``): the flat gradient (``param_dtype``; autograd's
    engine holds it until the hook returns), the unit resharded (``keep`` bytes freed), its cast to
    ``reduce_dtype`` when that differs (``flat_param.grad.to(reduce_dtype)``), the reduce-scatter
    output (a shard, ``reduce_dtype``; gloo works on a copy of the input): the kept sharded
    gradient itself when it has the gradient's dtype ``grad_b``, else cast into it (resident) and
    freed; then the flat gradients are freed."""
    s.add(g * pb)
    s.add(-keep)
    cast = g * rb if rb != pb else 0
    s.add(cast)
    out = Fraction(g, n) * rb if rb != grad_b else 0
    s.add(out)
    copy = g * rb if backend == "cpu" else 0
    s.add(copy)
    s.add(-copy)
    s.add(-out)
    s.add(-cast)
    s.add(-g * pb)


def _fsdp1_peft_transient(units: list[Unit], n: int, pb: Fraction, rb: Fraction, layout: Layout,
                          backend: str, grad_b: Fraction) -> Fraction:
    """FSDP1 LoRA / QLoRA as HF Trainer wraps a PEFT model (PEFT's ``fsdp_auto_wrap_policy``:
    every leaf module with a trainable weight -- each ``lora_A`` / ``lora_B`` -- is a unit of its
    own, nested in its decoder-layer unit, whose flat parameter holds the layer's frozen weights;
    the root holds the embedding, final norm and lm_head), ``use_orig_params=False``,
    BACKWARD_PRE, read in torch 2.13's ``fsdp/_runtime_utils.py`` / ``_exec_order_utils.py``:

    * forward: the root is gathered and stays gathered to the end of backward; each layer's frozen
      flat parameter is gathered at its pre-forward (without mixed precision's shard copy when it is
      already stored in ``param_dtype``), each adapter unit inside it (its fp32 shard first cast to
      ``param_dtype``, ``_mp_shard``) around the adapter's own forward; FULL_SHARD frees both after
      their forward (SHARD_GRAD_OP keeps them to their backward).
    * backward: at each unit's pre-backward FSDP gathers it if needed and prefetches the unit that
      precedes it in *post-forward* order (``get_handle_to_backward_prefetch``): a layer prefetches
      its last adapter, each adapter the one before it, and a layer's first adapter the previous
      layer's frozen flat parameter -- so two layers' frozen weights are gathered at once while the
      first adapter's gradient is reduced. An adapter's post-backward frees its gathered parameter
      and reduce-scatters its flat gradient (``param_dtype``; gloo on a copy) into the fp32 sharded
      gradient (resident). A frozen layer is freed by its reshard-only hook when the gradients of
      its inputs are done, after its first adapter's reduction."""
    s = _Sim()
    seq = _unit_sequence(units)
    if not seq:
        return Fraction(0)
    root, layers = seq[-1], seq[:-1]

    def flat(numel: int) -> int:
        return -(-numel // n) * n if numel else 0

    # post-forward order: a layer's adapters, then the layer; the root's own adapters, then the root
    po: list[tuple[str, int, Fraction, int]] = []  # (kind, numel, stored bytes, layer position)
    for pos, u in enumerate(layers + [root]):
        po += [("a", t.numel, t.nbytes, pos) for t in u.tensors if t.trainable]
        frozen = [t for t in u.tensors if not t.trainable]
        po.append(("R" if pos == len(layers) else "L", sum(t.numel for t in frozen),
                   frozen[0].nbytes if frozen else pb, pos))

    def gather(i: int) -> Fraction:
        _kind, numel, nb, _pos = po[i]
        full = flat(numel) * pb
        shard = full / n if nb != pb else 0  # mixed precision: the shard cast to param_dtype first
        s.add(shard)
        s.add(full)
        s.add(-shard)
        return full

    held: dict[int, Fraction] = {}
    # forward: the root first (the outermost unit), then layer by layer, then the root's adapters
    held[len(po) - 1] = gather(len(po) - 1)
    for pos in range(len(layers) + 1):
        idx = [i for i, e in enumerate(po) if e[3] == pos]
        adapters = [i for i in idx if po[i][0] == "a"]
        if pos < len(layers):
            held[idx[-1]] = gather(idx[-1])  # the layer's frozen weights, at its pre-forward
        for i in adapters:
            held[i] = gather(i)
            if layout.reshard_after_forward:
                s.add(-held.pop(i))
        if pos < len(layers) and layout.reshard_after_forward:
            s.add(-held.pop(idx[-1]))
    # backward: reverse post-forward order
    for i in range(len(po) - 1, -1, -1):
        kind, numel, _nb, pos = po[i]
        if i not in held:
            held[i] = gather(i)
        if i >= 1 and i - 1 not in held:
            held[i - 1] = gather(i - 1)  # BACKWARD_PRE prefetch
        if kind == "a":
            _fsdp1_reduce(s, flat(numel), held.pop(i), n, pb, rb, backend, grad_b)
        first_adapter = kind == "a" and (i == 0 or po[i - 1][3] != pos or po[i - 1][0] != "a")
        no_adapters = kind == "L" and (i == 0 or po[i - 1][3] != pos)
        if (first_adapter or no_adapters) and kind != "R":
            # the layer's inputs' gradients are done: its reshard-only hook frees the frozen weights
            layer_i = next(j for j in range(i, len(po)) if po[j][3] == pos and po[j][0] in "LR")
            if po[layer_i][0] == "L" and layer_i in held:
                s.add(-held.pop(layer_i))
    for v in held.values():
        s.add(-v)
    return s.peak


def _largest_trainable_tensor(model: ModelSpec, job: Job, ep: int = 1) -> int:
    """Elements of the largest trainable tensor (its gradient is the largest single one)."""
    return max((t.numel for u in fsdp_units(model, job, ep=ep) for t in u.tensors if t.trainable), default=0)


def _ds_reduce_bucket(model: ModelSpec, consts: MemoryConstants, layout: Layout | None = None) -> int:
    """``reduce_bucket_size`` elements: the layout's explicit value (``Layout.ds_reduce_bucket_size``,
    e.g. DeepSpeed's own default 5e8 when no JSON config is given), else HF Trainer's ``auto``
    (hidden_size^2), what ftplan's ds_config.json writes. DeepSpeed allocates its ipg bucket(s)
    at this size whatever the model (ZeRO-3: one per communication dtype, at optimizer init)."""
    explicit = getattr(layout, "ds_reduce_bucket_size", 0) if layout is not None else 0
    if explicit:
        return int(explicit)
    return int(consts.deepspeed_auto_reduce_bucket_h2 * model.hidden_size ** 2)


def _ds_gatherable_elems(model: ModelSpec, job: Job, consts: MemoryConstants, ep: int = 1) -> int:
    """Elements ZeRO-3 gathers (every parameter above the persistence threshold; a rank's own
    experts under expert parallelism)."""
    limit = consts.deepspeed_auto_persistence_h * model.hidden_size
    return sum(t.numel * u.count for u in fsdp_units(model, job, "fsdp2", ep=ep) for t in u.tensors if t.numel > limit)


def _ds_largest_gathered(model: ModelSpec, job: Job, consts: MemoryConstants, ep: int = 1) -> int:
    """Elements of the largest parameter ZeRO-3 gathers (above the persistence threshold)."""
    limit = consts.deepspeed_auto_persistence_h * model.hidden_size
    return max((t.numel for u in fsdp_units(model, job, "fsdp2", ep=ep) for t in u.tensors if t.numel > limit),
               default=0)


def _ds_prefetch_bucket(model: ModelSpec, consts: MemoryConstants, layout: Layout | None = None) -> int:
    """``stage3_prefetch_bucket_size`` elements: the layout's explicit value, else HF Trainer's
    ``auto`` (0.9 x hidden_size^2), what ftplan's ds_config.json writes."""
    explicit = getattr(layout, "ds_prefetch_bucket_size", 0) if layout is not None else 0
    return int(explicit) if explicit else int(consts.deepspeed_auto_prefetch_bucket_h2 * model.hidden_size ** 2)


def _ds_zero3_limits(model: ModelSpec, consts: MemoryConstants, layout: Layout | None = None) -> tuple[int, int, int]:
    """(``stage3_max_live_parameters``, ``stage3_max_reuse_distance``, ``stage3_prefetch_bucket_size``)
    in elements: the layout's explicit values (``Layout.ds_max_live_parameters`` ...), else what
    ftplan's ds_config.json writes (1e9, 1e9, HF Trainer's ``auto``)."""
    live = getattr(layout, "ds_max_live_parameters", 0) if layout is not None else 0
    reuse = getattr(layout, "ds_max_reuse_distance", 0) if layout is not None else 0
    return (int(live or consts.deepspeed_max_live_parameters), int(reuse or consts.deepspeed_max_live_parameters),
            _ds_prefetch_bucket(model, consts, layout))


#: transformers MoE blocks DeepSpeed 0.19 makes ZeRO-3 leaf modules by default
#: (runtime/zero/leaf_module_config.py ``DEFAULT_LEAF_MODULE_CLASSES``: MixtralSparseMoeBlock,
#: Qwen2MoeSparseMoeBlock, Qwen3MoeSparseMoeBlock): no hooks inside, the block's parameters (router,
#: every expert, shared experts, adapters) are fetched together by the block's own hook
_DS_LEAF_MOE_FAMILIES = frozenset({"mixtral", "qwen3_moe", "qwen2_moe"})

#: families whose fused experts run through transformers 5's ``@use_experts_implementation``
#: without ``is_transposed`` (``grouped_mm`` passes ``weight.transpose(-2, -1)``, ``eager``
#: ``F.linear(x, gate_up_proj[e])``): autograd saves a *view* of the gathered weight, and
#: DeepSpeed's release (partition_parameters.py ``free_param``: ``param.data = torch.empty(0)``)
#: drops only the parameter's reference: the gathered storage lives until the layer's backward.
#: Not gpt_oss (``is_transposed``: the parameter itself is saved, which the release does free) nor
#: llama4_text (``torch.bmm`` on the parameter itself)
_DS_EXPERT_VIEWS_EXCLUDED = frozenset({"gpt_oss", "llama4_text"})


def _ds_expert_tensors(model: ModelSpec, g: LayerGroup, job: Job, ep: int = 1) -> tuple[list[int], list[int]]:
    """(fused expert weights and biases, the PEFT ``ParamWrapper`` adapters of the two expert weights)
    of one MoE layer of group ``g``, elements per rank (``_layer_tensors``' shapes)."""
    m = g.moe
    h = model.hidden_size
    e, i, r = m.num_experts // max(1, ep), m.expert_intermediate_size, job.lora.r
    weights = [e * 2 * i * h, e * h * i] + ([e * 2 * i, e * h] if m.bias else [])
    adapters = ([e * 2 * r * h, 2 * i * e * 2 * r, e * r * i, h * e * r]
                if job.uses_lora and lora_wraps_experts(model, job.lora) else [])
    return weights, adapters


def _ds_largest_fetch(model: ModelSpec, job: Job, consts: MemoryConstants, ep: int = 1) -> int:
    """Elements of the largest set of parameters one ZeRO-3 module fetch gathers at once
    (``fetch_sub_module``: the module's own parameters, above the persistence threshold): the largest
    gathered parameter, a fused-experts module (both expert weights), or a leaf MoE block whole
    (``_DS_LEAF_MOE_FAMILIES``: router, experts, shared experts and adapters)."""
    limit = consts.deepspeed_auto_persistence_h * model.hidden_size
    out = _ds_largest_gathered(model, job, consts, ep)
    for g in model.groups:
        if g.moe is None:
            continue
        weights, adapters = _ds_expert_tensors(model, g, job, ep)
        if model.family in _DS_LEAF_MOE_FAMILIES:
            block = sum(t for t in weights + adapters if t > limit) + _moe_block_other_elems(model, g, job, limit)
            out = max(out, block)
        else:
            out = max(out, sum(t for t in weights if t > limit))
    return out


def _moe_block_other_elems(model: ModelSpec, g: LayerGroup, job: Job, limit: float) -> int:
    """Gathered elements of a MoE block besides its fused experts: the router, the shared experts'
    linears and the adapters PEFT puts on them (each above the persistence threshold)."""
    m = g.moe
    h, r = model.hidden_size, job.lora.r
    targets = lora_targets(model, job.lora) if job.uses_lora else frozenset()
    out = [m.num_experts * h]
    if job.uses_lora and lora_wraps_experts(model, job.lora):
        out += [r * h, m.num_experts * r]
    if m.shared is not None:
        for lin in mlp_linears(m.shared, h, 1, "mlp"):
            n = lin.in_features * lin.out_features
            if job.method == "qlora" and lin.module not in set(job.quant.skip_modules):
                n //= int(2 * _quant_storage_bytes(job))
            out.append(n)
            if lin.module in targets:
                out += [r * lin.in_features, lin.out_features * r]
    return sum(t for t in out if t > limit)


def _ds_view_held_elems(model: ModelSpec, job: Job, consts: MemoryConstants, ep: int = 1) -> int:
    """Gathered expert elements that stay alive after ZeRO-3 releases them, until each layer's
    backward, summed over every MoE layer (``_DS_EXPERT_VIEWS_EXCLUDED``): the fused expert weights
    (full fine-tuning, and LoRA/QLoRA when PEFT does not wrap the experts: the frozen weights are
    read through the view too), or PEFT's ``ParamWrapper`` adapters of the experts (LoRA with
    all-linear: ``_LoraFactorsProxy`` hands reshaped views of lora_A/lora_B to ``torch.baddbmm``,
    which saves them; the frozen weight is only added to, not saved). Measured on the gloo ranks with
    stage3_max_live_parameters under the model size (tiny mixtral: two copies of the experts' weights
    or adapters beside the layer being gathered again in backward). A checkpointed layer saves none
    of them (non-reentrant checkpointing keeps only its input; reentrant runs the forward without
    autograd; selective checkpointing keeps op outputs): only the layers that are not checkpointed
    count (all without checkpointing, every-k's others)."""
    if model.family in _DS_EXPERT_VIEWS_EXCLUDED:
        return 0
    ckpt = checkpointed_counts(model, job)
    limit = consts.deepspeed_auto_persistence_h * model.hidden_size
    out = 0
    for g, k in zip(model.groups, ckpt):
        if g.moe is None:
            continue
        weights, adapters = _ds_expert_tensors(model, g, job, ep)
        held = adapters if adapters else weights[:2]
        out += (g.count - k) * sum(t for t in held if t > limit)
    return out


def _ds_capped_gather_elems(model: ModelSpec, job: Job, consts: MemoryConstants, layout: Layout) -> int:
    """Gathered elements per rank at ZeRO-3's peak when the gatherable parameters exceed
    ``stage3_max_live_parameters`` (deepspeed 0.19 ``PartitionedParameterCoordinator``, read and
    traced on the gloo ranks with the limits lowered under the tiny models' size):

    * ``fetch_sub_module`` all-gathers the running module's parameters whatever the limit; only its
      prefetch is limited: ``min(max_live - n_available, prefetch_bucket)`` elements, the last
      parameter crossing it, so the prefetch stops below max_live + the largest parameter;
    * a module is fetched on demand only when the prefetch has not reached it (nothing gathered
      ahead then): at most what the trace keeps for reuse (within ``stage3_max_reuse_distance``,
      ``__params_to_release``: the reuse-kept parameters are used within the next max_reuse_distance
      elements of the trace; equal to max_live in ftplan's config) + the largest module fetch
      (``_ds_largest_fetch``: a leaf MoE block whole, a fused-experts module);
    * released parameters whose gathered storage autograd still holds through a view
      (``_ds_view_held_elems``, every MoE layer's experts or their adapters) are not counted by the
      coordinator and come on top.

    An upper bound: max(max_live, max_reuse_distance) + the largest module fetch (at most every
    gatherable parameter) + the view-held experts."""
    live_cap, reuse, _prefetch = _ds_zero3_limits(model, consts, layout)
    gatherable = _ds_gatherable_elems(model, job, consts, layout.ep)
    return (min(max(live_cap, reuse) + _ds_largest_fetch(model, job, consts, layout.ep), gatherable)
            + _ds_view_held_elems(model, job, consts, layout.ep))


#: families whose text model reads ``self.embed_tokens.weight`` in its own forward (transformers
#: 5.24 modeling_llama4.py ``Llama4TextModel.forward``: ``input_ids.to(self.embed_tokens.weight.device)``):
#: DeepSpeed's ``ZeROOrderedDict.__getitem__`` (runtime/zero/parameter_offload.py) registers a
#: parameter read while not available as an external parameter of the module on top of its forward
#: stack, which then holds it gathered from its forward to the end of its backward (the whole step)
_EMBEDDING_READ_BY_MODEL = frozenset({"llama4_text"})


def _ds_forward_only_elems(model: ModelSpec, job: Job, consts: MemoryConstants) -> int:
    """Gathered elements ZeRO-3 releases right after their forward in LoRA / QLoRA without
    checkpointing: frozen modules whose output needs no gradient, which therefore register no
    backward hook and are absent from the trace's backward (deepspeed 0.19
    ``PartitionedParameterCoordinator.__params_to_release``): the (untied) input embedding and the
    first layer's projections that read the grad-free layer input (their base weights, packed 4-bit
    ones included; a ``lora_A`` beside them has a gradient and stays). Held on the ZeRO-3 LoRA/QLoRA
    gloo cases. With checkpointing none are left out (transformers' ``enable_input_require_grads``
    may make the embedding's output need a gradient)."""
    if job.method == "full" or job.ac_mode != "none":
        return 0
    limit = consts.deepspeed_auto_persistence_h * model.hidden_size
    out = 0
    if not model.tie_word_embeddings and model.family not in _EMBEDDING_READ_BY_MODEL:
        v = model.vocab_size * model.hidden_size
        out += v if v > limit else 0
    first = model.groups[layer_group_order(model)[0]]
    skip = set(job.quant.skip_modules)
    for lin in layer_linears(model, first):
        if lin.module not in LAYER_INPUT_PROJECTIONS:
            continue
        n = lin.in_features * lin.out_features
        if job.method == "qlora" and lin.module not in skip:
            n //= int(2 * _quant_storage_bytes(job))
        out += n if n > limit else 0
    return out


def _ds_persistent_elems(model: ModelSpec, job: Job, consts: MemoryConstants) -> tuple[int, int]:
    """(trainable, frozen) elements of the parameters at or under
    ``stage3_param_persistence_threshold`` (``auto``: 10 x hidden_size), which ZeRO-3 keeps whole
    on every rank from its first step on (next to their partitions), frozen ones included (LoRA's
    norms and small adapters; QLoRA's small packed 4-bit weights): held on the ZeRO-3 QLoRA gloo
    case, 25,216 B of them per rank."""
    limit = consts.deepspeed_auto_persistence_h * model.hidden_size
    out = [0, 0]
    for u in fsdp_units(model, job, "fsdp2"):
        for t in u.tensors:
            if t.numel <= limit:
                out[0 if t.trainable else 1] += t.numel * u.count
    return out[0], out[1]


def checkpointed_counts(model: ModelSpec, job: Job) -> list[int]:
    """Checkpointed decoder layers per group of ``model.groups`` under ``job.ac_mode``. ``every-k``
    follows transformers' ``every_n_layers`` (HF Trainer ``activation_checkpointing_kwargs=
    {"every_n_layers": k}``): layers 0, k, 2k, ... in the model's layer order."""
    mode = job.ac_mode
    if mode == "none":
        return [0] * len(model.groups)
    if mode != "every-k":
        return [g.count for g in model.groups]
    counts = [0] * len(model.groups)
    for i, gi in enumerate(layer_group_order(model)):
        if i % job.checkpoint_every == 0:
            counts[gi] += 1
    return counts
