"""Spot / preemptible offers: the expected time and cost of the *completed* job with preemptions.

``spot_risk(runtime, offer, layout, checkpoint) -> SpotRisk``. Model (exponential failures,
checkpoint/restart, J. T. Daly, "A higher order estimate of the optimum checkpoint interval for
restart dumps", FGCS 22 (2006)):

* each instance is reclaimed at ``rate_per_hour`` (``catalog/data/preemption.csv``: per provider /
  instance / GPU with how the figure was derived and its source, or the user's rate); a job on
  ``nodes`` instances stops when any is: ``lambda = nodes x rate``, ``M = 1 / lambda``;
* a checkpoint takes ``delta`` = checkpoint bytes / durable-storage write speed (a sharded
  checkpoint is written by every node in parallel, a full one by rank 0 alone; the instance's
  local disk does not survive a reclaim); every ``tau`` hours of work one is written;
  ``tau`` = Daly's optimum ``sqrt(2 delta M) [1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9] - delta``
  (Young's ``sqrt(2 delta M)`` to first order) unless the user fixes it;
* a restart takes ``R`` = the plan's start-up (provisioning, container, model download) + reading
  the checkpoint back, plus an unbilled wait for capacity (``host.json``: 0 unless given);
* expected wall time of ``W`` hours of work: ``T = M e^(R/M) (e^((tau + delta)/M) - 1) W / tau``
  (Daly's eq. 13); expected preemptions ``T / M``; billed hours = start-up + ``T`` minus the
  unbilled waits, plus half a billing increment per restart.

As the rate goes to 0 the optimum interval grows without bound and ``T`` -> ``W``: the spot job
costs its price x the failure-free hours. Pure arithmetic; no I/O beyond the lazily loaded data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .catalog.hostdata import HostConstants, host_constants, preemption_rate_for
from .errors import ConfigError
from .host import CheckpointSize
from .job import Layout

__all__ = ["SpotRisk", "spot_risk", "daly_interval_hours", "expected_wall_hours"]


@dataclass(frozen=True)
class SpotRisk:
    rate_per_hour: float  # one instance
    job_rate_per_hour: float  # the whole job (any of its instances)
    rate_source: str
    rate_basis: str
    rate_assumed: bool  # no published figure for this provider (the catch-all row)
    checkpoint_bytes: int
    checkpoint_write_s: float
    restart_s: float  # billed part of a restart
    capacity_wait_s: float  # unbilled part of a restart
    interval_hours: float | None  # work between checkpoints (None: no checkpoints needed, rate 0)
    interval_optimal: bool
    work_hours: float  # failure-free training hours
    startup_hours: float
    expected_hours: float  # start-up + expected wall time to completion
    expected_billed_hours: float
    expected_preemptions: float
    p_no_preemption: float  # probability the job runs through without a reclaim
    usd_per_instance_hour: float
    instances: int
    expected_usd: float
    uninterrupted_usd: float  # the same offer if nothing were ever reclaimed (no checkpoints)

    @property
    def overhead_fraction(self) -> float:
        """Expected extra cost over the uninterrupted run."""
        return self.expected_usd / self.uninterrupted_usd - 1.0 if self.uninterrupted_usd else 0.0


def daly_interval_hours(delta_h: float, mtbf_h: float) -> float:
    """Daly's higher-order optimum checkpoint interval (hours of work between checkpoints)."""
    if delta_h <= 0:
        raise ConfigError("checkpoint write time must be > 0")
    if delta_h >= 2.0 * mtbf_h:
        return mtbf_h
    x = delta_h / (2.0 * mtbf_h)
    return math.sqrt(2.0 * delta_h * mtbf_h) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta_h


def expected_wall_hours(work_h: float, tau_h: float, delta_h: float, restart_h: float, mtbf_h: float) -> float:
    """Daly's expected wall time to finish ``work_h`` hours of work (eq. 13); ``mtbf_h = inf``
    gives the checkpointing overhead alone."""
    if work_h <= 0:
        return 0.0
    if math.isinf(mtbf_h):
        return work_h * (1.0 + delta_h / tau_h)
    m = mtbf_h
    # expm1 keeps precision when (tau + delta) << M
    return m * math.exp(restart_h / m) * math.expm1((tau_h + delta_h) / m) * work_h / tau_h


def spot_risk(
    runtime: Any,
    offer: Any,
    layout: Layout,
    checkpoint: CheckpointSize,
    *,
    rate_per_hour: float | None = None,
    checkpoint_interval_s: float | None = None,
    consts: HostConstants | None = None,
) -> SpotRisk:
    """Expected hours and dollars of the completed job on a preemptible ``offer``.

    ``runtime``: a ``RuntimeEstimate`` (its ``hours`` are the failure-free work, ``startup_hours``
    the start-up, also paid again at every restart). ``rate_per_hour`` overrides the catalog's
    per-instance rate; ``checkpoint_interval_s`` overrides the optimum interval."""
    c = consts or host_constants()
    if runtime.hours is None:
        raise ConfigError("the runtime has no hours: the job needs its dataset size", "pass --tokens")
    if rate_per_hour is not None and not 0 <= rate_per_hour < 1:
        raise ConfigError(f"preemption rate must be in [0, 1) per hour (got {rate_per_hour})",
                          "e.g. --preemption-rate 0.01 (one reclaim per 100 instance-hours)")
    if checkpoint_interval_s is not None and checkpoint_interval_s <= 0:
        raise ConfigError(f"checkpoint interval must be > 0 s (got {checkpoint_interval_s})",
                          "e.g. --checkpoint-interval 1800")
    if rate_per_hour is None:
        row = preemption_rate_for(offer.provider, getattr(offer, "sku", None), offer.gpu)
        rate, src, basis, assumed = row.rate_per_hour, row.source, row.basis, row.assumed
    else:
        rate, src, basis, assumed = float(rate_per_hour), "given by the user", "user-given rate", False
    instances = layout.nodes
    lam = rate * instances
    w = float(runtime.hours)
    start = float(runtime.startup_hours)
    # checkpoint write / read: sharded = every node writes its share in parallel
    per_node = checkpoint.total_bytes / instances if checkpoint.sharded else checkpoint.total_bytes
    delta_s = per_node / c.checkpoint_write_bytes_per_s
    read_s = per_node / c.checkpoint_read_bytes_per_s
    restart_s = start * 3600.0 + read_s
    wait_s = float(c.capacity_wait_s)
    delta, restart = delta_s / 3600.0, (restart_s + wait_s) / 3600.0
    mtbf = math.inf if lam == 0 else 1.0 / lam
    if checkpoint_interval_s is not None:
        tau: float | None = checkpoint_interval_s / 3600.0
        optimal = False
    elif lam == 0 or delta == 0:
        tau, optimal = None, True
    else:
        tau, optimal = daly_interval_hours(delta, mtbf), True
    if tau is None:
        wall = w
    else:
        wall = expected_wall_hours(w, tau, delta, restart, mtbf)
    n = 0.0 if math.isinf(mtbf) else wall / mtbf
    price = float(offer.usd_per_instance_hour)
    g = getattr(offer, "billing_granularity_s", None)
    from .cost import billed_hours

    billed = billed_hours(start + wall - n * wait_s / 3600.0, g) + (n * g / 2.0 / 3600.0 if g else 0.0)
    unint = billed_hours(start + w, g)
    return SpotRisk(
        rate_per_hour=rate, job_rate_per_hour=lam, rate_source=src, rate_basis=basis, rate_assumed=assumed,
        checkpoint_bytes=checkpoint.total_bytes, checkpoint_write_s=delta_s, restart_s=restart_s,
        capacity_wait_s=wait_s, interval_hours=tau, interval_optimal=optimal, work_hours=w,
        startup_hours=start, expected_hours=start + wall, expected_billed_hours=billed,
        expected_preemptions=n, p_no_preemption=math.exp(-lam * (start + w)),
        usd_per_instance_hour=price, instances=instances, expected_usd=instances * price * billed,
        uninterrupted_usd=instances * price * unint,
    )
