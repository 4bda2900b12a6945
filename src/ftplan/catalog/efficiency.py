"""Runtime-model constants from ``data/efficiency.json``: achieved fractions of peak, bytes moved
per op, host overheads, communication, and the calibrated uncertainty band.

Loaded lazily on first use (never at import) and validated: every value block needs a number and a
``source``; fitted values say ``"status": "calibrated"`` and name the reference records they were
fitted on (``scripts/calibrate.py`` writes them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from typing import Any, NamedTuple

from ..errors import CatalogError

__all__ = ["Efficiency", "ElementwiseBytes", "Recompute", "efficiency", "parse_efficiency", "load_efficiency_data",
           "FITTED_KEYS", "HOST_KEYS", "host_variant", "parse_host"]

#: the free constants scripts/calibrate.py may fit (dotted paths into efficiency.json)
FITTED_KEYS = (
    "gemm.training_scale",
    "attention.flash_scale",
    "elementwise.scale",
    "host.dispatch_s_per_op",
    "host.step_fixed_s",
    "comm.overlap_efficiency",
    "host.checkpoint_ops_per_layer",
)


class Recompute(NamedTuple):
    """Share of each kind of forward work run again in backward under activation checkpointing."""

    matmul: float
    attention: float
    elementwise: float


@dataclass(frozen=True)
class ElementwiseBytes:
    """Bytes read + written by the memory-bound ops of one decoder layer's forward, per token and
    per element of a dimension (an op inventory of the transformers eager code, or compiled)."""

    per_hidden: float  # norms, residual adds (hidden-size tensors)
    per_intermediate: float  # MLP activation and gating (intermediate-size tensors)
    per_qk: float  # rotary embedding on q and k
    per_attn_out: float  # attention output transpose/reshape


@dataclass(frozen=True)
class Efficiency:
    # GEMM
    gemm_peak_fraction: dict[str, float]  # by arch (largest GEMMs, fraction of datasheet dense peak)
    gemm_by_vendor: dict[str, float]
    gemm_default: float
    gemm_measured_tflops: dict[str, float]  # by GPU name: best torch.matmul (bf16) measured
    gemm_training_scale: float
    gemm_launch_s: dict[str, float]  # by arch: fixed seconds per GEMM (launch, tail)
    gemm_launch_default_s: float
    # attention
    flash_fraction: dict[str, float]  # by arch: fused attention FLOPs rate / dense peak
    flash_default: float
    flash_scale: float  # fitted multiplier on the flash fractions (fwd+bwd of causal kernels vs the microbenchmark)
    flash_backward_factor: float  # backward FLOPs / forward FLOPs of a flash kernel
    eager_bytes_per_score: float  # eager attention traffic per score element, forward
    eager_softcap_bytes_per_score: float  # more of it where the scores are soft-capped (Gemma2)
    # memory-bound ops
    hbm_efficiency: dict[str, float]  # by arch: achieved / datasheet HBM bandwidth
    hbm_default: float
    elementwise_eager: ElementwiseBytes
    elementwise_compiled: ElementwiseBytes
    elementwise_backward_factor: float
    elementwise_scale: float
    loss_bytes_per_logit: dict[str, float]  # by loss path (job.loss: hf, trl, liger)
    autocast_cast_bytes_per_param: float
    grad_accumulate_bytes_per_param: float
    dropout_mask_bytes: float  # torch native_dropout's bool mask, per element
    lora_expert_merge_bytes_per_param: float
    # host
    dispatch_s_per_op: float
    ops_per_layer_forward: float
    ops_per_lora_module_forward: float
    ops_per_quant_module_forward: float  # bitsandbytes Linear4bit (dequantize + casts), per forward
    checkpoint_ops_per_layer: float  # torch.utils.checkpoint's Python work per checkpointed layer, in ops
    backward_op_factor: float
    compile_op_factor: float
    step_fixed_s: float
    # optimizer
    optimizer_traffic_factor: dict[str, float]  # by implementation (fused, foreach, forloop)
    grad_clip_bytes_factor: float  # x gradient bytes
    cpu_adam_params_per_s: float
    pcie_bytes_per_s: float
    pcie_measured_link_gbps: float  # the PCIe link (GB/s per direction) pcie_bytes_per_s was measured on
    # QLoRA (bitsandbytes 4-bit)
    dequant_bytes_per_weight: float
    dequant_double_quant_extra_bytes: float
    # communication
    latency_hop_intra_s: float
    latency_hop_inter_s: float
    bus_efficiency: float
    host_bounce_factor: float
    no_p2p_gpus: frozenset[str]
    overlap_efficiency: float
    ddp_bucket_bytes: int
    # clocks
    power_exponent: float
    # activation checkpointing: recomputed share of (matmul, attention, elementwise) per variant
    recompute: dict[str, Any]
    # start-up
    startup_fixed_s: float
    startup_load_bytes_per_s: float
    # calibrated band: quantiles of log(measured step time / predicted step time), held-out records
    band_log_low: float
    band_log_high: float
    band_quantiles: tuple[float, float]
    band_n: int

    def __hash__(self) -> int:  # dict fields; identity is enough (one instance per load)
        return id(self)

    def gemm_fraction(self, arch: str | None, vendor: str | None, gpu: str | None = None,
                      bf16_peak_tflops: float | None = None) -> float:
        """Fraction of the datasheet peak a large training GEMM reaches on this GPU."""
        measured = self.gemm_measured_tflops.get((gpu or "").lower())
        if measured and bf16_peak_tflops:
            base = measured / float(bf16_peak_tflops)
        else:
            a = (arch or "").lower()
            base = self.gemm_peak_fraction.get(a) or self.gemm_by_vendor.get((vendor or "").lower(), self.gemm_default)
        return base * self.gemm_training_scale

    def gemm_launch(self, arch: str | None) -> float:
        return self.gemm_launch_s.get((arch or "").lower(), self.gemm_launch_default_s)

    def flash(self, arch: str | None) -> float:
        return self.flash_fraction.get((arch or "").lower(), self.flash_default) * self.flash_scale

    def hbm(self, arch: str | None) -> float:
        return self.hbm_efficiency.get((arch or "").lower(), self.hbm_default)


# ---------------------------------------------------------------------------------------------
# validation helpers
# ---------------------------------------------------------------------------------------------
def _num(v: Any, where: str, lo: float = 0.0, hi: float | None = None) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise CatalogError(f"{where}: expected a number, got {v!r}")
    if v < lo or (hi is not None and v > hi):
        raise CatalogError(f"{where}: {v!r} out of range [{lo}, {hi if hi is not None else 'inf'}]")
    return float(v)


def _block(data: Any, key: str, where: str) -> dict:
    b = data.get(key) if isinstance(data, dict) else None
    if not isinstance(b, dict):
        raise CatalogError(f"{where}: missing block {key!r}")
    return b


def _valued(block: Any, where: str, lo: float = 0.0, hi: float | None = None) -> float:
    """A ``{"value": x, "source": ...}`` entry."""
    if not isinstance(block, dict) or "value" not in block:
        raise CatalogError(f"{where}: expected an object with 'value' and 'source'")
    if not block.get("source"):
        raise CatalogError(f"{where}: has no 'source'")
    return _num(block["value"], where, lo, hi)


def _table(block: dict, key: str, where: str, hi: float | None = 1.0) -> dict[str, float]:
    t = block.get(key)
    if not isinstance(t, dict) or not t:
        raise CatalogError(f"{where}: missing table {key!r}")
    return {k.lower(): _valued(v, f"{where}.{key}.{k}", 0.0, hi) for k, v in t.items()
            if not k.startswith("_")}


def _sourced(data: dict, key: str, where: str) -> dict:
    b = _block(data, key, where)
    if not b.get("source"):
        raise CatalogError(f"{where}: block {key!r} has no 'source'")
    return b


def _ew(b: dict, where: str) -> ElementwiseBytes:
    if not b.get("source"):
        raise CatalogError(f"{where}: has no 'source'")
    return ElementwiseBytes(
        per_hidden=_num(b.get("per_hidden"), f"{where}.per_hidden"),
        per_intermediate=_num(b.get("per_intermediate"), f"{where}.per_intermediate"),
        per_qk=_num(b.get("per_qk"), f"{where}.per_qk"),
        per_attn_out=_num(b.get("per_attn_out"), f"{where}.per_attn_out"),
    )


def _recompute_table(b: dict, where: str) -> dict[str, Any]:
    out = {}
    for mode, e in b.items():
        if mode.startswith("_"):
            continue
        if not isinstance(e, dict) or not e.get("source"):
            raise CatalogError(f"{where}.{mode}: needs matmul, attention, elementwise and a source")
        out[mode] = Recompute(*(_num(e.get(k), f"{where}.{mode}.{k}", 0, 1)
                                for k in ("matmul", "attention", "elementwise")))
    if "full" not in out:
        raise CatalogError(f"{where}: lacks 'full'")
    return out


def parse_efficiency(data: Any, where: str = "efficiency.json") -> Efficiency:
    """Validate the parsed JSON document and build an :class:`Efficiency`."""
    if not isinstance(data, dict):
        raise CatalogError(f"{where}: must be a JSON object")
    pos = 1e-12
    g = _block(data, "gemm", where)
    a = _block(data, "attention", where)
    m = _block(data, "memory_bound", where)
    ew = _block(data, "elementwise", where)
    h = _block(data, "host", where)
    o = _block(data, "optimizer", where)
    dq = _sourced(data, "dequant", where)
    c = _block(data, "comm", where)
    ck = _sourced(data, "clock", where)
    st = _sourced(data, "startup", where)
    rc_block = _block(data, "recompute", where)
    u = _sourced(data, "uncertainty", where)
    impl = _table(o, "traffic_factor", f"{where}: optimizer", hi=20.0)
    for k in ("fused", "foreach", "forloop"):
        if k not in impl:
            raise CatalogError(f"{where}: optimizer.traffic_factor lacks {k!r}")
    no_p2p = c.get("no_p2p_gpus")
    if not isinstance(no_p2p, dict) or not isinstance(no_p2p.get("value"), list) or not no_p2p.get("source"):
        raise CatalogError(f"{where}: comm.no_p2p_gpus must be {{'value': [gpu names], 'source': ...}}")
    q = u.get("quantiles")
    if not (isinstance(q, list) and len(q) == 2 and all(isinstance(x, (int, float)) for x in q)
            and 0 < q[0] < q[1] < 1):
        raise CatalogError(f"{where}: uncertainty.quantiles must be [low, high] in (0, 1)")
    lo = _num(u.get("log_low"), f"{where}: uncertainty.log_low", -5.0, 5.0)
    hi = _num(u.get("log_high"), f"{where}: uncertainty.log_high", -5.0, 5.0)
    if lo > hi:
        raise CatalogError(f"{where}: uncertainty.log_low must be <= log_high")
    return Efficiency(
        gemm_peak_fraction=_table(g, "peak_fraction", f"{where}: gemm"),
        gemm_by_vendor=_table(g, "by_vendor", f"{where}: gemm"),
        gemm_default=_valued(g.get("default"), f"{where}: gemm.default", pos, 1),
        gemm_measured_tflops=_table(g, "measured_bf16_tflops", f"{where}: gemm", hi=None),
        gemm_training_scale=_valued(g.get("training_scale"), f"{where}: gemm.training_scale", 0.05, 2),
        gemm_launch_s=_table(g, "launch_s", f"{where}: gemm", hi=1e-3),
        gemm_launch_default_s=_valued(g.get("launch_default"), f"{where}: gemm.launch_default", 0, 1e-3),
        flash_fraction=_table(a, "flash_fraction", f"{where}: attention"),
        flash_default=_valued(a.get("flash_default"), f"{where}: attention.flash_default", pos, 1),
        flash_scale=_valued(a.get("flash_scale"), f"{where}: attention.flash_scale", 0.05, 5),
        flash_backward_factor=_valued(a.get("flash_backward_factor"), f"{where}: attention.flash_backward_factor", 1, 10),
        eager_bytes_per_score=_valued(a.get("eager_bytes_per_score"), f"{where}: attention.eager_bytes_per_score", 0, 1000),
        eager_softcap_bytes_per_score=_valued(a.get("eager_softcap_bytes_per_score"),
                                              f"{where}: attention.eager_softcap_bytes_per_score", 0, 1000),
        hbm_efficiency=_table(m, "hbm_efficiency", f"{where}: memory_bound"),
        hbm_default=_valued(m.get("hbm_default"), f"{where}: memory_bound.hbm_default", pos, 1),
        elementwise_eager=_ew(_block(ew, "eager", f"{where}: elementwise"), f"{where}: elementwise.eager"),
        elementwise_compiled=_ew(_block(ew, "compiled", f"{where}: elementwise"), f"{where}: elementwise.compiled"),
        elementwise_backward_factor=_valued(ew.get("backward_factor"), f"{where}: elementwise.backward_factor", 0, 10),
        elementwise_scale=_valued(ew.get("scale"), f"{where}: elementwise.scale", 0, 10),
        loss_bytes_per_logit=_table(ew, "loss_bytes_per_logit", f"{where}: elementwise", hi=1000),
        autocast_cast_bytes_per_param=_valued(ew.get("autocast_cast_bytes_per_param"),
                                              f"{where}: elementwise.autocast_cast_bytes_per_param", 0, 100),
        grad_accumulate_bytes_per_param=_valued(ew.get("grad_accumulate_bytes_per_param"),
                                                f"{where}: elementwise.grad_accumulate_bytes_per_param", 0, 100),
        dropout_mask_bytes=_valued(ew.get("dropout_mask_bytes"), f"{where}: elementwise.dropout_mask_bytes", 0, 8),
        lora_expert_merge_bytes_per_param=_valued(ew.get("lora_expert_merge_bytes_per_param"),
                                                  f"{where}: elementwise.lora_expert_merge_bytes_per_param", 0, 100),
        dispatch_s_per_op=_valued(h.get("dispatch_s_per_op"), f"{where}: host.dispatch_s_per_op", 0, 1e-3),
        ops_per_layer_forward=_valued(h.get("ops_per_layer_forward"), f"{where}: host.ops_per_layer_forward", 0, 1e4),
        ops_per_lora_module_forward=_valued(h.get("ops_per_lora_module_forward"),
                                            f"{where}: host.ops_per_lora_module_forward", 0, 1e3),
        ops_per_quant_module_forward=_valued(h.get("ops_per_quant_module_forward"),
                                             f"{where}: host.ops_per_quant_module_forward", 0, 1e3),
        checkpoint_ops_per_layer=_valued(h.get("checkpoint_ops_per_layer"), f"{where}: host.checkpoint_ops_per_layer",
                                         0, 1e4),
        backward_op_factor=_valued(h.get("backward_op_factor"), f"{where}: host.backward_op_factor", 0, 10),
        compile_op_factor=_valued(h.get("compile_op_factor"), f"{where}: host.compile_op_factor", 0, 1),
        step_fixed_s=_valued(h.get("step_fixed_s"), f"{where}: host.step_fixed_s", 0, 60),
        optimizer_traffic_factor=impl,
        grad_clip_bytes_factor=_valued(o.get("grad_clip_bytes_factor"), f"{where}: optimizer.grad_clip_bytes_factor", 0, 10),
        cpu_adam_params_per_s=_valued(o.get("cpu_adam_params_per_s"), f"{where}: optimizer.cpu_adam_params_per_s", pos, 1e12),
        pcie_bytes_per_s=_valued(o.get("pcie_bytes_per_s"), f"{where}: optimizer.pcie_bytes_per_s", pos, 1e12),
        pcie_measured_link_gbps=_valued(o.get("pcie_measured_link_gbps"), f"{where}: optimizer.pcie_measured_link_gbps",
                                        pos, 1e4),
        dequant_bytes_per_weight=_num(dq.get("bytes_per_weight_per_pass"), f"{where}: dequant.bytes_per_weight_per_pass", 0, 100),
        dequant_double_quant_extra_bytes=_num(dq.get("double_quant_extra_bytes"),
                                              f"{where}: dequant.double_quant_extra_bytes", 0, 100),
        latency_hop_intra_s=_valued(c.get("latency_hop_intra_s"), f"{where}: comm.latency_hop_intra_s", 0, 1e-2),
        latency_hop_inter_s=_valued(c.get("latency_hop_inter_s"), f"{where}: comm.latency_hop_inter_s", 0, 1e-2),
        bus_efficiency=_valued(c.get("bus_efficiency"), f"{where}: comm.bus_efficiency", pos, 1),
        host_bounce_factor=_valued(c.get("host_bounce_factor"), f"{where}: comm.host_bounce_factor", pos, 1),
        no_p2p_gpus=frozenset(str(x).lower() for x in no_p2p["value"]),
        overlap_efficiency=_valued(c.get("overlap_efficiency"), f"{where}: comm.overlap_efficiency", 0, 1),
        ddp_bucket_bytes=int(_valued(c.get("ddp_bucket_bytes"), f"{where}: comm.ddp_bucket_bytes", 1, 1e12)),
        power_exponent=_num(ck.get("power_exponent"), f"{where}: clock.power_exponent", 0, 2),
        recompute=_recompute_table(rc_block, f"{where}: recompute"),
        startup_fixed_s=_num(st.get("fixed_s"), f"{where}: startup.fixed_s"),
        startup_load_bytes_per_s=_num(st.get("load_bytes_per_s"), f"{where}: startup.load_bytes_per_s", pos),
        band_log_low=lo,
        band_log_high=hi,
        band_quantiles=(float(q[0]), float(q[1])),
        band_n=int(_num(u.get("n"), f"{where}: uncertainty.n", 0, 1e6)),
    )


def load_efficiency_data() -> dict:
    """The raw bundled ``efficiency.json`` document (for scripts that rewrite it)."""
    path = resources.files("ftplan.catalog") / "data" / "efficiency.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CatalogError(f"cannot read bundled efficiency.json: {e}") from None


@lru_cache(maxsize=1)
def efficiency() -> Efficiency:
    """The bundled runtime constants (read and validated on first call)."""
    return parse_efficiency(load_efficiency_data())


# ---------------------------------------------------------------------------------------------
# another machine's host (the runtime split of GPU records; ftplan validate)
# ---------------------------------------------------------------------------------------------
#: host constants a record may replace (efficiency.json ``host``; Efficiency field names)
HOST_KEYS = ("dispatch_s_per_op", "step_fixed_s")

_HOST_VARIANTS: dict[tuple, tuple[Any, Any]] = {}


def host_variant(eff: Any | None, overrides: dict) -> Any:
    """``eff`` (default: the bundled efficiency.json) with the host constants of another machine.
    Memoised per (eff, overrides) so that the runtime model's caches keep hitting."""
    eff = eff if eff is not None else efficiency()
    key = (id(eff), tuple(sorted(overrides.items())))
    hit = _HOST_VARIANTS.get(key)
    if hit is not None and hit[0] is eff:
        return hit[1]
    bad = set(overrides) - set(HOST_KEYS)
    if bad:
        raise CatalogError(f"host overrides: unknown key(s) {sorted(bad)}; known: {', '.join(HOST_KEYS)}")
    var = replace(eff, **overrides)
    if len(_HOST_VARIANTS) > 256:
        _HOST_VARIANTS.clear()
    _HOST_VARIANTS[key] = (eff, var)
    return var


def parse_host(data: Any, where: str) -> dict[str, float]:
    """The host constants of a measurement machine (``{"dispatch_s_per_op": {"value": ...,
    "source": ...}, ...}``, keys among ``HOST_KEYS``) as Efficiency field overrides; ``None`` or
    ``{}``: ftplan's default host."""
    out: dict[str, float] = {}
    if data is None:
        return out
    if not isinstance(data, dict):
        raise CatalogError(f"{where}: 'host' must be an object")
    for k, v in data.items():
        if k.startswith("_"):
            continue
        if k not in HOST_KEYS:
            raise CatalogError(f"{where}: host.{k} is not a host constant ({', '.join(HOST_KEYS)})")
        val = v.get("value") if isinstance(v, dict) else None
        if isinstance(val, bool) or not isinstance(val, (int, float)) or not 0 <= val < 1 or not v.get("source"):
            raise CatalogError(f"{where}: host.{k} needs a value in [0, 1) seconds and a source")
        out[k] = float(val)
    return out
