"""Host / restart constants (``data/host.json``) and spot preemption rates (``data/preemption.csv``).

Loaded on first use and validated: every constant has ``value``, ``source`` and ``status``; every
rate row has a source, a date and how it was derived (``basis``).
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from ..errors import CatalogError

__all__ = ["HostConstants", "host_constants", "PreemptionRate", "preemption_rates", "preemption_rate_for",
           "MoeConstants", "moe_constants"]

_KEYS = ("process_baseline_bytes", "dataloader_bytes_per_process", "load_shard_bytes",
         "checkpoint_write_bytes_per_s", "checkpoint_read_bytes_per_s", "capacity_wait_s")


@dataclass(frozen=True)
class HostConstants:
    process_baseline_bytes: int
    dataloader_bytes_per_process: int
    load_shard_bytes: int
    checkpoint_write_bytes_per_s: float
    checkpoint_read_bytes_per_s: float
    capacity_wait_s: float


@lru_cache(maxsize=1)
def host_constants() -> HostConstants:
    path = resources.files("ftplan.catalog") / "data" / "host.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise CatalogError(f"cannot read bundled host.json: {e}") from None
    values = {}
    for k in _KEYS:
        e = data.get(k)
        if not isinstance(e, dict) or "value" not in e or not e.get("source") or not e.get("status"):
            raise CatalogError(f"host.json: {k!r} needs a value, a source and a status")
        v = e["value"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise CatalogError(f"host.json: {k!r} must be a non-negative number, got {v!r}")
        values[k] = v
    for k in ("checkpoint_write_bytes_per_s", "checkpoint_read_bytes_per_s"):
        if values[k] <= 0:
            raise CatalogError(f"host.json: {k!r} must be > 0")
    return HostConstants(**values)


@dataclass(frozen=True)
class PreemptionRate:
    provider: str  # "*" = any provider
    sku: str | None
    gpu: str  # "*" = any GPU of the provider
    rate_per_hour: float  # hazard of one instance being reclaimed, per running hour
    basis: str
    as_of: _dt.date
    source: str

    @property
    def assumed(self) -> bool:
        """True for the catch-all row (no published figure for this provider)."""
        return self.provider == "*"


@lru_cache(maxsize=1)
def preemption_rates() -> tuple[PreemptionRate, ...]:
    from .gpus import read_csv_rows

    name = "ftplan/catalog/data/preemption.csv"
    text = (resources.files("ftplan.catalog") / "data" / "preemption.csv").read_text(encoding="utf-8")
    cols = ("provider", "sku", "gpu", "rate_per_hour", "basis", "as_of", "source")
    out = []
    for line, row in read_csv_rows(text, name, cols, ("provider", "gpu", "rate_per_hour", "basis", "as_of", "source")):
        for c in ("provider", "gpu", "rate_per_hour", "basis", "as_of", "source"):
            if not row[c]:
                raise CatalogError(f"{name}: line {line}: {c} is blank")
        try:
            rate = float(row["rate_per_hour"])
            as_of = _dt.date.fromisoformat(row["as_of"])
        except ValueError:
            raise CatalogError(f"{name}: line {line}: bad rate_per_hour or as_of") from None
        if not 0 <= rate < 1:
            raise CatalogError(f"{name}: line {line}: rate_per_hour must be in [0, 1), got {rate}")
        out.append(PreemptionRate(row["provider"], row["sku"] or None, row["gpu"], rate, row["basis"], as_of,
                                  row["source"]))
    if not any(r.provider == "*" and r.gpu == "*" for r in out):
        raise CatalogError(f"{name}: needs a '*,,*' catch-all row")
    return tuple(out)


def preemption_rate_for(provider: str, sku: str | None, gpu: str) -> PreemptionRate:
    """The most specific row for an offer: provider + sku, provider + gpu, provider + *, then *."""
    p = provider.casefold()
    rows = preemption_rates()

    def score(r: PreemptionRate) -> int | None:
        if r.provider != "*" and r.provider.casefold() != p:
            return None
        if r.sku is not None and (sku or "").casefold() != r.sku.casefold():
            return None
        if r.gpu not in ("*", gpu):
            return None
        return (0 if r.provider == "*" else 4) + (2 if r.sku else 0) + (1 if r.gpu != "*" else 0)

    best = max(((s, i) for i, r in enumerate(rows) if (s := score(r)) is not None), default=None)
    assert best is not None  # the catch-all row always matches
    return rows[best[1]]


@dataclass(frozen=True)
class MoeConstants:
    worst_rank_load_factor: float
    a2a_per_moe_layer_forward: int


@lru_cache(maxsize=1)
def moe_constants() -> MoeConstants:
    path = resources.files("ftplan.catalog") / "data" / "moe.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise CatalogError(f"cannot read bundled moe.json: {e}") from None
    vals = {}
    for k in ("worst_rank_load_factor", "a2a_per_moe_layer_forward"):
        e = data.get(k)
        if not isinstance(e, dict) or "value" not in e or not e.get("source"):
            raise CatalogError(f"moe.json: {k!r} needs a value and a source")
        v = e["value"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 1:
            raise CatalogError(f"moe.json: {k!r} must be a number >= 1, got {v!r}")
        vals[k] = v
    return MoeConstants(float(vals["worst_rank_load_factor"]), int(vals["a2a_per_moe_layer_forward"]))
