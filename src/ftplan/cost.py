"""Dollars and energy of a plan: ``estimate_cost(runtime, offer, layout, gpu) -> Cost``.

cost = instances x price per instance-hour x billed hours, where billed hours are training +
start-up hours rounded up to the offer's billing granularity (when it is known). ``usd_low`` /
``usd_high`` price the runtime's calibrated uncertainty band (``RuntimeEstimate.hours_low/high``)
the same way. Energy is the
GPUs' board power (TDP) x hours: an upper bound, GPUs rarely sit at TDP for a whole job, and
host CPUs, networking and cooling are not counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .job import Layout
from .runtime import RuntimeEstimate

__all__ = ["Cost", "estimate_cost", "billed_hours"]


@dataclass(frozen=True)
class Cost:
    instances: int
    usd_per_instance_hour: float
    billed_hours: float
    usd: float
    usd_per_million_tokens: float | None
    energy_kwh: float | None  # board power (TDP) x GPUs x hours: an upper bound
    gpus_billed: int
    #: the cost at the runtime band's ends (None when the runtime has no band)
    usd_low: float | None = None
    usd_high: float | None = None


def billed_hours(hours: float, granularity_s: float | None) -> float:
    """``hours`` rounded up to whole billing increments (per-second billing: granularity 1)."""
    if not granularity_s or granularity_s <= 0:
        return hours
    seconds = hours * 3600.0
    units = math.ceil(seconds / granularity_s - 1e-9)
    return units * granularity_s / 3600.0


def estimate_cost(runtime: RuntimeEstimate, offer: Any, layout: Layout, gpu: Any | None = None) -> Cost:
    hours = runtime.total_hours
    if hours is None:
        raise ValueError("runtime has no hours: the job needs dataset_tokens")
    instances = layout.nodes
    per_instance = float(offer.usd_per_instance_hour)
    b = billed_hours(hours, getattr(offer, "billing_granularity_s", None))
    usd = instances * per_instance * b
    per_m = usd / runtime.total_tokens * 1e6 if runtime.total_tokens else None
    tdp = getattr(gpu, "tdp_w", None) if gpu is not None else None
    kwh = layout.world_size * float(tdp) * hours / 1000.0 if tdp else None
    gran = getattr(offer, "billing_granularity_s", None)
    lo_h, hi_h = getattr(runtime, "total_hours_low", None), getattr(runtime, "total_hours_high", None)
    usd_low = instances * per_instance * billed_hours(lo_h, gran) if lo_h is not None else None
    usd_high = instances * per_instance * billed_hours(hi_h, gran) if hi_h is not None else None
    return Cost(instances=instances, usd_per_instance_hour=per_instance, billed_hours=b, usd=usd,
                usd_per_million_tokens=per_m, energy_kwh=kwh,
                gpus_billed=instances * int(offer.gpus_per_instance), usd_low=usd_low, usd_high=usd_high)
