"""The bundled offers catalog, user offer files, queries and the SkyPilot importer."""

from __future__ import annotations

import csv
import datetime as dt
import io
import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftplan.catalog import offers as offers_mod
from ftplan.catalog.gpus import load_gpus
from ftplan.catalog.offers import (
    OFFER_COLUMNS,
    PRICING,
    Offer,
    filter_offers,
    import_skypilot_catalog,
    is_stale,
    latest_offers,
    load_offers,
)
from ftplan.errors import CatalogError, ConfigError, NotFoundError

TODAY = dt.date(2026, 11, 21)
GPUS = load_gpus()
ALL = load_offers(latest_only=False)
LATEST = load_offers()
BUNDLED = Path(offers_mod.__file__).parent / "data" / "offers.csv"
SKYPILOT = Path(__file__).resolve().parents[1] / "data" / "skypilot"


def _id(o: Offer) -> str:
    return f"{o.provider}|{o.sku}|{o.pricing}|{o.as_of}"


@pytest.mark.parametrize("offer", ALL, ids=_id)
def test_offer_is_sane(offer: Offer):
    assert offer.gpu in GPUS
    assert offer.gpus_per_instance <= GPUS[offer.gpu].max_gpus_per_node
    assert 0 < offer.usd_per_gpu_hour < 100
    assert offer.usd_per_instance_hour == pytest.approx(offer.usd_per_gpu_hour * offer.gpus_per_instance)
    assert offer.pricing in PRICING
    assert dt.date(2024, 1, 1) <= offer.as_of <= TODAY
    assert offer.source.strip() and offer.provider.strip() and offer.sku.strip()
    assert offer.inter_node_gbps is None or offer.inter_node_gbps >= 0
    assert offer.billing_granularity_s is None or offer.billing_granularity_s >= 1


def test_counts_and_coverage():
    assert len(ALL) >= 100 and len(LATEST) < len(ALL)
    keys = [o.key for o in LATEST]
    assert len(keys) == len(set(keys))
    covered = {o.gpu for o in LATEST}
    assert {"h100-sxm", "h100-pcie", "h100-nvl", "h200", "b200", "b300", "gb200", "gh200", "a100-80gb-sxm",
            "a100-40gb-sxm", "l40s", "l4", "a10g", "rtx-4090", "rtx-pro-6000", "mi300x"} <= covered  # fmt: skip
    assert {o.pricing for o in LATEST} == set(PRICING)


def test_latest_only_keeps_newest_price():
    secure = [o for o in ALL if o.provider == "RunPod" and o.sku == "H100 SXM Secure Cloud"]
    assert sorted(o.usd_per_gpu_hour for o in secure) == [3.49, 3.99]
    [latest] = [o for o in LATEST if o.provider == "RunPod" and o.sku == "H100 SXM Secure Cloud"]
    assert latest.usd_per_gpu_hour == 3.99 and latest.as_of == dt.date(2026, 11, 9)
    vast = [o for o in LATEST if o.provider == "Vast.ai" and o.gpu == "h100-sxm"]
    assert [o.usd_per_gpu_hour for o in vast] == [2.4024]


def test_seed_article_prices_are_included_with_their_date():
    seed = [o for o in ALL if o.as_of == dt.date(2026, 3, 1)]
    assert all("deploybase.ai/articles/best-gpu-for-fine-tuning" in o.source for o in seed)
    prices = {(o.provider, o.gpu, o.pricing): o.usd_per_gpu_hour for o in seed}
    assert prices[("RunPod", "rtx-4090", "on-demand")] == 0.34
    assert prices[("RunPod", "b200", "on-demand")] == 5.98
    assert prices[("Lambda", "gh200", "on-demand")] == 1.99
    assert prices[("CoreWeave", "h200", "on-demand")] == pytest.approx(50.44 / 8)
    assert prices[("RunPod", "h100-pcie", "reserved")] == pytest.approx(9950 / 8760, abs=1e-4)


def test_excluded_rows_are_absent():
    assert not [o for o in ALL if "trn1" in o.sku or o.provider == "Together AI" and "range" in (o.notes or "")]
    assert not [o for o in ALL if o.sku == "a3-highgpu-1g"]
    header = BUNDLED.read_text(encoding="utf-8").splitlines()[:12]
    assert any("Trainium" in line for line in header)


def test_filter_offers():
    h100 = filter_offers(LATEST, gpus="H100", pricing="on-demand")
    assert h100 and {o.gpu for o in h100} == {"h100-sxm"} and {o.pricing for o in h100} == {"on-demand"}
    aws = filter_offers(LATEST, providers=["aws", "GCP"], pricing=["spot", "reserved"])
    assert aws and {o.provider for o in aws} == {"AWS", "GCP"}
    assert filter_offers(LATEST) == LATEST
    with pytest.raises(ConfigError):
        filter_offers(LATEST, pricing="cheap")
    with pytest.raises(NotFoundError):
        filter_offers(LATEST, gpus=["h100-sxn"])


def test_age_and_staleness():
    o = next(o for o in ALL if o.provider == "AWS" and o.sku == "p5.48xlarge")
    assert o.as_of == dt.date(2026, 1, 21)
    assert o.age_days(TODAY) == 304
    assert is_stale(o, TODAY) and not is_stale(o, TODAY, max_age_days=400)
    fresh = next(o for o in LATEST if o.as_of == dt.date(2026, 11, 9))
    assert not is_stale(fresh, TODAY)


def test_billing_rounding():
    lam = next(o for o in LATEST if o.provider == "Lambda" and o.sku == "1x H100 SXM")
    assert lam.billing_granularity_s == 60
    assert lam.billed_hours(0.5001) == pytest.approx(31 / 60)
    assert lam.cost_usd(1.0, instances=2) == pytest.approx(2 * 4.29)
    unknown = next(o for o in LATEST if o.billing_granularity_s is None)
    assert unknown.billed_hours(0.123) == 0.123


@settings(deadline=None)  # a slow shared runner is not a failure
@given(hours=st.floats(min_value=0, max_value=1000, allow_nan=False), step=st.sampled_from([1, 60, 3600]))
def test_billed_hours_rounds_up_at_most_one_step(hours: float, step: int):
    o = Offer("p", "s", "h100-sxm", 8, 2.0, "on-demand", None, None, None, step, dt.date(2026, 1, 1), "x", None)
    billed = o.billed_hours(hours)
    assert hours - 1e-9 <= billed <= hours + step / 3600 + 1e-9


# ---------------------------------------------------------------------------------------------
# user files

_GOOD = {
    "provider": "MyCloud",
    "sku": "8x H100 box",
    "gpu": "h100-sxm",
    "gpus_per_instance": "8",
    "usd_per_gpu_hour": "2.10",
    "pricing": "on-demand",
    "region": "eu-west",
    "inter_node_network": "RoCE 8x400",
    "inter_node_gbps": "3200",
    "billing_granularity_s": "60",
    "as_of": "2026-11-01",
    "source": "quote from sales, 2026-11-01",
    "notes": "",
}


def _write(tmp_path: Path, rows: list[dict[str, str]], columns=OFFER_COLUMNS, name="offers.csv") -> Path:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    path = tmp_path / name
    path.write_text(buf.getvalue(), encoding="utf-8")
    return path


def _error(path: Path) -> str:
    with pytest.raises(CatalogError) as info:
        load_offers([path], include_bundled=False)
    line = info.value.one_line()
    assert "\n" not in line and str(path) in line
    return line


def test_user_file_loads_alone_and_with_bundled(tmp_path: Path):
    path = _write(tmp_path, [_GOOD, dict(_GOOD, gpu="NVIDIA H100 80GB HBM3", pricing="spot", usd_per_gpu_hour="1")])
    mine = load_offers([path], include_bundled=False)
    assert [o.gpu for o in mine] == ["h100-sxm", "h100-sxm"]  # aliases canonicalized
    assert mine[0].inter_node_gbps == 3200 and mine[0].billing_granularity_s == 60 and mine[0].notes is None
    both = load_offers(str(path))
    assert len(both) == len(LATEST) + 2


def test_user_row_overrides_bundled_price(tmp_path: Path):
    row = dict(_GOOD, provider="RunPod", sku="H100 SXM Secure Cloud", gpu="h100-sxm", gpus_per_instance="1",
               usd_per_gpu_hour="3.59", region="", as_of="2026-11-20")  # fmt: skip
    merged = load_offers([_write(tmp_path, [row])])
    [secure] = [o for o in merged if o.provider == "RunPod" and o.sku == "H100 SXM Secure Cloud"]
    assert secure.usd_per_gpu_hour == 3.59


def test_comments_and_optional_columns(tmp_path: Path):
    columns = [c for c in OFFER_COLUMNS if c not in ("notes", "inter_node_network", "region")]
    path = _write(tmp_path, [_GOOD], columns)
    path.write_text("# my prices\n\n" + path.read_text(), encoding="utf-8")
    [o] = load_offers([path], include_bundled=False)
    assert o.region is None and o.inter_node_network is None


def test_missing_column(tmp_path: Path):
    columns = [c for c in OFFER_COLUMNS if c != "as_of"]
    line = _error(_write(tmp_path, [_GOOD], columns))
    assert "missing" in line and "as_of" in line


@pytest.mark.parametrize(
    "field, value, expect",
    [
        ("usd_per_gpu_hour", "1.2.3", "not a number"),
        ("usd_per_gpu_hour", "0", "must be > 0"),
        ("usd_per_gpu_hour", "250", "implausible"),
        ("gpus_per_instance", "two", "not an integer"),
        ("gpus_per_instance", "16", "max_gpus_per_node"),
        ("gpu", "h100-sxn", "did you mean 'h100-sxm'"),
        ("gpu", "tpu-v5p", "unknown GPU"),
        ("pricing", "ondemand", "unknown pricing"),
        ("as_of", "2026-13-01", "not a valid date"),
        ("as_of", "21/11/2026", "not a date"),
        ("as_of", "2099-01-01", "future"),
        ("inter_node_gbps", "-5", "must be >= 0"),
        ("billing_granularity_s", "0", "must be >= 1"),
        ("source", "", "blank"),
    ],
)
def test_malformed_value_names_line_and_field(tmp_path: Path, field: str, value: str, expect: str):
    rows = [_GOOD, dict(_GOOD, **{field: value})]
    line = _error(_write(tmp_path, rows))
    assert "line 3" in line and field in line and expect in line


def test_duplicate_row_is_rejected(tmp_path: Path):
    line = _error(_write(tmp_path, [_GOOD, _GOOD]))
    assert "line 3" in line and "duplicate" in line


def test_offers_validated_against_a_custom_gpu_catalog(tmp_path: Path):
    only_h100 = {"h100-sxm": GPUS["h100-sxm"]}
    with pytest.raises(CatalogError) as info:
        load_offers(gpus=only_h100)
    assert "offers.csv" in info.value.one_line() and "gpu" in info.value.one_line()
    path = _write(tmp_path, [_GOOD])
    assert len(load_offers([path], include_bundled=False, gpus=only_h100)) == 1


def test_latest_offers_prefers_later_on_ties():
    a = Offer("p", "s", "h100-sxm", 8, 2.0, "on-demand", None, None, None, None, dt.date(2026, 1, 1), "x", None)
    b = Offer("P", "S", "h100-sxm", 8, 3.0, "on-demand", None, None, None, None, dt.date(2026, 1, 1), "y", None)
    c = Offer("p", "s", "h100-sxm", 8, 1.0, "on-demand", None, None, None, None, dt.date(2025, 1, 1), "z", None)
    assert latest_offers([a, b, c]) == [b]


# ---------------------------------------------------------------------------------------------
# SkyPilot catalog import


def _import(cloud: str, **kw):
    return import_skypilot_catalog(SKYPILOT / cloud / "vms.csv", as_of="2026-11-01", **kw)


def test_skypilot_lambda():
    r = _import("lambda")
    assert r.rows_read == 11
    assert r.skipped == {"no_accelerator": 1, "unknown_accelerator": 3}
    assert set(r.unknown_accelerators) == {"A6000", "V100", "RTX6000"}  # RTX6000 is Turing, not Ada
    by_sku = {(o.sku, o.region): o for o in r}
    h100 = by_sku[("gpu_8x_h100_sxm5", "us-east-1")]
    assert (h100.gpu, h100.gpus_per_instance, h100.pricing) == ("h100-sxm", 8, "on-demand")
    assert h100.usd_per_gpu_hour == pytest.approx(31.92 / 8) and h100.usd_per_instance_hour == pytest.approx(31.92)
    assert h100.provider == "lambda" and h100.as_of == dt.date(2026, 11, 1)
    assert by_sku[("gpu_1x_h100_pcie", "us-east-1")].gpu == "h100-pcie"
    assert by_sku[("gpu_8x_a100", "us-east-1")].gpu == "a100-40gb-sxm"
    assert "assumed" in by_sku[("gpu_8x_a100", "us-east-1")].notes
    assert by_sku[("gpu_8x_a100_80gb_sxm4", "us-east-1")].gpu == "a100-80gb-sxm"
    assert by_sku[("gpu_1x_gh200", "us-east-1")].gpu == "gh200"
    assert all(o.pricing == "on-demand" for o in r)  # Lambda has no SpotPrice


def test_skypilot_runpod_spot_and_zone_merge():
    r = _import("runpod")
    assert r.skipped == {"duplicate": 1, "unknown_accelerator": 1}
    gpus = {o.sku: o.gpu for o in r}
    assert gpus["1x_H100_SECURE"] == "h100-pcie"  # RunPod's plain "H100" is the PCIe card
    assert gpus["1x_A100-80GB_SECURE"] == "a100-80gb-pcie"
    assert gpus["1x_A100-80GB-SXM_SECURE"] == "a100-80gb-sxm"
    assert gpus["1x_H100-NVL_SECURE"] == "h100-nvl"
    spot = {o.sku: o.usd_per_gpu_hour for o in r if o.pricing == "spot"}
    assert spot["2x_A100-80GB_SECURE"] == pytest.approx(1.19) and spot["1x_RTX4090_SECURE"] == 0.29
    assert "1x_H100_SECURE" not in spot
    assert len([o for o in r if o.sku == "1x_A100-80GB_SECURE"]) == 2  # two zones -> one on-demand + one spot


def test_skypilot_aws_and_gcp_skips():
    aws = _import("aws")
    assert aws.skipped == {
        "no_accelerator": 1, "duplicate": 1, "fractional_count": 1, "unknown_accelerator": 1, "no_price": 1,
    }  # fmt: skip
    p5 = {o.pricing: o.usd_per_gpu_hour for o in aws if o.sku == "p5.48xlarge"}
    assert p5 == {"on-demand": pytest.approx(6.88), "spot": pytest.approx(3.44)}
    assert {o.gpu for o in aws} == {"h100-sxm", "a100-40gb-sxm", "a100-80gb-sxm", "a10g"}
    gcp = _import("gcp")
    assert gcp.skipped == {"no_accelerator": 1, "accelerator_only_price": 1, "unknown_accelerator": 1}
    assert {(o.sku, o.pricing) for o in gcp} == {("a3-highgpu-8g", "on-demand"), ("a3-highgpu-8g", "spot")}


def test_skypilot_defaults_and_overrides(tmp_path: Path):
    src = SKYPILOT / "lambda" / "vms.csv"
    copy = tmp_path / "vms.csv"
    copy.write_text(src.read_text(), encoding="utf-8")
    stamp = time.mktime(dt.datetime(2026, 10, 5, 12).timetuple())
    os.utime(copy, (stamp, stamp))
    r = import_skypilot_catalog(copy, provider="Lambda", accelerator_map={"A100": "a100-40gb-pcie"})
    assert {o.as_of for o in r} == {dt.date(2026, 10, 5)}
    assert all("modification date" in o.notes for o in r)
    assert {o.provider for o in r} == {"Lambda"}
    assert next(o for o in r if o.sku == "gpu_8x_a100").gpu == "a100-40gb-pcie"
    with pytest.raises(ConfigError):
        import_skypilot_catalog(copy, as_of="yesterday")


def test_skypilot_azure_nc_series_is_nvl(tmp_path: Path):
    d = tmp_path / "azure"
    d.mkdir()
    (d / "vms.csv").write_text(
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Region,Price,SpotPrice\n"
        "Standard_NC40ads_H100_v5,H100,1,40,320,,eastus,6.98,\n"
        "Standard_ND96isr_H100_v5,H100,8,96,1900,,eastus,98.32,\n",
        encoding="utf-8",
    )
    r = import_skypilot_catalog(d / "vms.csv", as_of=dt.date(2026, 11, 9))
    assert [(o.sku, o.gpu) for o in r] == [("Standard_NC40ads_H100_v5", "h100-nvl"), ("Standard_ND96isr_H100_v5", "h100-sxm")]


def test_skypilot_missing_column(tmp_path: Path):
    bad = tmp_path / "vms.csv"
    bad.write_text("InstanceType,Price\nfoo,1.0\n", encoding="utf-8")
    with pytest.raises(CatalogError) as info:
        import_skypilot_catalog(bad, as_of="2026-11-01")
    assert "AcceleratorName" in info.value.one_line()


def test_imported_offers_are_valid_catalog_rows(tmp_path: Path):
    """Imported offers survive a round trip through the user-file validator."""
    offers = [o for cloud in ("lambda", "runpod", "aws", "gcp") for o in _import(cloud)]
    rows = [
        {
            "provider": o.provider, "sku": o.sku, "gpu": o.gpu, "gpus_per_instance": str(o.gpus_per_instance),
            "usd_per_gpu_hour": repr(o.usd_per_gpu_hour), "pricing": o.pricing, "region": o.region or "",
            "as_of": o.as_of.isoformat(), "source": o.source, "notes": o.notes or "",
        }
        for o in offers
    ]  # fmt: skip
    again = load_offers([_write(tmp_path, rows)], include_bundled=False, latest_only=False)
    assert len(again) == len(offers)
