"""Exact byte accounting of a training step in PyTorch: parameters, gradients, optimizer state,
saved activations.

* storages are counted once (:func:`storage_key`, :func:`storage_nbytes`, :func:`unique_bytes`,
  with bitsandbytes' quantization state where asked);
* :func:`params_by_category` / :func:`total_params` / :func:`trainable_params`: element counts in
  ftplan's parameter categories;
* :func:`optimizer_state_bytes`: every tensor of ``optimizer.state``;
* :class:`SavedTensorTracker` (per op, module, checkpoint closures) and :class:`ForwardSavedBytes`
  (what ``ftplan measure`` records, any device: the tracker without attribution, plus the SAC
  cache): the storages autograd saves for backward.

Imports torch at import time: only measurement code and tests import this module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from .hf import LORA_PARAM_RE, PEFT_SEGMENTS, is_norm, owner_of, strip_peft_prefix

__all__ = [
    "CATEGORIES",
    "params_by_category",
    "total_params",
    "trainable_params",
    "unique_named_parameters",
    "storage_key",
    "storage_nbytes",
    "graph_leaf_bytes",
    "quant_state_tensors",
    "unique_bytes",
    "optimizer_state_bytes",
    "SavedRecord",
    "SavedTensorTracker",
    "ForwardSavedBytes",
    "SacRecorder",
]

# --------------------------------------------------------------------------------------------------
# Parameter categories
# --------------------------------------------------------------------------------------------------

#: The parameter categories reported by :func:`params_by_category` (``"lora"`` is added only for
#: models carrying PEFT adapters).
CATEGORIES: tuple[str, ...] = ("embedding", "attention", "mlp", "experts", "router", "norms", "lm_head")

def _is_router(module: nn.Module, segs: list[str]) -> bool:
    cls = type(module).__name__
    if "Router" in cls or cls.endswith("Gate") or "TopK" in cls:
        return True
    # plain nn.Linear routers (older layouts): `...mlp.gate` / `...block_sparse_moe.gate` / `...router`
    last = segs[-1] if segs else ""
    return last in ("gate", "router", "shared_expert_gate") and not isinstance(module, nn.Embedding)


def _categorise(model: nn.Module, name: str, param: nn.Parameter) -> str:
    owner, pname = owner_of(model, name)
    segs = [s for s in name.split(".")[:-1] if s not in PEFT_SEGMENTS]
    if LORA_PARAM_RE.search(name):
        return "lora"
    if isinstance(owner, nn.Embedding) or "embed_tokens" in segs or "wte" in segs:
        return "embedding"
    if "lm_head" in segs:
        return "lm_head"
    if is_norm(owner):
        return "norms"
    if any(s in ("self_attn", "attention", "attn", "linear_attn", "conv") for s in segs):  # (lfm2: conv)
        return "attention"
    if any(s.startswith("shared_expert") for s in segs):
        if segs and segs[-1] == "shared_expert_gate":
            return "router"
        return "mlp"
    if _is_router(owner, segs) or ("bias" in pname and "router" in pname) or "router" in segs \
            or "moe_statics" in segs:  # (ernie4_5_moe: gate.moe_statics.e_score_correction_bias)
        return "router"
    if any(s == "experts" for s in segs):
        return "experts"
    if any(s in ("mlp", "feed_forward", "block_sparse_moe", "ffn") for s in segs):
        return "mlp"
    raise ValueError(f"parameter {name!r} (owner {type(owner).__name__}) fits no category")


def unique_named_parameters(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """Named parameters with tied/shared tensors reported once (first name wins, as in torch)."""
    seen: set[int] = set()
    for name, p in model.named_parameters(remove_duplicate=True):
        key = id(p)
        if key in seen:
            continue
        seen.add(key)
        yield name, p


def params_by_category(model: nn.Module) -> dict[str, int]:
    """Element counts per category; tied weights counted once (as ``embedding``).

    Categories: ``embedding`` (token embeddings), ``attention`` (every projection weight/bias inside
    ``self_attn``: q/k/v/o, fused ``qkv_proj``, MLA ``q_a_proj``/``q_b_proj``/``kv_a_proj_with_mqa``/
    ``kv_b_proj``; a Gated DeltaNet's ``linear_attn`` projections, conv1d, ``dt_bias`` and
    ``A_log``; LFM2's short convolution ``conv``: in_proj, the Conv1d, out_proj), ``mlp`` (dense MLPs and MoE *shared* experts), ``experts`` (routed experts: the
    fused 3-D ``experts.gate_up_proj``/``experts.down_proj``), ``router`` (MoE gate weights and any
    router bias *parameter*), ``norms`` (every norm weight incl. q_norm/k_norm/q_a_layernorm/
    kv_a_layernorm and the final norm), ``lm_head`` (0 when tied). Models with PEFT adapters get an
    extra ``lora`` key (lora_A/lora_B/...); base weights wrapped by PEFT keep their category.

    Works on ``device="meta"`` models. Raises ``ValueError`` if a parameter fits no category.
    """
    out = {c: 0 for c in CATEGORIES}
    for name, p in unique_named_parameters(model):
        cat = _categorise(model, name, p)
        out[cat] = out.get(cat, 0) + _numel(p)
    return out


def _numel(p: torch.Tensor) -> int:
    # bitsandbytes Params4bit store packed uint8; report the logical element count when known
    qs = getattr(p, "quant_state", None)
    if qs is not None and getattr(qs, "shape", None) is not None:
        n = 1
        for d in qs.shape:
            n *= int(d)
        return n
    return p.numel()


def total_params(model: nn.Module) -> int:
    """Number of parameter elements, shared/tied parameters counted once."""
    return sum(_numel(p) for _, p in unique_named_parameters(model))


def trainable_params(model: nn.Module) -> int:
    """Number of parameter elements with ``requires_grad=True``, shared parameters counted once."""
    return sum(_numel(p) for _, p in unique_named_parameters(model) if p.requires_grad)


# --------------------------------------------------------------------------------------------------
# Storages, quantization state, optimizer state
# --------------------------------------------------------------------------------------------------


def quant_state_tensors(p: torch.Tensor) -> list[torch.Tensor]:
    """Tensors hanging off a bitsandbytes ``Params4bit.quant_state`` (absmax, code, nested state2...)."""
    out: list[torch.Tensor] = []
    qs = getattr(p, "quant_state", None)
    depth = 0
    while qs is not None and depth < 4:
        for name in ("absmax", "code", "offset"):
            t = getattr(qs, name, None)
            if isinstance(t, torch.Tensor):
                out.append(t)
        qs = getattr(qs, "state2", None)
        depth += 1
    scb = getattr(p, "SCB", None)  # Int8Params row scales
    if isinstance(scb, torch.Tensor):
        out.append(scb)
    return out


def unique_bytes(params: Iterable[torch.Tensor], *, with_quant_state: bool = False) -> int:
    """Bytes of distinct storages (each once); optionally plus the bitsandbytes quantization state of
    each parameter (4-bit absmax/code/nested state, 8-bit row scales)."""
    seen: set[int] = set()
    total = 0
    for p in params:
        tensors = [p] + (quant_state_tensors(p) if with_quant_state else [])
        for t in tensors:
            key = storage_key(t)
            if key in seen and key != 0:
                continue
            seen.add(key)
            total += storage_nbytes(t)
    return total


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> tuple[int, dict[str, int], int]:
    """Bytes of every tensor in ``optimizer.state`` (each storage once).

    Returns ``(total_unique_bytes, bytes_by_state_key_unique, total_bytes_counting_shared_per_param)``.
    bitsandbytes' quantization maps ``qmap1``/``qmap2`` are the same tensor object for every parameter,
    hence the unique/per-param distinction. Non-tensor state (Python ints like bnb's/Adafactor's
    ``step``) costs no tensor memory and is ignored; transformers' Adafactor keeps ``RMS`` as a 0-dim
    fp32 tensor per parameter (4 bytes, counted).
    """
    seen: set[int] = set()
    by_key: dict[str, int] = defaultdict(int)
    total = 0
    per_param_total = 0
    for state in optimizer.state.values():
        for k, v in state.items():
            if not isinstance(v, torch.Tensor):
                continue
            nb = storage_nbytes(v)
            per_param_total += nb
            key = storage_key(v)
            if key in seen and key != 0:
                continue
            seen.add(key)
            by_key[k] += nb
            total += nb
    return total, dict(by_key), per_param_total


# --------------------------------------------------------------------------------------------------
# Saved-tensor tracking
# --------------------------------------------------------------------------------------------------


def storage_key(t: torch.Tensor) -> int:
    """Identity of a tensor's memory: the data pointer of its untyped storage."""
    return t.untyped_storage().data_ptr()


def storage_nbytes(t: torch.Tensor) -> int:
    """Bytes of the whole untyped storage behind ``t`` (views count their full base)."""
    return t.untyped_storage().nbytes()


def graph_leaf_bytes(root: torch.Tensor, exclude: set[int]) -> dict[int, int]:
    """Storages of the non-parameter leaves that require grad which the autograd graph of ``root``
    holds (its ``AccumulateGrad`` nodes keep their variable alive until backward frees the graph),
    by storage key, less the keys in ``exclude`` (parameters, buffers, storages counted already).

    Such a leaf is the embedding output that transformers' ``enable_input_require_grads`` marks
    with a frozen embedding (PEFT + checkpointing); it is usually also the first checkpointed
    layer's input (counted as a saved tensor), except where the model transforms it before the
    layers (Granite's ``embedding_multiplier``): then it is a storage of its own."""
    out: dict[int, int] = {}
    fn = root.grad_fn
    if fn is None:
        return out
    seen: set[int] = set()
    stack = [fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        var = getattr(node, "variable", None)
        if isinstance(var, torch.Tensor) and not isinstance(var, nn.Parameter):
            k = storage_key(var)
            if k and k not in exclude:
                out[k] = storage_nbytes(var)
        stack.extend(f for f, _ in node.next_functions)
    return out


@dataclasses.dataclass
class SavedRecord:
    """One storage kept alive for the backward pass."""

    key: int  #: storage data_ptr
    nbytes: int  #: storage size in bytes
    shape: tuple[int, ...]  #: shape of the first saved view
    dtype: str  #: dtype of the first saved view
    module: str  #: innermost module (qualified name) running when first saved, '' if none
    module_type: str  #: class name of that module
    op: str  #: torch function running when first saved, or 'checkpoint_input'/'checkpoint_closure'
    producer: str  #: grad_fn class of the saved tensor when first saved ('' for leaves/no-grad)
    n_saves: int = 1  #: how many times autograd saved a view of this storage
    savers: list[str] = dataclasses.field(default_factory=list)  #: "module:op" of every save
    alive: bool = True  #: still referenced by the graph when the report was taken
    #: name of the parameter this storage is a dtype cast of (autocast's low-precision weight copies),
    #: found through the grad_fn chain (``TBackward0``/``ToCopyBackward0`` -> ``AccumulateGrad``); only
    #: detectable for parameters that require grad
    param_copy: str = ""


class _Held:
    """What the pack hook returns: a detached alias (no grad_fn, so no reference cycle)."""

    __slots__ = ("t", "__weakref__")

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


class _OpStack(TorchFunctionMode):
    """Records which torch function is executing, so saved tensors can be attributed to an op."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: D401
        name = getattr(func, "__name__", None) or str(func)
        self.stack.append(name)
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.stack.pop()


def _mutable_mappings(obj: Any, depth: int = 0) -> Iterator[MutableMapping]:
    """The mutable dict-likes other than plain dicts in ``obj`` (a checkpointed layer's keyword
    arguments): containers a later layer may fill while the recompute closure holds them (Gemma 4's
    ``shared_kv_states``, a ``KVSharingDict`` the layers that store their K/V write into)."""
    if depth > 4:
        return
    if isinstance(obj, MutableMapping) and not isinstance(obj, dict):
        yield obj
    if isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _mutable_mappings(o, depth + 1)
    elif isinstance(obj, Mapping):
        for o in obj.values():
            yield from _mutable_mappings(o, depth + 1)
    elif isinstance(obj, functools.partial):
        yield from _mutable_mappings(obj.args, depth + 1)
        yield from _mutable_mappings(obj.keywords, depth + 1)


def _iter_tensors(obj: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    if depth > 4:
        return
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _iter_tensors(o, depth + 1)
    elif isinstance(obj, Mapping):  # dict, and dict-likes such as transformers' KVSharingDict (a UserDict)
        for o in obj.values():
            yield from _iter_tensors(o, depth + 1)
    elif isinstance(obj, functools.partial):
        yield from _iter_tensors(obj.args, depth + 1)
        yield from _iter_tensors(obj.keywords, depth + 1)


class SavedTensorTracker:
    """Count the storages autograd saves for backward during a forward pass.

    Use as a context manager around the forward (and the loss). What is counted:

    * every tensor autograd saves (``torch.autograd.graph.saved_tensors_hooks`` pack hook) is keyed by
      its untyped storage ``data_ptr``; each storage is counted ONCE with its full ``nbytes`` (a view
      costs its whole base), however many ops save it;
    * storages belonging to parameters or buffers of ``model`` (and views of them, e.g. ``weight.t()``
      saved by ``addmm``) and of any tensor in ``exclude`` are EXCLUDED (reported separately as
      ``excluded_bytes``). Autocast's low-precision weight copies are NOT parameters and ARE counted;
    * a storage counts only while at least one of its saved references is still held by the graph
      (tensors saved by a sub-graph whose output was dropped are freed and not counted; e.g. DeepSeek-V3's
      group-limited routing saves ``topk`` indices on a branch that only feeds a non-differentiable
      ``topk`` and is dropped at once). When such an address is reused by a later saved tensor, a fresh
      record is started (the old one moves to ``retired``);
    * activation checkpointing: tensors saved *inside* a non-reentrant checkpointed region go to the
      checkpoint's own inner hooks (the outer hook never sees them) and are not kept - correct, they
      are recomputed. The region's positional tensor inputs are kept as ``SavedTensor`` s by
      ``_CheckpointFrame.save_inputs`` and DO reach the outer hook (op ``checkpoint_input``). Its
      keyword/closure tensors (HF passes ``position_embeddings``, ``attention_mask``,
      ``position_ids`` ... inside a ``functools.partial``) are kept alive by the recompute closure
      and never pass through a hook; :meth:`wrap_checkpoint_fn` records them (op
      ``checkpoint_closure``, counted while the partial is alive). With reentrant checkpointing the
      inputs go through ``ctx.save_for_backward`` (seen by the hook) and the closure is ``ctx.
      run_function`` (recorded the same way).
    * NOT counted: the CPU RNG state the checkpoint stashes (``torch.get_rng_state()``, a 5056-byte
      uint8 CPU tensor per checkpointed call - host memory even on GPU; reported as
      ``rng_state_bytes``), Python objects, the loss value itself (it is an output, not saved).

    Attribution: each record carries the innermost running module (global module forward hooks)
    and the torch function running at save time (a ``TorchFunctionMode``), plus the ``grad_fn`` of
    the saved tensor (its producer).
    """

    def __init__(
        self,
        model: nn.Module | None = None,
        *,
        exclude: Iterable[torch.Tensor] = (),
        track_ops: bool = True,
        track_modules: bool = True,
    ) -> None:
        self.model = model
        #: the tensors whose storages are not activations (parameters, buffers, ``exclude``), kept
        #: by object: a parameter whose ``.data`` is replaced during the forward (bitsandbytes'
        #: Linear4bit casts its bias to the input dtype on the first call) leaves its old address
        #: free, and a saved activation placed there must not be taken for the parameter
        self._excluded_src: list[torch.Tensor] = list(exclude)
        if model is not None:
            self._excluded_src += list(model.parameters()) + list(model.buffers())
        self._excluded_by_key = {storage_key(t): t for t in self._excluded_src}
        self._excluded: set[int] = set(self._excluded_by_key)
        self._excluded.discard(0)
        self.records: dict[int, SavedRecord] = {}
        #: records whose storage was released during the forward (address later reused)
        self.retired: list[SavedRecord] = []
        self._holders: dict[int, list[weakref.ref]] = defaultdict(list)
        self._excluded_seen: dict[int, int] = {}
        self._closures: list[tuple[weakref.ref, list[torch.Tensor], list[MutableMapping]]] = []
        self._ckpt_inputs: set[int] = set()
        self.n_checkpoint_calls = 0
        self.rng_state_bytes = 0
        self._track_ops = track_ops
        self._track_modules = track_modules
        self._ops = _OpStack() if track_ops else None
        self._mod_stack: list[nn.Module] = []
        self._names: dict[int, str] = {}
        self._param_names: dict[int, str] = {}
        if model is not None:
            self._names = {id(m): strip_peft_prefix(n) for n, m in model.named_modules()}
            self._param_names = {id(p): strip_peft_prefix(n) for n, p in model.named_parameters()}
        self._stack = contextlib.ExitStack()

    # ---- hooks -----------------------------------------------------------------------------
    def _where(self) -> tuple[str, str]:
        if self._mod_stack:
            m = self._mod_stack[-1]
            return self._names.get(id(m), type(m).__name__), type(m).__name__
        return "", ""

    def _pack(self, t: torch.Tensor) -> _Held:
        held = _Held(t.detach())
        if t.device.type == "meta":
            return held
        st = t.untyped_storage()
        key = st.data_ptr()
        nbytes = st.nbytes()
        if key == 0 or nbytes == 0:
            return held
        if key in self._excluded and self._moved(key):
            self.refresh_excluded()
        if key in self._excluded:
            self._excluded_seen[key] = nbytes
            return held
        module, module_type = self._where()
        if self._ops is not None and self._ops.stack:
            op = self._ops.stack[-1]
        elif key in self._ckpt_inputs:
            op = "checkpoint_input"
        else:
            op = "<python>"
        rec = self.records.get(key)
        if rec is not None and not any(r() is not None for r in self._holders[key]):
            # every earlier save of this address was released (its sub-graph died) and the CPU allocator
            # handed the address out again: it is a different tensor now, start a fresh record
            rec.alive = False
            self.retired.append(rec)
            self._holders[key] = []
            rec = None
        if rec is None:
            gf = t.grad_fn
            param_copy = self._param_copy_of(gf) if gf is not None else ""
            rec = SavedRecord(
                key=key,
                nbytes=nbytes,
                shape=tuple(t.shape),
                dtype=str(t.dtype).replace("torch.", ""),
                module=module,
                module_type=module_type,
                op=op,
                producer=type(gf).__name__ if gf is not None else "",
                param_copy=param_copy,
            )
            self.records[key] = rec
        else:
            rec.n_saves += 1
        rec.savers.append(f"{module}:{op}")
        self._holders[key].append(weakref.ref(held))
        return held

    def _moved(self, key: int) -> bool:
        t = self._excluded_by_key.get(key)
        return t is not None and storage_key(t) != key

    def refresh_excluded(self) -> None:
        """Re-key the excluded tensors (a parameter's storage was replaced since the last look)."""
        stale = {k for k, t in self._excluded_by_key.items() if storage_key(t) != k}
        self._excluded_by_key = {storage_key(t): t for t in self._excluded_src}
        self._excluded = (self._excluded - stale) | set(self._excluded_by_key)
        self._excluded.discard(0)

    def _param_copy_of(self, gf: Any) -> str:
        """Name of the parameter reached from ``gf`` through view/cast nodes only ('' if none)."""
        node = gf
        for _ in range(4):
            name = type(node).__name__
            if name == "AccumulateGrad":
                return self._param_names.get(id(node.variable), "")
            if name not in ("ToCopyBackward0", "TBackward0", "ViewBackward0", "TransposeBackward0",
                            "PermuteBackward0", "ExpandBackward0", "UnsqueezeBackward0"):
                return ""
            nxt = [f for f, _ in node.next_functions if f is not None]
            if len(nxt) != 1:
                return ""
            node = nxt[0]
        return ""

    @staticmethod
    def _unpack(held: _Held) -> torch.Tensor:
        return held.t

    def _pre_hook(self, module: nn.Module, args: Any) -> None:
        self._mod_stack.append(module)

    def _post_hook(self, module: nn.Module, args: Any, output: Any) -> None:
        # pop up to and including `module` (robust to modules whose pre-hook we missed)
        for i in range(len(self._mod_stack) - 1, -1, -1):
            if self._mod_stack[i] is module:
                del self._mod_stack[i:]
                break

    # ---- checkpoint wrapping ------------------------------------------------------------------
    def wrap_checkpoint_fn(self, ckpt_fn: Callable) -> Callable:
        """Wrap a checkpoint function (``torch.utils.checkpoint.checkpoint`` or HF's partial of it)
        so that the tensors it keeps alive through closures are recorded."""
        tracker = self

        @functools.wraps(ckpt_fn)
        def wrapped(function: Callable, *args: Any, **kwargs: Any) -> Any:
            tracker.n_checkpoint_calls += 1
            tracker.rng_state_bytes += torch.get_rng_state().numel()
            for t in _iter_tensors(list(args)):
                tracker._ckpt_inputs.add(storage_key(t))
            closure = [t.detach() for t in _iter_tensors(function)] + [
                t.detach() for t in _iter_tensors({k: v for k, v in kwargs.items()})
            ]
            # containers filled after this call: read again when the records are made
            maps = list(_mutable_mappings([function, kwargs]))
            try:
                ref = weakref.ref(function)
            except TypeError:  # pragma: no cover - plain functions/lambdas are weakref-able anyway
                ref = lambda: function  # noqa: E731
            tracker._closures.append((ref, closure, maps))
            return ckpt_fn(function, *args, **kwargs)

        return wrapped

    @contextlib.contextmanager
    def _patched_checkpointing(self) -> Iterator[None]:
        patched: list[tuple[nn.Module, Any]] = []
        if self.model is not None:
            for m in self.model.modules():
                fn = m.__dict__.get("_gradient_checkpointing_func")
                if fn is not None:
                    patched.append((m, fn))
                    m._gradient_checkpointing_func = self.wrap_checkpoint_fn(fn)
        try:
            yield
        finally:
            for m, fn in patched:
                m._gradient_checkpointing_func = fn

    def __enter__(self) -> SavedTensorTracker:
        st = self._stack
        st.enter_context(self._patched_checkpointing())
        if self._track_modules:
            h1 = nn.modules.module.register_module_forward_pre_hook(self._pre_hook)
            h2 = nn.modules.module.register_module_forward_hook(self._post_hook, always_call=True)
            st.callback(h1.remove)
            st.callback(h2.remove)
        st.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack))
        if self._ops is not None:
            st.enter_context(self._ops)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()

    # ---- results -------------------------------------------------------------------------------
    def _closure_records(self) -> list[SavedRecord]:
        self.refresh_excluded()
        out: dict[int, SavedRecord] = {}
        for ref, tensors, maps in self._closures:
            if ref() is None:
                continue
            for t in [*tensors, *(x.detach() for m in maps for x in _iter_tensors(m))]:
                key = storage_key(t)
                if key == 0 or key in self._excluded or key in out:
                    continue
                out[key] = SavedRecord(
                    key=key,
                    nbytes=storage_nbytes(t),
                    shape=tuple(t.shape),
                    dtype=str(t.dtype).replace("torch.", ""),
                    module="",
                    module_type="",
                    op="checkpoint_closure",
                    producer="",
                    savers=["checkpoint_closure"],
                )
        return list(out.values())

    def alive_records(self) -> list[SavedRecord]:
        """Saved storages still held by the autograd graph now, each once (plus closure tensors)."""
        out: list[SavedRecord] = []
        keys: set[int] = set()
        for key, rec in self.records.items():
            rec.alive = any(r() is not None for r in self._holders[key])
            if rec.alive:
                out.append(rec)
                keys.add(key)
        for rec in self._closure_records():
            if rec.key not in keys:
                out.append(rec)
                keys.add(rec.key)
        return out

    def saved_bytes(self) -> int:
        """Bytes of all alive saved storages (see class docstring)."""
        return sum(r.nbytes for r in self.alive_records())

    def excluded_bytes(self) -> int:
        """Bytes of parameter/buffer storages that autograd saved (not activations)."""
        return sum(self._excluded_seen.values())

    def by_op(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for r in self.alive_records():
            out[r.op] += r.nbytes
        return dict(out)

    def by_module(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for r in self.alive_records():
            out[r.module or "<top>"] += r.nbytes
        return dict(out)


class SacRecorder:
    """Wraps the ``context_fn`` of every checkpointed layer so the SAC cache dicts can be read
    (torch's selective checkpointing keeps each layer's cached op outputs in a dict that no
    saved-tensor hook sees). :meth:`restore` puts the layers' checkpoint functions back."""

    def __init__(self) -> None:
        self.storages: list[dict] = []
        self._saved: list[tuple[nn.Module, Any]] = []

    def wrap(self, context_fn: Callable) -> Callable:
        rec = self

        @functools.wraps(context_fn)
        def wrapped():
            fwd, recompute = context_fn()
            storage = getattr(fwd, "storage", None)
            if storage is not None:
                rec.storages.append(storage)
            return fwd, recompute

        return wrapped

    def install(self, model: nn.Module) -> None:
        for m in model.modules():
            fn = m.__dict__.get("_gradient_checkpointing_func")
            if isinstance(fn, functools.partial) and "context_fn" in fn.keywords:
                kw = dict(fn.keywords)
                kw["context_fn"] = self.wrap(kw["context_fn"])
                self._saved.append((m, fn))
                m._gradient_checkpointing_func = functools.partial(fn.func, *fn.args, **kw)

    def restore(self) -> None:
        for m, fn in self._saved:
            m._gradient_checkpointing_func = fn
        self._saved.clear()

    def storage_bytes(self, exclude: set[int] = frozenset()) -> dict[int, int]:
        """Storage key -> bytes of the cached tensors, each storage once (``exclude``: parameters)."""
        out: dict[int, int] = {}
        for t in self.tensors():
            k = storage_key(t)
            if k and k not in exclude:
                out[k] = storage_nbytes(t)
        return out

    def tensors(self) -> Iterator[torch.Tensor]:
        for storage in self.storages:
            for per_op in storage.values():
                for entry in per_op.values():
                    # one op's output: a _VersionWrapper, or a tuple/list of them (sdpa: out, lse)
                    items = entry if isinstance(entry, (tuple, list)) else (entry,)
                    for item in items:
                        val = getattr(item, "val", None)
                        if isinstance(val, torch.Tensor):
                            yield val


class ForwardSavedBytes:
    """What one forward leaves for the backward, as ``ftplan measure`` records it (any device).

    :class:`SavedTensorTracker` without op/module attribution (storages held by the graph after the
    forward, each once; the tensors a checkpointed layer's recompute closure keeps: RoPE cos/sin,
    position ids, masks) plus, under selective checkpointing, the SAC cache (each layer's cache dict,
    read through the ``context_fn`` by :class:`SacRecorder`). The layers'
    checkpoint functions are restored on exit, so later steps keep no extra references.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.tracker = SavedTensorTracker(model, track_ops=False, track_modules=False)
        self.sac = SacRecorder()
        self.total = 0
        self.weight_copy_bytes = 0
        self.sac_cache_bytes = 0

    def __enter__(self) -> ForwardSavedBytes:
        self.sac.install(self.model)
        self.tracker.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.tracker.__exit__(*exc)
        self.sac.restore()

    def count(self) -> None:
        """Read the bytes now (after the forward and the loss, before the backward)."""
        recs = self.tracker.alive_records()
        seen = {r.key: r.nbytes for r in recs}
        self.weight_copy_bytes = sum(r.nbytes for r in recs if r.param_copy)
        sac = self.sac.storage_bytes(self.tracker._excluded)
        self.sac_cache_bytes = sum(sac.values())
        for k, nb in sac.items():
            seen.setdefault(k, nb)
        self.total = sum(seen.values())
        # hold nothing into the backward (a GPU run's peak is measured there)
        self.sac.storages.clear()
        self.tracker._closures.clear()
        self.tracker.records.clear()
