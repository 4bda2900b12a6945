"""The GPU catalog: one validated :class:`GpuSpec` per accelerator.

The bundled catalog is ``ftplan/catalog/data/gpus.csv``; a user file with the same columns can
be loaded with ``load_gpus(path)``. Nothing is read at import time; the bundled file is parsed
once, on first use, and cached.

Column conventions (see ``data/README.md`` for the sources and derivations):

* Every throughput is a DENSE peak in TFLOPS (2:4-sparsity figures halved). ``bf16``/``fp16``
  are the FP32-accumulate tensor rates (the ones training uses; GeForce cards run them at half
  the FP16-accumulate rate). A blank cell means the hardware lacks the format or no source gave
  a figure; the field is then ``None``.
* ``memory_bytes`` is the total the driver reports (``nvidia-smi`` "MiB" total x 2**20, or the
  ``rocm-smi`` byte count); ``memory_bytes_basis`` says which, or ``nominal`` where no reading
  was found. ``torch.cuda.get_device_properties(0).total_memory`` is usually a few hundred MiB
  lower than the nvidia-smi total, so memory planners should keep a reserve.
* ``intra_node_bw_gbps`` is the per-GPU, per-direction GB/s a collective can use among the
  ``scale_up_domain_gpus`` GPUs that share the fast fabric (NVLink/NVSwitch/XGMI, or the PCIe
  root for PCIe-only cards). Beyond that domain traffic falls back to PCIe
  (:meth:`GpuSpec.intra_node_bw_for`). GB200 NVL72 has a 72-GPU domain over 4-GPU trays.
* ``supports_flash_attention`` means a fused flash-style attention kernel (FlashAttention 2/3/4
  or the ROCm CK/Triton port) is usable for training, so attention activations grow linearly
  with sequence length.
"""

from __future__ import annotations

import csv
import functools
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import CatalogError, ConfigError, NotFoundError, Problem, did_you_mean
from ..inputs import bad_characters

__all__ = [
    "GpuSpec",
    "GPU_COLUMNS",
    "ARCHS",
    "load_gpus",
    "get_gpu",
    "resolve_gpu_name",
    "normalize_gpu_name",
    "gpu_name_index",
]

#: architectures the catalog knows
ARCHS = frozenset({"ampere", "ada", "hopper", "blackwell", "cdna3", "cdna4"})
VENDORS = frozenset({"nvidia", "amd"})
MEMORY_BASES = frozenset({"nvidia-smi", "rocm-smi", "torch", "nominal"})
FP4_FORMATS = frozenset({"nvfp4", "mxfp4"})

#: PCIe x16 bandwidth per direction, GB/s, by generation (128b/130b encoding from gen 3;
#: gen 6 uses FLIT mode, 256 GB/s bidirectional).
PCIE_X16_GBPS = {3: 15.75, 4: 31.5, 5: 63.0, 6: 126.0}

GPU_COLUMNS = (
    "name",
    "display_name",
    "aliases",
    "vendor",
    "arch",
    "form_factor",
    "compute_capability",
    "memory_gb_nominal",
    "memory_bytes",
    "memory_bytes_basis",
    "mem_bw_tbps",
    "bf16_tflops",
    "fp16_tflops",
    "tf32_tflops",
    "fp32_tflops",
    "fp8_tflops",
    "fp4_tflops",
    "fp4_formats",
    "tdp_w",
    "intra_node_link",
    "intra_node_bw_gbps",
    "scale_up_domain_gpus",
    "pcie_gen",
    "max_gpus_per_node",
    "supports_bitsandbytes",
    "supports_flash_attention",
    "supports_fp8_training",
    "supports_fp4_training",
    "source",
    "notes",
)

_REQUIRED = frozenset(
    {
        "name",
        "display_name",
        "vendor",
        "arch",
        "compute_capability",
        "memory_gb_nominal",
        "memory_bytes",
        "memory_bytes_basis",
        "mem_bw_tbps",
        "bf16_tflops",
        "intra_node_link",
        "intra_node_bw_gbps",
        "scale_up_domain_gpus",
        "pcie_gen",
        "max_gpus_per_node",
        "supports_bitsandbytes",
        "supports_flash_attention",
        "supports_fp8_training",
        "supports_fp4_training",
        "source",
    }
)
_FLOAT_FIELDS = (
    "memory_gb_nominal",
    "mem_bw_tbps",
    "bf16_tflops",
    "fp16_tflops",
    "tf32_tflops",
    "fp32_tflops",
    "fp8_tflops",
    "fp4_tflops",
    "tdp_w",
    "intra_node_bw_gbps",
)
_INT_FIELDS = ("memory_bytes", "scale_up_domain_gpus", "pcie_gen", "max_gpus_per_node")
_BOOL_FIELDS = (
    "supports_bitsandbytes",
    "supports_flash_attention",
    "supports_fp8_training",
    "supports_fp4_training",
)
#: sanity bounds (validation limits, not data): far above any accelerator (today's largest: ~288 GB,
#: ~8 TB/s, ~15 dense fp4 PFLOPS, ~1.4 kW, 72-GPU NVLink domains), so that a typo such as a
#: value in bytes instead of GB cannot turn into absurd plans or overflowing arithmetic
_MAXIMA: dict[str, float] = {
    "memory_gb_nominal": 1e5, "mem_bw_tbps": 1e3, "bf16_tflops": 1e6, "fp16_tflops": 1e6, "tf32_tflops": 1e6,
    "fp32_tflops": 1e6, "fp8_tflops": 1e6, "fp4_tflops": 1e6, "tdp_w": 1e5, "intra_node_bw_gbps": 1e5,
    "memory_bytes": 2**50, "scale_up_domain_gpus": 1 << 16, "pcie_gen": 99, "max_gpus_per_node": 1024,
}
_TRUE = frozenset({"true", "yes", "1", "y"})
_FALSE = frozenset({"false", "no", "0", "n"})
_SLUG = re.compile(r"^[a-z0-9][a-z0-9.\-]*$")
_CC = re.compile(r"^(\d{1,2}\.\d|gfx[0-9a-f]{3,4})$")

# dtype name -> (column, required fp4 format or None)
_DTYPES: dict[str, tuple[str, str | None]] = {
    "bf16": ("bf16_tflops", None),
    "bfloat16": ("bf16_tflops", None),
    "fp16": ("fp16_tflops", None),
    "float16": ("fp16_tflops", None),
    "half": ("fp16_tflops", None),
    "fp32": ("fp32_tflops", None),
    "float32": ("fp32_tflops", None),
    "tf32": ("tf32_tflops", None),
    "fp8": ("fp8_tflops", None),
    "fp8_e4m3": ("fp8_tflops", None),
    "fp8_e5m2": ("fp8_tflops", None),
    "float8": ("fp8_tflops", None),
    "fp4": ("fp4_tflops", None),
    "nvfp4": ("fp4_tflops", "nvfp4"),
    "mxfp4": ("fp4_tflops", "mxfp4"),
}

_BUNDLED_NAME = "ftplan/catalog/data/gpus.csv"


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator. Throughputs are dense peak TFLOPS; ``None`` = format absent/unknown."""

    name: str
    display_name: str
    aliases: tuple[str, ...]
    vendor: str
    arch: str
    form_factor: str | None
    compute_capability: str
    memory_gb_nominal: float
    memory_bytes: int
    memory_bytes_basis: str
    mem_bw_tbps: float
    bf16_tflops: float
    fp16_tflops: float | None
    tf32_tflops: float | None
    fp32_tflops: float | None
    fp8_tflops: float | None
    fp4_tflops: float | None
    fp4_formats: tuple[str, ...]
    tdp_w: float | None
    intra_node_link: str
    intra_node_bw_gbps: float
    scale_up_domain_gpus: int
    pcie_gen: int
    max_gpus_per_node: int
    supports_bitsandbytes: bool
    supports_flash_attention: bool
    supports_fp8_training: bool
    supports_fp4_training: bool
    source: str
    notes: str | None

    def peak_tflops(self, dtype: str) -> float | None:
        """Dense peak TFLOPS for a compute dtype, or ``None`` if the GPU lacks it.

        ``dtype`` is one of bf16, fp16, fp32, tf32, fp8, fp4, nvfp4, mxfp4 (torch-style names
        such as ``bfloat16`` and ``float16`` are accepted). ``nvfp4``/``mxfp4`` return the FP4
        rate only when the GPU supports that block-scaled format.
        """
        key = dtype.strip().lower() if isinstance(dtype, str) else ""
        try:
            column, fmt = _DTYPES[key]
        except KeyError:
            raise ConfigError(
                f"unknown compute dtype {dtype!r}",
                "use one of bf16, fp16, fp32, tf32, fp8, fp4, nvfp4, mxfp4",
            ) from None
        if fmt is not None and fmt not in self.fp4_formats:
            return None
        return getattr(self, column)

    @property
    def memory_gib(self) -> float:
        """Driver-reported memory in GiB."""
        return self.memory_bytes / 2**30

    @property
    def mem_bw_bytes_per_s(self) -> float:
        return self.mem_bw_tbps * 1e12

    @property
    def pcie_bw_gbps(self) -> float:
        """PCIe x16 bandwidth per direction (GB/s) for this card's PCIe generation."""
        return PCIE_X16_GBPS.get(self.pcie_gen, PCIE_X16_GBPS[max(PCIE_X16_GBPS)])

    def intra_node_bw_for(self, gpus: int) -> float:
        """Per-GPU per-direction GB/s for a collective over ``gpus`` GPUs of one node/domain.

        Within the scale-up domain this is ``intra_node_bw_gbps``; a larger group is limited by
        its slowest hop, the PCIe link (e.g. H100 NVL pairs joined over PCIe).
        """
        if gpus <= self.scale_up_domain_gpus:
            return self.intra_node_bw_gbps
        return min(self.intra_node_bw_gbps, self.pcie_bw_gbps)

    @property
    def is_nvidia(self) -> bool:
        return self.vendor == "nvidia"

    @property
    def is_amd(self) -> bool:
        return self.vendor == "amd"


# --------------------------------------------------------------------------------------------
# CSV reading shared with offers.py

#: largest catalog file read (a SkyPilot vms.csv of a big cloud is tens of MB)
MAX_CATALOG_BYTES = 256 * 2**20
#: errors shown in one message; the rest are counted (CatalogError.problems holds all of them)
MAX_SHOWN_ERRORS = 12


def read_csv_rows(
    text: str, display: str, columns: Iterable[str], required: Iterable[str],
    errors: list[CatalogError] | None = None,
) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield ``(line_number, row)`` for each data row of a catalog CSV, header checked.

    Unknown extra columns are allowed and ignored. A missing required column is an error; a
    missing optional column reads as blank. Blank lines and lines starting with '#' are skipped.
    Each line is one row: a quoted field may not span lines, and an unterminated quote, text after
    a closing quote, a NUL byte or a wrong number of fields is an error of that line. With
    ``errors`` such rows are skipped and their errors appended there (so that every problem of a
    file can be reported at once); without, the first one is raised.
    """
    def fail(exc: CatalogError) -> None:
        if errors is None:
            raise exc
        errors.append(exc)

    header: list[str] | None = None
    width = 0
    absent: list[str] = []
    for n, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not (line.isascii() and line.isprintable()):  # the fast path: plain ASCII text
            bad = bad_characters(line)
            if bad:
                exc = CatalogError(f"{display}: line {n}: control or invisible characters "
                                   f"({', '.join(bad[:3])})", "remove them (tabs included)")
                if header is None:
                    raise exc
                fail(exc)
                continue
        if '"' in line:
            try:
                values = next(csv.reader([line], strict=True))
            except csv.Error as e:
                exc = CatalogError(f"{display}: line {n}: malformed CSV ({e})",
                                   "close every quote on its line; double a quote inside a quoted field")
                if header is None:
                    raise exc from None
                fail(exc)
                continue
        else:
            values = line.split(",")
        if header is None:
            header = [h.strip() for h in values]
            dupes = sorted({h for h in header if header.count(h) > 1})
            if dupes:
                raise CatalogError(f"{display}: line {n}: duplicate column(s) {', '.join(dupes)}")
            known = list(columns)
            req = set(required)
            missing = [c for c in known if c in req and c not in header]
            if missing:
                raise CatalogError(
                    f"{display}: line {n}: missing required column(s) {', '.join(missing)}",
                    f"expected columns: {', '.join(known)}",
                )
            absent = [c for c in known if c not in header]  # optional columns may be left out
            width = len(header)
            continue
        if len(values) != width:
            fail(CatalogError(f"{display}: line {n}: expected {width} fields, found {len(values)}",
                              "quote fields that contain commas"))
            continue
        row = dict(zip(header, map(str.strip, values)))
        for c in absent:
            row[c] = ""
        yield n, row
    if header is None:
        raise CatalogError(f"{display}: file is empty", "expected a CSV header line")


def raise_collected(display: str, errors: list[CatalogError]) -> None:
    """Raise the errors of a file: one as it is, several as one ``CatalogError`` listing them.

    The first :data:`MAX_SHOWN_ERRORS` are the error's ``problems`` (a last one counts the rest);
    ``all_problems`` holds every one of them.
    """
    if not errors:
        return
    if len(errors) == 1:
        raise errors[0]
    prefix = f"{display}: "
    every: list[Problem] = []
    for e in errors:
        for p in e.problems:
            msg = p.message[len(prefix):] if p.message.startswith(prefix) else p.message
            every.append(Problem(p.field, msg, p.hint))
    shown = list(every[:MAX_SHOWN_ERRORS])
    shown[0] = Problem(shown[0].field, f"{display}: {len(every)} problems: {shown[0].message}", shown[0].hint)
    more = len(every) - MAX_SHOWN_ERRORS
    if more > 0:
        shown.append(Problem(None, f"and {more} more", "fix the lines above and load the file again"))
    exc = CatalogError(problems=shown)
    exc.all_problems = tuple(every)  # type: ignore[attr-defined]
    raise exc


def field_error(display: str, line: int, field: str, problem: str, hint: str | None = None) -> CatalogError:
    return CatalogError(f"{display}: line {line}: {field}: {problem}", hint)


def parse_float(display: str, line: int, field: str, value: str, *, minimum: float = 0.0, strict: bool = True,
                maximum: float | None = None) -> float:
    try:
        x = float(value)
    except ValueError:
        raise field_error(display, line, field, f"not a number: {value[:40]!r}") from None
    if not math.isfinite(x):
        raise field_error(display, line, field, f"not a finite number: {value[:40]!r}")
    if (strict and x <= minimum) or (not strict and x < minimum):
        op = ">" if strict else ">="
        raise field_error(display, line, field, f"must be {op} {minimum:g}, got {value[:40]}")
    if maximum is not None and x > maximum:
        raise field_error(display, line, field, f"{value[:40]} is implausibly large (at most {maximum:g})")
    return x


def parse_int(display: str, line: int, field: str, value: str, *, minimum: int = 1,
              maximum: int | None = None) -> int:
    v = value.strip()
    if not (v.isascii() and (v.isdigit() or (v[:1] in "+-" and v[1:].isdigit()))) or len(v) > 30:
        raise field_error(display, line, field, f"not an integer: {value[:40]!r}")
    x = int(v)
    if x < minimum:
        raise field_error(display, line, field, f"must be >= {minimum}, got {value}")
    if maximum is not None and x > maximum:
        raise field_error(display, line, field, f"{value} is implausibly large (at most {maximum:,})")
    return x


def parse_bool(display: str, line: int, field: str, value: str) -> bool:
    v = value.lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise field_error(display, line, field, f"not a boolean: {value[:40]!r}", "use true or false")


# --------------------------------------------------------------------------------------------
# names


def normalize_gpu_name(name: str) -> str:
    """Lower-case, with spaces/underscores/slashes folded to single dashes."""
    s = re.sub(r"[\s_/]+", "-", name.strip().lower())
    s = re.sub(r"-{2,}", "-", s)
    return s.strip("-")


_VENDOR_PREFIXES = ("nvidia-geforce-", "nvidia-", "amd-instinct-", "amd-", "geforce-", "instinct-")


def _lookup_keys(name: str) -> list[str]:
    key = normalize_gpu_name(name)
    keys = [key]
    for prefix in _VENDOR_PREFIXES:
        if key.startswith(prefix) and len(key) > len(prefix):
            keys.append(key[len(prefix) :])
    return keys


def _parse_gpu_row(display: str, line: int, row: dict[str, str], gpus: dict[str, GpuSpec],
                   owners: dict[str, tuple[str, int]]) -> None:
    for field in GPU_COLUMNS:
        if field in _REQUIRED and not row[field]:
            raise field_error(display, line, field, "required value is blank")
    name = row["name"]
    if not _SLUG.match(name):
        raise field_error(
            display, line, "name", f"{name!r} is not a slug", "use lower-case letters, digits, '-' and '.'"
        )
    vendor = row["vendor"].lower()
    if vendor not in VENDORS:
        raise field_error(display, line, "vendor", f"unknown vendor {row['vendor']!r}", f"use one of {', '.join(sorted(VENDORS))}")
    arch = row["arch"].lower()
    if arch not in ARCHS:
        raise field_error(display, line, "arch", f"unknown arch {row['arch']!r}", f"use one of {', '.join(sorted(ARCHS))}")
    cc = row["compute_capability"].lower()
    if not _CC.match(cc):
        raise field_error(display, line, "compute_capability", f"{row['compute_capability']!r} is not like '9.0' or 'gfx942'")
    basis = row["memory_bytes_basis"].lower()
    if basis not in MEMORY_BASES:
        raise field_error(display, line, "memory_bytes_basis", f"unknown basis {row['memory_bytes_basis']!r}", f"use one of {', '.join(sorted(MEMORY_BASES))}")

    values: dict[str, object] = {}
    for field in _FLOAT_FIELDS:
        values[field] = (parse_float(display, line, field, row[field], maximum=_MAXIMA[field])
                         if row[field] else None)
    for field in _INT_FIELDS:
        values[field] = parse_int(display, line, field, row[field], maximum=_MAXIMA[field])
    for field in _BOOL_FIELDS:
        values[field] = parse_bool(display, line, field, row[field])

    nominal = values["memory_gb_nominal"]
    mem = values["memory_bytes"]
    assert isinstance(nominal, float) and isinstance(mem, int)
    low, high = 0.95 * nominal * 1e9, 1.05 * nominal * 2**30
    if not low <= mem <= high:
        raise field_error(
            display,
            line,
            "memory_bytes",
            f"{mem} bytes ({mem / 2**30:.1f} GiB) is not within 5% of {nominal:g} GB/GiB nominal",
            "give the driver-reported total in bytes (nvidia-smi MiB x 1048576)",
        )
    if values["pcie_gen"] not in PCIE_X16_GBPS:  # type: ignore[operator]
        raise field_error(display, line, "pcie_gen", f"unknown PCIe generation {row['pcie_gen']}", "use 3, 4, 5 or 6")

    formats = tuple(f.strip().lower() for f in row["fp4_formats"].split(";") if f.strip())
    bad = [f for f in formats if f not in FP4_FORMATS]
    if bad:
        raise field_error(display, line, "fp4_formats", f"unknown format(s) {', '.join(bad)}", "use nvfp4 and/or mxfp4, ';'-separated")
    if values["fp4_tflops"] is None and formats:
        raise field_error(display, line, "fp4_formats", "set but fp4_tflops is blank")
    if values["fp4_tflops"] is not None and not formats:
        raise field_error(display, line, "fp4_formats", "blank but fp4_tflops is set", "list nvfp4 and/or mxfp4")

    bf16 = values["bf16_tflops"]
    fp8 = values["fp8_tflops"]
    fp4 = values["fp4_tflops"]
    if fp8 is not None and fp8 < bf16:  # type: ignore[operator]
        raise field_error(display, line, "fp8_tflops", f"{fp8:g} is below bf16_tflops {bf16:g}", "use dense figures for both")
    if fp4 is not None and fp4 < (fp8 if fp8 is not None else bf16):  # type: ignore[operator]
        raise field_error(display, line, "fp4_tflops", f"{fp4:g} is below the fp8/bf16 rate", "use dense figures")
    if values["supports_fp8_training"] and fp8 is None:
        raise field_error(display, line, "supports_fp8_training", "true but fp8_tflops is blank")
    if values["supports_fp4_training"] and fp4 is None:
        raise field_error(display, line, "supports_fp4_training", "true but fp4_tflops is blank")

    aliases = tuple(a.strip() for a in row["aliases"].split(";") if a.strip())
    for field, label in [("name", name), ("display_name", row["display_name"])] + [("aliases", a) for a in aliases]:
        key = normalize_gpu_name(label)
        if key in owners and owners[key][0] != name:
            other, other_line = owners[key]
            raise field_error(
                display, line, field, f"{label!r} already names {other!r} (line {other_line})", "names and aliases must be unique"
            )
        owners.setdefault(key, (name, line))
    if name in gpus:
        raise field_error(display, line, "name", f"duplicate GPU {name!r}")

    gpus[name] = GpuSpec(
        name=name,
        display_name=row["display_name"],
        aliases=aliases,
        vendor=vendor,
        arch=arch,
        form_factor=row["form_factor"] or None,
        compute_capability=cc,
        memory_gb_nominal=nominal,
        memory_bytes=mem,
        memory_bytes_basis=basis,
        mem_bw_tbps=values["mem_bw_tbps"],  # type: ignore[arg-type]
        bf16_tflops=bf16,  # type: ignore[arg-type]
        fp16_tflops=values["fp16_tflops"],  # type: ignore[arg-type]
        tf32_tflops=values["tf32_tflops"],  # type: ignore[arg-type]
        fp32_tflops=values["fp32_tflops"],  # type: ignore[arg-type]
        fp8_tflops=fp8,  # type: ignore[arg-type]
        fp4_tflops=fp4,  # type: ignore[arg-type]
        fp4_formats=formats,
        tdp_w=values["tdp_w"],  # type: ignore[arg-type]
        intra_node_link=row["intra_node_link"],
        intra_node_bw_gbps=values["intra_node_bw_gbps"],  # type: ignore[arg-type]
        scale_up_domain_gpus=values["scale_up_domain_gpus"],  # type: ignore[arg-type]
        pcie_gen=values["pcie_gen"],  # type: ignore[arg-type]
        max_gpus_per_node=values["max_gpus_per_node"],  # type: ignore[arg-type]
        supports_bitsandbytes=values["supports_bitsandbytes"],  # type: ignore[arg-type]
        supports_flash_attention=values["supports_flash_attention"],  # type: ignore[arg-type]
        supports_fp8_training=values["supports_fp8_training"],  # type: ignore[arg-type]
        supports_fp4_training=values["supports_fp4_training"],  # type: ignore[arg-type]
        source=row["source"],
        notes=row["notes"] or None,
    )


def _parse_gpus(text: str, display: str) -> dict[str, GpuSpec]:
    gpus: dict[str, GpuSpec] = {}
    owners: dict[str, tuple[str, int]] = {}  # normalized key -> (slug, line)
    errors: list[CatalogError] = []
    for line, row in read_csv_rows(text, display, GPU_COLUMNS, _REQUIRED, errors):
        try:
            _parse_gpu_row(display, line, row, gpus, owners)
        except CatalogError as exc:
            errors.append(exc)
    raise_collected(display, errors)
    if not gpus:
        raise CatalogError(f"{display}: no GPU rows", "add at least one row below the header")
    return gpus


def read_text(path: str | Path) -> str:
    """A catalog file's text: UTF-8 (a BOM is dropped), bounded in size, no NUL bytes."""
    from ..inputs import read_text_file

    return read_text_file(path, "catalog file", max_bytes=MAX_CATALOG_BYTES, error=CatalogError)


_read_text = read_text  # its name before it was public


@functools.lru_cache(maxsize=1)
def _bundled() -> dict[str, GpuSpec]:
    text = resources.files("ftplan.catalog").joinpath("data", "gpus.csv").read_text(encoding="utf-8")
    return _parse_gpus(text, _BUNDLED_NAME)


def load_gpus(path: str | Path | None = None) -> dict[str, GpuSpec]:
    """The GPU catalog keyed by slug: the bundled one (cached) or a user CSV with the same columns.

    Raises :class:`CatalogError` naming file, line and field for any malformed value.
    """
    if path is None:
        return dict(_bundled())
    return _parse_gpus(read_text(path), str(path))


def _index(gpus: Mapping[str, GpuSpec]) -> dict[str, str]:
    index: dict[str, str] = {}
    for spec in gpus.values():
        for label in (spec.name, spec.display_name, *spec.aliases):
            index.setdefault(normalize_gpu_name(label), spec.name)
    return index


@functools.lru_cache(maxsize=1)
def _bundled_index() -> dict[str, str]:
    return _index(_bundled())


def resolve_gpu_name(name: str, gpus: Mapping[str, GpuSpec] | None = None, *,
                     index: Mapping[str, str] | None = None) -> str:
    """The catalog slug for a slug, alias or display name (case-insensitive).

    Vendor prefixes are tolerated, so torch device names such as ``"NVIDIA H100 80GB HBM3"``
    or ``"NVIDIA GeForce RTX 4090"`` resolve. Raises :class:`NotFoundError` with a hint.
    ``index`` is :func:`gpu_name_index` of ``gpus``, for callers that resolve many names.
    """
    if gpus is None:
        catalog, index = _bundled(), _bundled_index()
    else:
        catalog, index = gpus, (index if index is not None else _index(gpus))
    if not isinstance(name, str) or not name.strip():
        raise NotFoundError(f"unknown GPU {str(name)[:60]!r}", "give a GPU name such as 'h100-sxm'")
    for key in _lookup_keys(name):
        if key in index:
            return index[key]
    shown = name if len(name) <= 60 else name[:60] + "..."
    if len(name) > 200:
        raise NotFoundError(f"unknown GPU {shown!r}", "run 'ftplan gpus' to list the catalog")
    key = normalize_gpu_name(name)
    family = sorted(s for s in catalog if s.startswith(key + "-"))
    if family:
        hint = "ambiguous: did you mean " + ", ".join(repr(s) for s in family) + "?"
    else:
        hint = did_you_mean(key, sorted(catalog)) or did_you_mean(key, sorted(index))
        if hint is None:
            hint = "known GPUs: " + ", ".join(sorted(catalog))
    raise NotFoundError(f"unknown GPU {shown!r}", hint)


def gpu_name_index(gpus: Mapping[str, GpuSpec]) -> dict[str, str]:
    """Normalized name/alias -> slug of a GPU catalog (build once, pass to resolve_gpu_name)."""
    return _index(gpus)


def get_gpu(name: str, gpus: Mapping[str, GpuSpec] | None = None) -> GpuSpec:
    """Look up a GPU by slug, alias or display name (case-insensitive)."""
    catalog = _bundled() if gpus is None else gpus
    return catalog[resolve_gpu_name(name, gpus)]
