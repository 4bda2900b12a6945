"""The bundled GPU catalog: sane values, name resolution, and validation of user files."""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

import pytest

from ftplan.catalog import gpus as gpus_mod
from ftplan.catalog.gpus import ARCHS, GPU_COLUMNS, GpuSpec, get_gpu, load_gpus, resolve_gpu_name
from ftplan.errors import CatalogError, ConfigError, NotFoundError

REQUIRED_SLUGS = {
    "rtx-3090", "rtx-4090", "rtx-5090", "rtx-6000-ada", "rtx-pro-6000", "a10", "a10g", "l4", "l40s",
    "a100-40gb-pcie", "a100-40gb-sxm", "a100-80gb-pcie", "a100-80gb-sxm", "h100-pcie", "h100-sxm",
    "h100-nvl", "h200", "gh200", "b200", "b300", "gb200", "mi300x", "mi325x", "mi355x",
}  # fmt: skip

CATALOG = load_gpus()
BUNDLED = Path(gpus_mod.__file__).parent / "data" / "gpus.csv"


def test_catalog_has_every_required_gpu():
    assert REQUIRED_SLUGS <= set(CATALOG)


@pytest.mark.parametrize("slug", sorted(CATALOG))
def test_entry_is_sane(slug: str):
    g = CATALOG[slug]
    assert isinstance(g, GpuSpec) and g.name == slug
    assert g.arch in ARCHS and g.vendor in {"nvidia", "amd"}
    assert g.bf16_tflops > 0 and g.mem_bw_tbps > 0 and g.intra_node_bw_gbps > 0
    # dense rates must rise with lower precision where present
    if g.fp8_tflops is not None:
        assert g.bf16_tflops <= g.fp8_tflops
    if g.fp4_tflops is not None:
        assert (g.fp8_tflops or g.bf16_tflops) <= g.fp4_tflops
        assert g.fp4_formats
    if g.fp16_tflops is not None:
        assert g.fp16_tflops > 0
    for v in (g.tf32_tflops, g.fp32_tflops, g.tdp_w):
        assert v is None or v > 0
    if g.tf32_tflops is not None:
        assert g.tf32_tflops <= g.bf16_tflops
    # driver-reported memory within 5% of the nominal size, read as GB or GiB
    assert 0.95 * g.memory_gb_nominal * 1e9 <= g.memory_bytes <= 1.05 * g.memory_gb_nominal * 2**30
    assert g.memory_bytes_basis in {"nvidia-smi", "rocm-smi", "torch", "nominal"}
    assert g.source.strip() and len(g.source) > 20
    assert g.max_gpus_per_node >= 1 and g.scale_up_domain_gpus >= 1 and g.pcie_gen in {3, 4, 5, 6}
    assert g.supports_fp8_training <= (g.fp8_tflops is not None)
    assert g.supports_fp4_training <= (g.fp4_tflops is not None)
    assert all(isinstance(a, str) and a for a in g.aliases)
    assert g.peak_tflops("bf16") == g.bf16_tflops
    assert get_gpu(slug) is g or get_gpu(slug) == g


def test_names_and_aliases_are_unique_after_normalization():
    seen: dict[str, str] = {}
    for g in CATALOG.values():
        for label in {g.name, g.display_name, *g.aliases}:
            key = gpus_mod.normalize_gpu_name(label)
            assert seen.setdefault(key, g.name) == g.name, f"{label} names {seen[key]} and {g.name}"


def test_known_datasheet_values():
    h100 = CATALOG["h100-sxm"]
    assert h100.bf16_tflops == pytest.approx(989.4) and h100.fp8_tflops == pytest.approx(1978.9)
    assert h100.memory_bytes == 81559 * 2**20 and h100.mem_bw_tbps == 3.35
    assert CATALOG["a100-80gb-sxm"].memory_bytes == 81920 * 2**20
    assert CATALOG["a100-80gb-pcie"].mem_bw_tbps == 1.935
    assert CATALOG["b200"].fp4_tflops == 9000 and CATALOG["b300"].tdp_w == 1100
    assert CATALOG["gb200"].scale_up_domain_gpus == 72 and CATALOG["gb200"].max_gpus_per_node == 4
    # Ampere has no FP8
    for slug in ("a100-80gb-sxm", "rtx-3090", "a10", "a10g"):
        assert CATALOG[slug].fp8_tflops is None and not CATALOG[slug].supports_fp8_training


@pytest.mark.parametrize(
    "name, slug",
    [
        ("h100-sxm", "h100-sxm"),
        ("H100", "h100-sxm"),
        ("h100 sxm", "h100-sxm"),
        ("H100_SXM5", "h100-sxm"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),  # torch.cuda.get_device_name()
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb-sxm"),
        ("NVIDIA A100-PCIE-40GB", "a100-40gb-pcie"),
        ("NVIDIA A100 80GB PCIe", "a100-80gb-pcie"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("RTX 3090", "rtx-3090"),
        ("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("NVIDIA B300 SXM6 AC", "b300"),
        ("NVIDIA GB200", "gb200"),
        ("AMD Instinct MI300X", "mi300x"),
        ("MI355X", "mi355x"),
        ("NVIDIA L40S", "l40s"),
        ("nvidia a10g", "a10g"),
    ],
)
def test_resolution(name: str, slug: str):
    assert resolve_gpu_name(name) == slug
    assert get_gpu(name).name == slug


def test_unknown_name_has_did_you_mean():
    with pytest.raises(NotFoundError) as info:
        get_gpu("h100-sxn")
    assert "h100-sxm" in info.value.one_line()
    assert isinstance(info.value, ConfigError)


def test_ambiguous_family_lists_variants():
    with pytest.raises(NotFoundError) as info:
        get_gpu("a100")
    line = info.value.one_line()
    for slug in ("a100-40gb-pcie", "a100-40gb-sxm", "a100-80gb-pcie", "a100-80gb-sxm"):
        assert slug in line


def test_turing_rtx6000_is_not_the_ada_card():
    with pytest.raises(NotFoundError):
        get_gpu("RTX6000")


def test_peak_tflops_formats():
    mi355 = CATALOG["mi355x"]
    assert mi355.peak_tflops("mxfp4") == mi355.fp4_tflops
    assert mi355.peak_tflops("nvfp4") is None  # MI355X has no NVFP4
    b200 = CATALOG["b200"]
    assert b200.peak_tflops("nvfp4") == b200.peak_tflops("fp4") == 9000
    assert b200.peak_tflops("bfloat16") == b200.bf16_tflops
    assert CATALOG["a100-40gb-sxm"].peak_tflops("fp8") is None
    assert CATALOG["h100-nvl"].peak_tflops("tf32") is None
    with pytest.raises(ConfigError):
        b200.peak_tflops("int3")


def test_intra_node_bandwidth_outside_scale_up_domain_falls_back_to_pcie():
    nvl = CATALOG["h100-nvl"]
    assert nvl.intra_node_bw_for(2) == 300
    assert nvl.intra_node_bw_for(4) == pytest.approx(63.0)
    assert CATALOG["h100-sxm"].intra_node_bw_for(8) == 450
    assert CATALOG["rtx-4090"].pcie_bw_gbps == pytest.approx(31.5)


def test_nothing_loaded_at_import_time():
    code = (
        "import ftplan, ftplan.catalog.gpus as g, ftplan.catalog.offers as o;"
        "print(g._bundled.cache_info().currsize, o._bundled.cache_info().currsize)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "0"]


def test_bundled_load_is_cached_and_copies():
    a, b = load_gpus(), load_gpus()
    assert a == b and a is not b
    assert gpus_mod._bundled.cache_info().currsize == 1


# ---------------------------------------------------------------------------------------------
# user files


def _rows() -> list[dict[str, str]]:
    with BUNDLED.open(encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _write(tmp_path: Path, rows: list[dict[str, str]], columns=GPU_COLUMNS, name="gpus.csv") -> Path:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    path = tmp_path / name
    path.write_text(buf.getvalue(), encoding="utf-8")
    return path


def _error(path: Path) -> str:
    with pytest.raises(CatalogError) as info:
        load_gpus(path)
    line = info.value.one_line()
    assert "\n" not in line and str(path) in line
    return line


def test_user_file_round_trip(tmp_path: Path):
    path = _write(tmp_path, _rows())
    assert load_gpus(path) == CATALOG


def test_user_file_may_add_a_gpu_and_skip_optional_columns(tmp_path: Path):
    row = dict(_rows()[0], name="my-3090", display_name="My 3090", aliases="mine")
    columns = [c for c in GPU_COLUMNS if c not in ("notes", "form_factor", "fp4_formats", "fp4_tflops")]
    path = _write(tmp_path, [row], columns)
    (tmp_path / "gpus.csv").write_text("# my cluster\n" + path.read_text(), encoding="utf-8")
    got = load_gpus(path)
    assert list(got) == ["my-3090"] and got["my-3090"].notes is None
    assert resolve_gpu_name("MINE", got) == "my-3090"


def test_missing_column(tmp_path: Path):
    columns = [c for c in GPU_COLUMNS if c != "bf16_tflops"]
    line = _error(_write(tmp_path, _rows(), columns))
    assert "missing" in line and "bf16_tflops" in line


@pytest.mark.parametrize(
    "field, value, expect",
    [
        ("mem_bw_tbps", "fast", "not a number"),
        ("mem_bw_tbps", "-1", "must be > 0"),
        ("bf16_tflops", "", "blank"),
        ("memory_bytes", "80.5", "not an integer"),
        ("memory_bytes", str(40 * 2**30), "within 5%"),
        ("supports_bitsandbytes", "maybe", "not a boolean"),
        ("arch", "turing", "unknown arch"),
        ("fp8_tflops", "10", "below bf16"),
        ("name", "H100 SXM", "not a slug"),
        ("fp4_formats", "int4", "unknown format"),
        ("compute_capability", "sm90", "compute_capability"),
    ],
)
def test_malformed_value_names_line_and_field(tmp_path: Path, field: str, value: str, expect: str):
    rows = _rows()
    slug = "h100-sxm"
    idx = next(i for i, r in enumerate(rows) if r["name"] == slug)
    rows[idx][field] = value
    line = _error(_write(tmp_path, rows))
    assert f"line {idx + 2}" in line and field in line and expect in line


def test_duplicate_alias_is_rejected(tmp_path: Path):
    rows = _rows()
    rows[1]["aliases"] += ";3090"  # rtx-4090 row steals rtx-3090's alias
    line = _error(_write(tmp_path, rows))
    assert "line 3" in line and "aliases" in line and "rtx-3090" in line


def test_unreadable_and_empty_files(tmp_path: Path):
    with pytest.raises(CatalogError):
        load_gpus(tmp_path / "nope.csv")
    empty = tmp_path / "empty.csv"
    empty.write_text("# only a comment\n", encoding="utf-8")
    with pytest.raises(CatalogError):
        load_gpus(empty)


def test_ragged_row(tmp_path: Path):
    path = _write(tmp_path, _rows()[:1])
    path.write_text(path.read_text() + "b200,oops\n", encoding="utf-8")
    line = _error(path)
    assert "line 3" in line and "fields" in line
