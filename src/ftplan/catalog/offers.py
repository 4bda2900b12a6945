"""GPU offers: what a GPU-hour costs where, validated against the GPU catalog.

The bundled offers live in ``ftplan/catalog/data/offers.csv``. User files use the same CSV
schema (blank lines and lines starting with ``#`` are ignored; extra columns are ignored)::

    provider,sku,gpu,gpus_per_instance,usd_per_gpu_hour,pricing,region,inter_node_network,
    inter_node_gbps,billing_granularity_s,as_of,source,notes

=====================  ========  ===============================================================
column                 required  meaning
=====================  ========  ===============================================================
provider               yes       cloud or marketplace, e.g. ``AWS``, ``RunPod``
sku                    yes       instance type or product name; put a commitment term in it
                                 (``a3-highgpu-8g (1-yr CUD)``) so reserved terms stay distinct
gpu                    yes       a slug (or alias) from the GPU catalog, e.g. ``h100-sxm``
gpus_per_instance      yes       integer >= 1, at most the GPU's ``max_gpus_per_node``
usd_per_gpu_hour       yes       USD per GPU per hour (instance price / gpus_per_instance)
pricing                yes       ``on-demand`` | ``spot`` | ``reserved``
region                 no        free text
inter_node_network     no        free text, e.g. ``EFA v2 32x100 Gb/s``
inter_node_gbps        no        per-INSTANCE Gbit/s to other instances; ``0`` = single-node-only
                                 offer; blank = unknown
billing_granularity_s  no        billing increment in seconds (1 = per-second, 60, 3600); blank
                                 = unknown
as_of                  yes       date the price was observed, ``YYYY-MM-DD``
source                 yes       where the price comes from (URL/repo and date)
notes                  no        free text
host_ram_gib           no        host (CPU) RAM of one instance in GiB; blank = unknown
local_disk_gb          no        local disk of one instance in GB (instance store / bundled SSD,
                                 not a network volume the user sizes); blank = unknown
host_source            no        where host_ram_gib / local_disk_gb come from (required with them)
=====================  ========  ===============================================================

The bundled file keeps price history: a (provider, sku, gpu, gpus_per_instance, pricing,
region) key may appear with several dates. :func:`load_offers` keeps only the newest row per
key unless ``latest_only=False``; rows from user files win ties over bundled ones.

Nothing is read at import time.
"""

from __future__ import annotations

import ast
import csv
import datetime as _dt
import functools
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import CatalogError, ConfigError, NotFoundError
from .gpus import (
    GpuSpec,
    read_text as _read_text,
    field_error,
    gpu_name_index,
    load_gpus,
    parse_float,
    parse_int,
    raise_collected,
    read_csv_rows,
    resolve_gpu_name,
)

__all__ = [
    "Offer",
    "OFFER_COLUMNS",
    "PRICING",
    "SkyPilotImport",
    "SKYPILOT_ACCELERATORS",
    "load_offers",
    "latest_offers",
    "filter_offers",
    "is_stale",
    "import_skypilot_catalog",
]

PRICING = ("on-demand", "spot", "reserved")
OFFER_COLUMNS = (
    "provider",
    "sku",
    "gpu",
    "gpus_per_instance",
    "usd_per_gpu_hour",
    "pricing",
    "region",
    "inter_node_network",
    "inter_node_gbps",
    "billing_granularity_s",
    "as_of",
    "source",
    "notes",
    "host_ram_gib",
    "local_disk_gb",
    "host_source",
)
_REQUIRED = frozenset({"provider", "sku", "gpu", "gpus_per_instance", "usd_per_gpu_hour", "pricing", "as_of", "source"})
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
#: a per-GPU price above this is almost certainly a per-instance price
MAX_USD_PER_GPU_HOUR = 100.0
#: below this a "price" is a typo or a unit mix-up (the cheapest marketplace GPUs rent for cents)
MIN_USD_PER_GPU_HOUR = 0.001
#: validation limits: the fastest instance networks today are 3,200-6,400 Gbit/s
MAX_INTER_NODE_GBPS = 1e5
#: billing increments longer than a year are not per-use prices
MAX_BILLING_GRANULARITY_S = 366 * 86400
#: host RAM (GiB) / local disk (GB) of one instance beyond this is a unit mix-up (largest today: ~32 TiB RAM)
MAX_HOST_GB = 1e6
_BUNDLED_NAME = "ftplan/catalog/data/offers.csv"


@dataclass(frozen=True)
class Offer:
    """One price for one instance shape. ``None`` marks an unknown optional value."""

    provider: str
    sku: str
    gpu: str
    gpus_per_instance: int
    usd_per_gpu_hour: float
    pricing: str
    region: str | None
    inter_node_network: str | None
    inter_node_gbps: float | None
    billing_granularity_s: int | None
    as_of: _dt.date
    source: str
    notes: str | None
    host_ram_gib: float | None = None  # host RAM of one instance (GiB); None = unknown
    local_disk_gb: float | None = None  # local disk of one instance (GB); None = unknown
    host_source: str | None = None

    @property
    def usd_per_instance_hour(self) -> float:
        return self.usd_per_gpu_hour * self.gpus_per_instance

    @property
    def multi_node(self) -> bool | None:
        """Whether instances can be joined over a network: None if unknown."""
        if self.inter_node_gbps is None:
            return None
        return self.inter_node_gbps > 0

    @property
    def key(self) -> tuple[str, str, str, int, str, str]:
        """Identity of the offer apart from its date and price."""
        return (
            self.provider.casefold(),
            self.sku.casefold(),
            self.gpu,
            self.gpus_per_instance,
            self.pricing,
            (self.region or "").casefold(),
        )

    def age_days(self, today: _dt.date | None = None) -> int:
        """Days since the price was observed (negative if ``as_of`` is after ``today``)."""
        return ((today or _dt.date.today()) - self.as_of).days

    def billed_hours(self, runtime_hours: float) -> float:
        """Runtime rounded up to the billing increment (exact if the increment is unknown)."""
        if runtime_hours < 0:
            raise ConfigError(f"runtime must be >= 0 hours, got {runtime_hours}")
        if not self.billing_granularity_s:
            return runtime_hours
        step = self.billing_granularity_s / 3600.0
        return math.ceil(runtime_hours / step - 1e-9) * step

    def cost_usd(self, runtime_hours: float, instances: int = 1) -> float:
        """USD for ``instances`` instances running ``runtime_hours`` each, billing rounding applied."""
        if instances < 1:
            raise ConfigError(f"instances must be >= 1, got {instances}")
        return self.billed_hours(runtime_hours) * self.usd_per_instance_hour * instances


# --------------------------------------------------------------------------------------------
# loading


def _parse_date(display: str, line: int, field: str, value: str, today: _dt.date | None = None) -> _dt.date:
    if not _DATE.match(value):
        raise field_error(display, line, field, f"not a date: {value[:40]!r}", "use YYYY-MM-DD")
    try:
        d = _dt.date.fromisoformat(value)
    except ValueError:
        raise field_error(display, line, field, f"not a valid date: {value!r}", "use YYYY-MM-DD") from None
    if d.year < 2000:
        raise field_error(display, line, field, f"implausible date {value}")
    if d > (today or _dt.date.today()) + _dt.timedelta(days=1):
        raise field_error(display, line, field, f"{value} is in the future", "give the date the price was observed")
    return d


def _parse_offers(text: str, display: str, gpus: Mapping[str, GpuSpec]) -> list[Offer]:
    """Every row of an offers CSV, validated; all problems of the file are reported together."""
    offers: list[Offer] = []
    seen: dict[tuple, int] = {}
    errors: list[CatalogError] = []
    index = gpu_name_index(gpus)  # built once: resolving 200k rows must not rebuild it per row
    today = _dt.date.today()
    dates: dict[str, _dt.date] = {}
    slugs: dict[str, str] = {}
    for line, row in read_csv_rows(text, display, OFFER_COLUMNS, _REQUIRED, errors):
        try:
            offer = _parse_offer_row(display, line, row, gpus, index, today, dates, slugs)
        except CatalogError as exc:
            errors.append(exc)
            continue
        ident = (*offer.key, offer.as_of)
        if ident in seen:
            errors.append(field_error(
                display, line, "as_of", f"duplicate of the offer on line {seen[ident]} (same key and date)"
            ))
            continue
        seen[ident] = line
        offers.append(offer)
    raise_collected(display, errors)
    return offers


def _parse_offer_row(display: str, line: int, row: dict[str, str], gpus: Mapping[str, GpuSpec],
                     index: Mapping[str, str], today: _dt.date, dates: dict[str, _dt.date],
                     slugs: dict[str, str]) -> Offer:
    for field in _REQUIRED:
        if not row[field]:
            raise field_error(display, line, field, "required value is blank")
    gpu = slugs.get(row["gpu"])
    if gpu is None:
        try:
            gpu = resolve_gpu_name(row["gpu"], gpus, index=index)
        except NotFoundError as exc:
            raise field_error(display, line, "gpu", exc.message, exc.hint) from None
        slugs[row["gpu"]] = gpu
    spec = gpus[gpu]
    n = parse_int(display, line, "gpus_per_instance", row["gpus_per_instance"])
    if n > spec.max_gpus_per_node:
        raise field_error(
            display, line, "gpus_per_instance", f"{n} exceeds {gpu} max_gpus_per_node {spec.max_gpus_per_node}"
        )
    price = parse_float(display, line, "usd_per_gpu_hour", row["usd_per_gpu_hour"])
    if price > MAX_USD_PER_GPU_HOUR:
        raise field_error(
            display, line, "usd_per_gpu_hour", f"{price:g} USD per GPU-hour is implausible",
            "divide an instance price by gpus_per_instance"
        )
    if price < MIN_USD_PER_GPU_HOUR:
        raise field_error(display, line, "usd_per_gpu_hour", f"{price:g} USD per GPU-hour is implausibly low",
                          f"prices are USD per GPU per hour (at least {MIN_USD_PER_GPU_HOUR:g})")
    pricing = row["pricing"].lower()
    if pricing not in PRICING:
        raise field_error(display, line, "pricing", f"unknown pricing {row['pricing'][:40]!r}",
                          f"use one of {', '.join(PRICING)}")
    gbps = (
        parse_float(display, line, "inter_node_gbps", row["inter_node_gbps"], strict=False,
                    maximum=MAX_INTER_NODE_GBPS)
        if row["inter_node_gbps"]
        else None
    )
    billing = (
        parse_int(display, line, "billing_granularity_s", row["billing_granularity_s"],
                  maximum=MAX_BILLING_GRANULARITY_S)
        if row["billing_granularity_s"]
        else None
    )
    as_of = dates.get(row["as_of"])
    if as_of is None:
        as_of = dates[row["as_of"]] = _parse_date(display, line, "as_of", row["as_of"], today)
    host = {}
    for col in ("host_ram_gib", "local_disk_gb"):
        if row.get(col):
            host[col] = parse_float(display, line, col, row[col], maximum=MAX_HOST_GB)
    if host and not row.get("host_source"):
        raise field_error(display, line, "host_source", "required with host_ram_gib / local_disk_gb",
                          "say where the instance's RAM / disk figures come from")
    return Offer(
        provider=row["provider"],
        sku=row["sku"],
        gpu=gpu,
        gpus_per_instance=n,
        usd_per_gpu_hour=price,
        pricing=pricing,
        region=row["region"] or None,
        inter_node_network=row["inter_node_network"] or None,
        inter_node_gbps=gbps,
        billing_granularity_s=billing,
        as_of=as_of,
        source=row["source"],
        notes=row["notes"] or None,
        host_source=row.get("host_source") or None,
        **host,
    )


@functools.lru_cache(maxsize=1)
def _bundled() -> tuple[Offer, ...]:
    text = resources.files("ftplan.catalog").joinpath("data", "offers.csv").read_text(encoding="utf-8")
    return tuple(_parse_offers(text, _BUNDLED_NAME, load_gpus()))


def latest_offers(offers: Iterable[Offer]) -> list[Offer]:
    """Keep the newest offer per :attr:`Offer.key`; on equal dates the later one wins.

    Order follows the first appearance of each key.
    """
    best: dict[tuple, Offer] = {}
    for offer in offers:
        kept = best.get(offer.key)
        if kept is None or offer.as_of >= kept.as_of:
            best[offer.key] = offer
    return list(best.values())


def load_offers(
    paths: Sequence[str | Path] | str | Path | None = None,
    include_bundled: bool = True,
    *,
    gpus: Mapping[str, GpuSpec] | None = None,
    latest_only: bool = True,
) -> list[Offer]:
    """Offers from the bundled catalog and/or user CSV files, every row validated.

    ``gpus`` is the GPU catalog to validate against (default: the bundled one; pass it when
    the bundled offers should be checked against a custom GPU file). With ``latest_only`` only
    the newest price per offer key is returned. Raises :class:`CatalogError` naming file, line
    and field.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    offers: list[Offer] = []
    if include_bundled:
        if gpus is None:
            offers.extend(_bundled())
        else:
            text = resources.files("ftplan.catalog").joinpath("data", "offers.csv").read_text(encoding="utf-8")
            offers.extend(_parse_offers(text, _BUNDLED_NAME, gpus))
    catalog = gpus if gpus is not None else load_gpus()
    for path in paths or ():
        offers.extend(_parse_offers(_read_text(path), str(path), catalog))
    return latest_offers(offers) if latest_only else offers


# --------------------------------------------------------------------------------------------
# queries


def _as_set(value: str | Iterable[str] | None) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    return list(value)


def filter_offers(
    offers: Iterable[Offer],
    providers: str | Iterable[str] | None = None,
    gpus: str | Iterable[str] | None = None,
    pricing: str | Iterable[str] | None = None,
) -> list[Offer]:
    """Offers matching every given criterion (``None`` = any). Matching is case-insensitive.

    ``gpus`` accepts slugs, aliases or display names (unknown names raise NotFoundError);
    ``pricing`` values must be in :data:`PRICING` (else ConfigError).
    """
    provider_set = {p.casefold() for p in _as_set(providers)} if providers is not None else None
    gpu_set = {resolve_gpu_name(g) for g in _as_set(gpus)} if gpus is not None else None
    pricing_set = None
    if pricing is not None:
        pricing_set = {p.lower() for p in _as_set(pricing)}
        unknown = sorted(pricing_set - set(PRICING))
        if unknown:
            raise ConfigError(f"unknown pricing {', '.join(unknown)}", f"use one of {', '.join(PRICING)}")
    return [
        o
        for o in offers
        if (provider_set is None or o.provider.casefold() in provider_set)
        and (gpu_set is None or o.gpu in gpu_set)
        and (pricing_set is None or o.pricing in pricing_set)
    ]


def is_stale(offer: Offer, today: _dt.date | None = None, max_age_days: int = 120) -> bool:
    """True when the price is older than ``max_age_days`` on ``today`` (default: the real today)."""
    return offer.age_days(today) > max_age_days


# --------------------------------------------------------------------------------------------
# SkyPilot catalog import

#: SkyPilot ``AcceleratorName`` -> catalog slug (defaults; see _PROVIDER_OVERRIDES and
#: variant hints from the instance type). Names are matched case-insensitively.
#: Deliberately absent: ``RTX6000`` (Turing Quadro RTX 6000, not the RTX 6000 Ada), TPUs,
#: Trainium, Gaudi, A40/A6000/V100/T4/L40 and other GPUs not in the catalog.
SKYPILOT_ACCELERATORS: dict[str, str] = {
    "A10": "a10",
    "A10G": "a10g",
    "A100": "a100-40gb-sxm",
    "A100-80GB": "a100-80gb-sxm",
    "A100-80GB-SXM": "a100-80gb-sxm",
    "B200": "b200",
    "B300": "b300",
    "GB200": "gb200",
    "GH200": "gh200",
    "H100": "h100-sxm",
    "H100-MEGA": "h100-sxm",
    "H100-NVL": "h100-nvl",
    "H100-NVLINK": "h100-sxm",
    "H100-SXM": "h100-sxm",
    "H200": "h200",
    "H200-SXM": "h200",
    "L4": "l4",
    "L40S": "l40s",
    "MI300X": "mi300x",
    "MI325X": "mi325x",
    "MI355X": "mi355x",
    "RTX3090": "rtx-3090",
    "RTX4090": "rtx-4090",
    "RTX5090": "rtx-5090",
    "RTX6000-Ada": "rtx-6000-ada",
    "RTX6000Ada": "rtx-6000-ada",
    "RTXPRO6000": "rtx-pro-6000",
    "RTXPRO6000-WK": "rtx-pro-6000",
    "RTXPRO6000WS": "rtx-pro-6000",
    "RTX-PRO-6000": "rtx-pro-6000",
    "RTX PRO 6000 96GB": "rtx-pro-6000",
}

#: per-provider meaning of ambiguous names (provider = catalog directory, lower case)
_PROVIDER_OVERRIDES: dict[str, dict[str, str]] = {
    # RunPod lists H100 PCIe as "H100" and A100 80GB PCIe as "A100-80GB" (SXM have own names)
    "runpod": {"H100": "h100-pcie", "A100-80GB": "a100-80gb-pcie"},
}

#: per-provider instance-type rules: (regex on the lower-cased instance type, slug remapping)
_PROVIDER_ITYPE_RULES: dict[str, list[tuple[str, dict[str, str]]]] = {
    # Azure NC-series H100 v5 / A100 v4 are H100 NVL / A100 80GB PCIe; ND-series are SXM
    "azure": [(r"^standard_nc", {"h100-sxm": "h100-nvl", "a100-80gb-sxm": "a100-80gb-pcie"})],
}

# variant families: instance-type hints switch between these
_VARIANTS = {
    "h100-sxm": {"pcie": "h100-pcie", "nvl": "h100-nvl", "sxm": "h100-sxm"},
    "h100-pcie": {"pcie": "h100-pcie", "nvl": "h100-nvl", "sxm": "h100-sxm"},
    "a100-40gb-sxm": {"pcie": "a100-40gb-pcie", "sxm": "a100-40gb-sxm"},
    "a100-80gb-sxm": {"pcie": "a100-80gb-pcie", "sxm": "a100-80gb-sxm"},
    "a100-80gb-pcie": {"pcie": "a100-80gb-pcie", "sxm": "a100-80gb-sxm"},
}
_AMBIGUOUS_DEFAULTS = {"h100-sxm", "a100-40gb-sxm", "a100-80gb-sxm"}


def _norm_accel(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip()).casefold()


class SkyPilotImport(list):
    """The offers imported from a SkyPilot ``vms.csv`` (a list of :class:`Offer`).

    ``skipped`` counts rows not imported by reason (``no_accelerator``, ``unknown_accelerator``,
    ``fractional_count``, ``no_price``, ``accelerator_only_price``, ``gpu_count_exceeds_node``,
    ``implausible_price`` (per GPU-hour outside [MIN_USD_PER_GPU_HOUR, MAX_USD_PER_GPU_HOUR]), ``duplicate``); ``unknown_accelerators`` counts the unmapped ``AcceleratorName`` values;
    ``rows_read`` is the number of data rows in the file.
    """

    def __init__(self, offers: Iterable[Offer] = ()) -> None:
        super().__init__(offers)
        self.skipped: Counter[str] = Counter()
        self.unknown_accelerators: Counter[str] = Counter()
        self.rows_read = 0


def _parse_price(value: str | None) -> float | None:
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        x = float(value)
    except ValueError:
        return None
    if not math.isfinite(x) or x <= 0:
        return None
    return x


def _memory_hint_mib(gpu_info: str | None) -> int | None:
    """MiB per GPU from SkyPilot's GpuInfo dict text, if present."""
    if not gpu_info or "SizeInMiB" not in gpu_info:
        return None
    try:
        info = ast.literal_eval(gpu_info)
        return int(info["Gpus"][0]["MemoryInfo"]["SizeInMiB"])
    except (ValueError, SyntaxError, KeyError, IndexError, TypeError):
        return None


def _resolve_skypilot(
    accel: str, instance_type: str, provider: str, mapping: Mapping[str, str], gpu_info: str | None
) -> tuple[str | None, str | None]:
    """(slug, note) for a SkyPilot accelerator row; slug None if unknown."""
    key = _norm_accel(accel)
    overrides = {_norm_accel(k): v for k, v in _PROVIDER_OVERRIDES.get(provider, {}).items()}
    slug = overrides.get(key) or mapping.get(key)
    if slug is None:
        return None, None
    note = None
    for pattern, remap in _PROVIDER_ITYPE_RULES.get(provider, []):
        if re.search(pattern, instance_type.casefold()) and slug in remap:
            return remap[slug], None
    family = _VARIANTS.get(slug)
    if family:
        itype = instance_type.casefold()
        hinted = None
        for hint in ("nvl", "pcie", "sxm"):
            if hint in family and re.search(rf"(^|[^a-z]){hint}", itype):
                hinted = family[hint]
                break
        if hinted:
            slug = hinted
        elif slug in _AMBIGUOUS_DEFAULTS and key not in overrides and not key.endswith("-sxm"):
            note = f"SkyPilot name {accel!r} does not say SXM/PCIe; {slug} assumed"
    # A100 40 vs 80 GB: trust the memory reported in GpuInfo when it disagrees
    mib = _memory_hint_mib(gpu_info)
    if mib is not None and slug.startswith("a100-"):
        want = "80gb" if mib >= 60000 else "40gb"
        slug = re.sub(r"a100-(40|80)gb", f"a100-{want}", slug)
    return slug, note


def import_skypilot_catalog(
    path: str | Path,
    *,
    provider: str | None = None,
    as_of: _dt.date | str | None = None,
    gpus: Mapping[str, GpuSpec] | None = None,
    accelerator_map: Mapping[str, str] | None = None,
) -> SkyPilotImport:
    """Offers from a SkyPilot catalog ``vms.csv`` (skypilot-org/skypilot-catalog ``catalogs/vN/<cloud>/vms.csv``).

    Columns are read by name, so every cloud's column order works; needed are
    ``InstanceType``, ``AcceleratorName``, ``AcceleratorCount`` and ``Price`` (USD per instance
    hour); ``SpotPrice``, ``Region``, ``AvailabilityZone``, ``GpuInfo``, ``vCPUs`` and
    ``MemoryGiB`` are used when present. Each row gives an on-demand offer (``Price``) and, when
    ``SpotPrice`` is set, a spot offer. Rows without an accelerator (CPU hosts, GCP host-only
    rows), with an accelerator not in the catalog, with a fractional GPU count, or without a
    price are skipped and counted in ``result.skipped``. GCP accelerator-only rows (blank
    ``InstanceType``: GPU price without the host VM) are skipped too, since they understate
    cost. Rows that differ only by availability zone are merged.

    ``provider`` defaults to the catalog directory name (``.../lambda/vms.csv`` -> ``lambda``).
    ``as_of`` defaults to the file's modification date (SkyPilot catalogs carry no date).
    ``accelerator_map`` adds or overrides ``AcceleratorName -> slug`` entries.
    """
    path = Path(path)
    text = _read_text(path)
    catalog = gpus if gpus is not None else load_gpus()
    prov = (provider or path.parent.name or "skypilot").strip()
    prov_key = prov.casefold()
    if as_of is None:
        try:
            observed = _dt.date.fromtimestamp(path.stat().st_mtime)
        except OSError as exc:
            raise CatalogError(f"{path}: cannot stat ({exc})") from None
        date_note = "as_of = file modification date"
    elif isinstance(as_of, str):
        try:
            observed = _dt.date.fromisoformat(as_of.strip())
        except ValueError:
            raise ConfigError(f"as_of {as_of!r} is not a date", "use YYYY-MM-DD") from None
        date_note = None
    else:
        observed = as_of
        date_note = None

    mapping = {_norm_accel(k): v for k, v in SKYPILOT_ACCELERATORS.items()}
    for k, v in (accelerator_map or {}).items():
        mapping[_norm_accel(k)] = resolve_gpu_name(v, catalog)
    for slug in set(mapping.values()):
        if slug not in catalog:  # a custom GPU catalog may lack some defaults
            mapping = {k: v for k, v in mapping.items() if v in catalog}
            break

    lines = text.splitlines()
    reader = csv.DictReader(lines, strict=True)
    header = [h.strip() for h in (reader.fieldnames or [])]
    needed = ["InstanceType", "AcceleratorName", "AcceleratorCount", "Price"]
    missing = [c for c in needed if c not in header]
    if missing:
        raise CatalogError(
            f"{path}: line 1: missing SkyPilot column(s) {', '.join(missing)}",
            "expected a SkyPilot catalog vms.csv (InstanceType, AcceleratorName, AcceleratorCount, Price, ...)",
        )

    result = SkyPilotImport()
    seen: set[tuple] = set()
    source = f"SkyPilot catalog {path.parent.name}/{path.name} (skypilot-org/skypilot-catalog format)"
    try:
        for raw in reader:
            result.rows_read += 1
            row = {(k or "").strip(): (v or "").strip() for k, v in raw.items() if k is not None}
            accel = row.get("AcceleratorName", "")
            instance_type = row.get("InstanceType", "")
            if not accel:
                result.skipped["no_accelerator"] += 1
                continue
            slug, variant_note = _resolve_skypilot(accel, instance_type, prov_key, mapping, row.get("GpuInfo"))
            if slug is None or slug not in catalog:
                result.skipped["unknown_accelerator"] += 1
                result.unknown_accelerators[accel] += 1
                continue
            if not instance_type:
                result.skipped["accelerator_only_price"] += 1
                continue
            try:
                count_f = float(row.get("AcceleratorCount", ""))
            except ValueError:
                result.skipped["fractional_count"] += 1
                continue
            if not math.isfinite(count_f) or count_f < 1 or count_f != int(count_f):
                result.skipped["fractional_count"] += 1
                continue
            count = int(count_f)
            if count > catalog[slug].max_gpus_per_node:
                result.skipped["gpu_count_exceeds_node"] += 1
                continue
            region = row.get("Region") or None
            notes = [n for n in (variant_note, date_note) if n]
            shape = ", ".join(
                f"{v} {label}" for label, v in (("vCPU", row.get("vCPUs")), ("GiB RAM", row.get("MemoryGiB"))) if v
            )
            if shape:
                notes.append(shape)
            priced = added = implausible = 0
            for pricing, price in (("on-demand", _parse_price(row.get("Price"))), ("spot", _parse_price(row.get("SpotPrice")))):
                if price is None:
                    continue
                per_gpu = price / count
                if not MIN_USD_PER_GPU_HOUR <= per_gpu <= MAX_USD_PER_GPU_HOUR:
                    implausible += 1
                    continue
                priced += 1
                ident = (prov_key, instance_type.casefold(), slug, count, pricing, (region or "").casefold(), round(per_gpu, 6))
                if ident in seen:  # same shape, region and price in another availability zone
                    continue
                seen.add(ident)
                added += 1
                result.append(
                    Offer(
                        provider=prov,
                        sku=instance_type,
                        gpu=slug,
                        gpus_per_instance=count,
                        usd_per_gpu_hour=per_gpu,
                        pricing=pricing,
                        region=region,
                        inter_node_network=None,
                        inter_node_gbps=None,
                        billing_granularity_s=None,
                        as_of=observed,
                        source=source,
                        notes="; ".join(notes) or None,
                    )
                )
            if implausible and not priced:
                result.skipped["implausible_price"] += 1
            elif not priced:
                result.skipped["no_price"] += 1
            elif not added:
                result.skipped["duplicate"] += 1
    except csv.Error as exc:
        raise CatalogError(f"{path}: line {reader.line_num}: malformed CSV ({exc})") from None
    return result
