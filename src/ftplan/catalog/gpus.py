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

from ..errors import CatalogError, ConfigError, NotFoundError, did_you_mean

__all__ = [
    "GpuSpec",
    "GPU_COLUMNS",
    "ARCHS",
    "load_gpus",
    "get_gpu",
    "resolve_gpu_name",
    "normalize_gpu_name",
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


class _CommentSkippingLines(Iterator[str]):
    """Feeds csv.reader, skipping blank lines and lines starting with '#'; tracks line numbers."""

    def __init__(self, lines: Iterable[str]) -> None:
        self._it = enumerate(lines, start=1)
        self.lineno = 0

    def __iter__(self) -> _CommentSkippingLines:
        return self

    def __next__(self) -> str:
        while True:
            n, line = next(self._it)
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            self.lineno = n
            return line


def read_csv_rows(
    text: str, display: str, columns: Iterable[str], required: Iterable[str]
) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield ``(line_number, row)`` for each data row of a catalog CSV, header checked.

    Unknown extra columns are allowed and ignored. A missing required column is an error; a
    missing optional column reads as blank. Blank lines and lines starting with '#' are skipped
    (a quoted field may not span lines).
    """
    lines = _CommentSkippingLines(text.splitlines())
    reader = csv.reader(lines)
    try:
        header = next(reader)
    except StopIteration:
        raise CatalogError(f"{display}: file is empty", "expected a CSV header line") from None
    except csv.Error as exc:
        raise CatalogError(f"{display}: line {lines.lineno}: malformed CSV ({exc})") from None
    header = [h.strip() for h in header]
    dupes = sorted({h for h in header if header.count(h) > 1})
    if dupes:
        raise CatalogError(f"{display}: line {lines.lineno}: duplicate column(s) {', '.join(dupes)}")
    known = list(columns)
    required = set(required)
    missing = [c for c in known if c in required and c not in header]
    if missing:
        raise CatalogError(
            f"{display}: line {lines.lineno}: missing required column(s) {', '.join(missing)}",
            f"expected columns: {', '.join(known)}",
        )
    absent = [c for c in known if c not in header]  # optional columns may be left out
    width = len(header)
    while True:
        try:
            values = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise CatalogError(f"{display}: line {lines.lineno}: malformed CSV ({exc})") from None
        if len(values) != width:
            raise CatalogError(
                f"{display}: line {lines.lineno}: expected {width} fields, found {len(values)}",
                "quote fields that contain commas",
            )
        row = {h: v.strip() for h, v in zip(header, values)}
        for c in absent:
            row[c] = ""
        yield lines.lineno, row


def field_error(display: str, line: int, field: str, problem: str, hint: str | None = None) -> CatalogError:
    return CatalogError(f"{display}: line {line}: {field}: {problem}", hint)


def parse_float(display: str, line: int, field: str, value: str, *, minimum: float = 0.0, strict: bool = True) -> float:
    try:
        x = float(value)
    except ValueError:
        raise field_error(display, line, field, f"not a number: {value!r}") from None
    if not math.isfinite(x):
        raise field_error(display, line, field, f"not a finite number: {value!r}")
    if (strict and x <= minimum) or (not strict and x < minimum):
        op = ">" if strict else ">="
        raise field_error(display, line, field, f"must be {op} {minimum:g}, got {value}")
    return x


def parse_int(display: str, line: int, field: str, value: str, *, minimum: int = 1) -> int:
    try:
        x = int(value)
    except ValueError:
        raise field_error(display, line, field, f"not an integer: {value!r}") from None
    if x < minimum:
        raise field_error(display, line, field, f"must be >= {minimum}, got {value}")
    return x


def parse_bool(display: str, line: int, field: str, value: str) -> bool:
    v = value.lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise field_error(display, line, field, f"not a boolean: {value!r}", "use true or false")


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


def _parse_gpus(text: str, display: str) -> dict[str, GpuSpec]:
    gpus: dict[str, GpuSpec] = {}
    owners: dict[str, tuple[str, int]] = {}  # normalized key -> (slug, line)
    for line, row in read_csv_rows(text, display, GPU_COLUMNS, _REQUIRED):
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
            values[field] = parse_float(display, line, field, row[field]) if row[field] else None
        for field in _INT_FIELDS:
            values[field] = parse_int(display, line, field, row[field])
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
    if not gpus:
        raise CatalogError(f"{display}: no GPU rows", "add at least one row below the header")
    return gpus


def read_text(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CatalogError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogError(f"{path}: cannot read ({exc})") from None


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


def resolve_gpu_name(name: str, gpus: Mapping[str, GpuSpec] | None = None) -> str:
    """The catalog slug for a slug, alias or display name (case-insensitive).

    Vendor prefixes are tolerated, so torch device names such as ``"NVIDIA H100 80GB HBM3"``
    or ``"NVIDIA GeForce RTX 4090"`` resolve. Raises :class:`NotFoundError` with a hint.
    """
    if gpus is None:
        catalog, index = _bundled(), _bundled_index()
    else:
        catalog, index = gpus, _index(gpus)
    if not isinstance(name, str) or not name.strip():
        raise NotFoundError(f"unknown GPU {name!r}", "give a GPU name such as 'h100-sxm'")
    for key in _lookup_keys(name):
        if key in index:
            return index[key]
    key = normalize_gpu_name(name)
    family = sorted(s for s in catalog if s.startswith(key + "-"))
    if family:
        hint = "ambiguous: did you mean " + ", ".join(repr(s) for s in family) + "?"
    else:
        hint = did_you_mean(key, sorted(catalog)) or did_you_mean(key, sorted(index))
        if hint is None:
            hint = "known GPUs: " + ", ".join(sorted(catalog))
    raise NotFoundError(f"unknown GPU {name!r}", hint)


def get_gpu(name: str, gpus: Mapping[str, GpuSpec] | None = None) -> GpuSpec:
    """Look up a GPU by slug, alias or display name (case-insensitive)."""
    catalog = _bundled() if gpus is None else gpus
    return catalog[resolve_gpu_name(name, gpus)]
