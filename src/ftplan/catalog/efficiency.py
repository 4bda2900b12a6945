"""Runtime-model constants from ``data/efficiency.json``: achieved-MFU fractions, overlap, comm.

Loaded lazily on first use (never at import) and validated: every value block needs a number
and a ``source``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from ..errors import CatalogError

__all__ = ["Efficiency", "efficiency", "parse_efficiency"]


@dataclass(frozen=True)
class Efficiency:
    by_arch: dict[str, float]
    by_vendor: dict[str, float]
    default: float
    by_method: dict[str, float]
    width_reference_hidden: int
    width_exponent: float
    width_min_factor: float
    tokens_reference: int
    tokens_exponent: float
    tokens_min_factor: float
    overlap: dict[str, float]
    latency_intra_s: float
    latency_inter_s: float
    bus_efficiency: float
    bucket_bytes: int
    hbm_efficiency: float
    cpu_adam_params_per_s: float
    pcie_bytes_per_s: float
    startup_fixed_s: float
    startup_load_bytes_per_s: float

    def __hash__(self) -> int:  # dict fields; identity is enough (one instance per load)
        return id(self)

    def base(self, arch: str | None, vendor: str | None) -> float:
        a = (arch or "").lower()
        if a in self.by_arch:
            return self.by_arch[a]
        return self.by_vendor.get((vendor or "").lower(), self.default)

    def width_factor(self, hidden: int) -> float:
        f = (hidden / self.width_reference_hidden) ** self.width_exponent
        return max(self.width_min_factor, min(1.0, f))

    def tokens_factor(self, tokens: int) -> float:
        f = (tokens / self.tokens_reference) ** self.tokens_exponent
        return max(self.tokens_min_factor, min(1.0, f))

    def matmul_efficiency(self, arch: str | None, vendor: str | None, method: str, hidden: int,
                          tokens_per_micro_batch: int) -> float:
        return (self.base(arch, vendor) * self.by_method.get(method, 1.0)
                * self.width_factor(hidden) * self.tokens_factor(tokens_per_micro_batch))


def _num(v: Any, where: str, lo: float = 0.0, hi: float | None = None) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise CatalogError(f"{where}: expected a number, got {v!r}")
    if v < lo or (hi is not None and v > hi):
        raise CatalogError(f"{where}: {v!r} out of range [{lo}, {hi if hi is not None else 'inf'}]")
    return float(v)


def _valued(block: Any, where: str, hi: float | None = 1.0) -> float:
    if not isinstance(block, dict) or "value" not in block:
        raise CatalogError(f"{where}: expected an object with 'value' and 'source'")
    if not block.get("source"):
        raise CatalogError(f"{where}: has no 'source'")
    return _num(block["value"], where, 0.0, hi)


def _table(data: dict, key: str, where: str) -> dict[str, float]:
    t = data.get(key)
    if not isinstance(t, dict) or not t:
        raise CatalogError(f"{where}: missing table {key!r}")
    return {k.lower(): _valued(v, f"{where}: {key}.{k}") for k, v in t.items()}


def _sourced(data: dict, key: str, where: str) -> dict:
    b = data.get(key)
    if not isinstance(b, dict):
        raise CatalogError(f"{where}: missing block {key!r}")
    if not b.get("source"):
        raise CatalogError(f"{where}: block {key!r} has no 'source'")
    return b


def parse_efficiency(data: Any, where: str = "efficiency.json") -> Efficiency:
    if not isinstance(data, dict):
        raise CatalogError(f"{where}: must be a JSON object")
    by_arch = _table(data, "by_arch", where)
    by_vendor = _table(data, "by_vendor", where)
    by_method = _table(data, "by_method", where)
    for m in ("full", "lora", "qlora"):
        if m not in by_method:
            raise CatalogError(f"{where}: by_method lacks {m!r}")
    overlap = _table(data, "overlap", where)
    default = _valued(data.get("default"), f"{where}: default")
    w = _sourced(data, "width", where)
    t = _sourced(data, "tokens", where)
    c = _sourced(data, "comm", where)
    mb = _sourced(data, "memory_bound", where)
    off = _sourced(data, "offload", where)
    st = _sourced(data, "startup", where)
    pos = 1e-12
    return Efficiency(
        by_arch=by_arch,
        by_vendor=by_vendor,
        default=default,
        by_method=by_method,
        width_reference_hidden=int(_num(w.get("reference_hidden"), f"{where}: width.reference_hidden", 1)),
        width_exponent=_num(w.get("exponent"), f"{where}: width.exponent", 0, 4),
        width_min_factor=_num(w.get("min_factor"), f"{where}: width.min_factor", pos, 1),
        tokens_reference=int(_num(t.get("reference_tokens"), f"{where}: tokens.reference_tokens", 1)),
        tokens_exponent=_num(t.get("exponent"), f"{where}: tokens.exponent", 0, 4),
        tokens_min_factor=_num(t.get("min_factor"), f"{where}: tokens.min_factor", pos, 1),
        overlap=overlap,
        latency_intra_s=_num(c.get("latency_intra_s"), f"{where}: comm.latency_intra_s"),
        latency_inter_s=_num(c.get("latency_inter_s"), f"{where}: comm.latency_inter_s"),
        bus_efficiency=_num(c.get("bus_efficiency"), f"{where}: comm.bus_efficiency", pos, 1),
        bucket_bytes=int(_num(c.get("bucket_bytes"), f"{where}: comm.bucket_bytes", 1)),
        hbm_efficiency=_num(mb.get("hbm_efficiency"), f"{where}: memory_bound.hbm_efficiency", pos, 1),
        cpu_adam_params_per_s=_num(off.get("cpu_adam_params_per_s"), f"{where}: offload.cpu_adam_params_per_s", pos),
        pcie_bytes_per_s=_num(off.get("pcie_bytes_per_s"), f"{where}: offload.pcie_bytes_per_s", pos),
        startup_fixed_s=_num(st.get("fixed_s"), f"{where}: startup.fixed_s"),
        startup_load_bytes_per_s=_num(st.get("load_bytes_per_s"), f"{where}: startup.load_bytes_per_s", pos),
    )


@lru_cache(maxsize=1)
def efficiency() -> Efficiency:
    """The bundled runtime constants (read and validated on first call)."""
    path = resources.files("ftplan.catalog") / "data" / "efficiency.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CatalogError(f"cannot read bundled efficiency.json: {e}") from None
    return parse_efficiency(data)
