"""``ftplan validate``: statistics, false fits, the ratchet (no torch needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftplan.errors import MeasurementError
from ftplan.measure import validate as V
from ftplan.measure.records import SCHEMA, load_records

ROOT = Path(__file__).resolve().parents[2]
GIB = 1024**3

TINY_LLAMA = {"model_type": "llama", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 4096}


def _record(i: int, *, outcome="ok", alloc=None, reserved=None, tps=None, method="full", device="cuda",
            gpu_total=80 * GIB) -> dict:
    job = {"method": method, "precision": "bf16-mixed", "optimizer": "adamw", "micro_batch": 1,
           "seq_len": 128, "grad_accum": 1, "gradient_checkpointing": False, "attn_impl": "sdpa",
           "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["all-linear"]},
           "quant": {}, "dataset_tokens": None, "epochs": 1.0}
    return {"schema": SCHEMA, "key": f"k{i}", "outcome": outcome, "error": None,
            "model": {"name": "tiny", "config": TINY_LLAMA}, "job": job, "layout": {},
            "run": {"device": device, "tiny": False}, "env": {"gpu_name": "X", "gpu_total_bytes": gpu_total},
            "measured": {"peak_allocated_bytes": alloc, "peak_reserved_bytes": reserved, "tokens_per_s": tps},
            "_source": f"synthetic:{i}"}


def _fixed_predict(spec, job, layout, gpu_name):
    # a constant prediction: 100 for allocated, 200 reserved, 1000 tokens/s, device total 50 GiB
    return {"peak_allocated_bytes": 100, "peak_reserved_bytes": 200, "device_total_bytes": 50 * GIB,
            "model_states_bytes": None, "components": {}, "tokens_per_s": 1000.0}


def test_stats_hand_computed():
    s = V.stats([1.0, -2.0, 3.0, None, -4.0, 10.0])
    # |errors| sorted: 1 2 3 4 10 -> median 3, p90 nearest rank ceil(4.5)=5th -> 10, max 10
    assert s == {"n": 5, "median_pct": 3.0, "p90_pct": 10.0, "max_pct": 10.0}
    s = V.stats([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, -12])
    # n=12: median (6+7)/2; p90 = ceil(10.8)=11th -> 11
    assert s["median_pct"] == 6.5 and s["p90_pct"] == 11 and s["max_pct"] == 12
    assert V.stats([None]) == {"n": 0, "median_pct": None, "p90_pct": None, "max_pct": None}


def test_synthetic_record_set():
    # measured allocations 100/(1+e): errors +25 %, -20 %, +5 %, 0 %; one OOM that was predicted to fit,
    # one OOM correctly predicted not to fit (80 GiB card vs 50 GiB predicted -> fits; 40 GiB card -> not)
    recs = [
        _record(1, alloc=80, reserved=250, tps=800),  # +25 %, reserved -20 %, tps +25 %
        _record(2, alloc=125, reserved=200, tps=1000),  # -20 %, 0 %, 0 %
        _record(3, alloc=95.238095238, reserved=190.47619, tps=1100),  # ~+5 %
        _record(4, alloc=100, reserved=160, tps=None, method="lora"),  # 0 %, +25 %
        _record(5, outcome="oom", alloc=79 * GIB),  # false fit
        _record(6, outcome="oom", gpu_total=40 * GIB),  # predicted not to fit: fine
        _record(7, alloc=100, device="cpu"),  # CPU: never counted as GPU accuracy
        _record(8, outcome="error"),
    ]
    rep = V.validate_records(recs, predict_fn=_fixed_predict)
    g = rep["groups"]["gpu"]["all"]
    assert g["n"] == 7 and g["oom"] == 2 and g["errors"] == 1
    a = g["peak_allocated"]
    assert a["n"] == 4
    assert a["median_pct"] == pytest.approx((5 + 20) / 2) and a["max_pct"] == pytest.approx(25)
    assert a["p90_pct"] == pytest.approx(25)
    assert g["false_fits"] == 1 and g["missed_fits"] == 0
    assert rep["groups"]["gpu"]["by_method"]["lora"]["peak_allocated"]["n"] == 1
    assert g["tokens_per_s"]["n"] == 3 and g["tokens_per_s"]["median_pct"] == pytest.approx(9.0909, abs=1e-3)
    assert "cpu" in rep["groups"] and rep["groups"]["cpu"]["all"]["n"] == 1
    figs = rep["figures"]
    assert figs["gpu.false_fits"] == 1 and figs["gpu.peak_allocated.max_pct"] == pytest.approx(25)
    assert not rep["meets_targets"]
    assert any("false_fits" in m for m in rep["target_misses"])
    text = V.render_text(rep)
    assert "gpu" in text and "false fits" in text


def test_ratchet_only_tightens(tmp_path):
    path = tmp_path / "ratchet.json"
    path.write_text(json.dumps({"schema": "ftplan.ratchet/1",
                                "figures": {"gpu.peak_allocated.median_pct": 5.0, "gpu.false_fits": 0}}))
    worse = {"figures": {"gpu.peak_allocated.median_pct": 7.0, "gpu.false_fits": 2,
                         "gpu.peak_allocated.max_pct": 9.123456}}
    changed = V.update_ratchet(worse, path)
    data = json.loads(path.read_text())["figures"]
    assert data["gpu.peak_allocated.median_pct"] == 5.0 and data["gpu.false_fits"] == 0
    assert data["gpu.peak_allocated.max_pct"] == 9.1235  # empty slot filled (rounded up)
    assert changed == ["gpu.peak_allocated.max_pct: None -> 9.1235"]
    better = {"figures": {"gpu.peak_allocated.median_pct": 2.0, "gpu.false_fits": 0}}
    V.update_ratchet(better, path)
    assert json.loads(path.read_text())["figures"]["gpu.peak_allocated.median_pct"] == 2.0
    ratchet = V.read_ratchet(path)
    assert V.check_ratchet({"figures": {**data, "gpu.peak_allocated.median_pct": 2.5}}, ratchet)
    assert not V.check_ratchet({"figures": {**data, "gpu.peak_allocated.median_pct": 1.0,
                                            "gpu.peak_allocated.max_pct": 9.0}}, ratchet)


def test_committed_records_hold_the_ratchet():
    """Current formulas over benchmarks/measurements/*.jsonl are no worse than benchmarks/ratchet.json."""
    paths = sorted((ROOT / "benchmarks" / "measurements").glob("*.jsonl"))
    if not paths:
        pytest.skip("no committed measurement records")
    records, problems = load_records(paths)
    assert problems == [], problems
    hosts, host_problems = V.machine_hosts(paths)  # as ftplan validate: each machine's host
    assert host_problems == [], host_problems
    rep = V.validate_records(records, predict_for=V.host_predictor(hosts))
    assert not any("cannot recompute" in p for p in rep["problems"]), rep["problems"]
    ratchet = V.read_ratchet(ROOT / "benchmarks" / "ratchet.json")
    assert V.check_ratchet(rep, ratchet) == []
    if "gpu" in rep["groups"]:
        assert rep["figures"]["gpu.false_fits"] == 0


def test_a_configuration_measured_again_is_scored_once_by_its_latest_record():
    """Records are append-only: a re-measurement (a harness fix, a new library) follows the old
    record; validate scores the latest and names the one it replaces. A failed re-run replaces
    nothing."""
    key = json.dumps({"model": "m", "job": {}, "layout": {}, "device": "cuda", "tiny": False})
    old, new, failed = (_record(i, alloc=a, outcome=o) for i, a, o in ((1, 80, "ok"), (2, 100, "ok"),
                                                                        (3, None, "error")))
    for r in (old, new, failed):
        r["key"] = key
    rep = V.validate_records([old, new, failed, _record(4, alloc=125)], predict_fn=_fixed_predict)
    assert rep["superseded"] == ["synthetic:1"]
    a = rep["groups"]["gpu"]["all"]["peak_allocated"]
    assert a["n"] == 2 and a["max_pct"] == pytest.approx(20)  # records 2 (0 %) and 4 (-20 %)
    assert "measured again" in V.render_text(rep) and "synthetic:1" in V.render_text(rep)


def test_gpu_records_are_predicted_with_their_machines_host(tmp_path):
    """Every H100 records file is mapped to the measuring VM's host (the runtime split's ``host``,
    for its ``files`` and ``same_machine_files``), and validate predicts a host-bound record (LoRA,
    1 x 512 tokens) with it: slower than with ftplan's default host. A split file that cannot be
    read is a problem in the report, not a crash."""
    d = ROOT / "benchmarks" / "measurements"
    files = sorted(d.glob("h100-sxm-*.jsonl"))
    hosts, problems = V.machine_hosts(files)
    assert not problems
    assert {str(f.resolve()) for f in files} <= set(hosts)
    split = json.loads((d / "h100-sxm-runtime-split.json").read_text())
    assert {h["dispatch_s_per_op"] for h in hosts.values()} == {split["host"]["dispatch_s_per_op"]["value"]}
    with_host = {(r["model"], r["job"]): r for r in V.validate_paths(files)["rows"]}
    default = {(r["model"], r["job"]): r for r in V.validate_records(load_records(files)[0])["rows"]}
    key = next(k for k in with_host if k[0] == "llama-3.1-8b" and k[1].startswith("lora") and "s=512" in k[1])
    assert with_host[key]["tokens_per_s_predicted"] < 0.8 * default[key]["tokens_per_s_predicted"]
    (tmp_path / "x-runtime-split.json").write_text("{not json")
    rec = tmp_path / "r.jsonl"
    rec.write_text(json.dumps(_record(1, alloc=GIB, reserved=GIB, tps=100.0)) + "\n")
    assert V.machine_hosts([rec])[1] and V.validate_paths([rec])["problems"]


def test_own_records_are_not_held_to_the_repositorys_ratchet(tmp_path, capsys):
    """The committed ratchet describes the committed records: ``ftplan validate MY.jsonl`` scores a
    user's records without reporting 'worse than the ratchet: no records now' for figures other
    records set; ``--ratchet FILE`` holds them to one explicitly; no paths = the committed set held
    to the committed ratchet."""
    import ftplan.cli as cli
    from ftplan import api

    rec = tmp_path / "mine.jsonl"
    rec.write_text(json.dumps(_record(1, alloc=GIB, reserved=GIB, tps=100.0, device="cpu")) + "\n")
    rep = api.validate([rec])
    assert "ratchet" not in rep
    assert cli.main(["validate", str(rec)]) == 0
    assert "ratchet" not in capsys.readouterr().out
    held = api.validate([rec], ROOT / "benchmarks" / "ratchet.json")
    assert held["ratchet"]["violations"] and held["meets_targets"] is False  # the GPU figures are absent
    assert cli.main(["validate", str(rec), "--ratchet", str(tmp_path / "none.json")]) == 2
    assert capsys.readouterr().err.strip().startswith("ftplan: error: no such file")
    if sorted((ROOT / "benchmarks" / "measurements").glob("*.jsonl")):
        assert api.validate()["ratchet"]["violations"] == []


def test_a_file_that_is_not_records_reads_as_a_few_error_lines(tmp_path, capsys):
    """Every bad line is in the report (``--json``); the terminal shows five per file and a count."""
    import ftplan.cli as cli

    bad = tmp_path / "notes.txt"
    bad.write_text("".join(f"line {i}: not a record\n" for i in range(40)))
    assert cli.main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 6 and all(e.startswith("ftplan: error:") for e in err)
    assert err[-1] == f"ftplan: error: {bad}: 35 more problem line(s) (ftplan validate --json lists them all)"
    assert cli.main(["validate", str(bad), "--json"]) == 2
    assert len(json.loads(capsys.readouterr().out)["problems"]) == 40


def _repo_copy(tmp_path: Path) -> Path:
    """A copy of the repository's benchmarks/ layout (committed records and ratchet) to work in."""
    import shutil

    root = tmp_path / "repo"
    shutil.copytree(ROOT / "benchmarks" / "measurements", root / "benchmarks" / "measurements")
    shutil.copy(ROOT / "benchmarks" / "ratchet.json", root / "benchmarks" / "ratchet.json")
    return root


def test_update_ratchet_with_own_records_needs_the_file_to_tighten(tmp_path, monkeypatch, capsys):
    """``ftplan validate MY.jsonl --update-ratchet`` used to tighten the committed ratchet with the
    figures of the user's records. It is refused (one line, exit 2) before anything is read or
    written: neither the committed ratchet nor the copy the working directory would resolve to
    changes; the library refuses the same when no file is named."""
    from ftplan import api, cli

    if not sorted((ROOT / "benchmarks" / "measurements").glob("*.jsonl")):
        pytest.skip("no committed measurement records")
    committed = (ROOT / "benchmarks" / "ratchet.json").read_bytes()
    root = _repo_copy(tmp_path)
    monkeypatch.chdir(root)  # default_ratchet_path() is now the copy: the old behaviour would write it
    copy = (root / "benchmarks" / "ratchet.json").read_bytes()
    mine = tmp_path / "mine.jsonl"  # real records, but the user's: CPU figures only
    mine.write_bytes((ROOT / "benchmarks" / "measurements" / "cpu-tiny.jsonl").read_bytes())
    assert cli.main(["validate", str(mine), "--update-ratchet"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("ftplan: error: --update-ratchet with your own record files needs --ratchet FILE")
    assert "tightened only from the committed records" in err and "Traceback" not in err
    assert (root / "benchmarks" / "ratchet.json").read_bytes() == copy
    assert (ROOT / "benchmarks" / "ratchet.json").read_bytes() == committed
    with pytest.raises(MeasurementError, match="only from the committed records"):
        V.update_ratchet(api.validate([mine]))
    assert (root / "benchmarks" / "ratchet.json").read_bytes() == copy
    assert sorted(p.name for p in (root / "benchmarks").iterdir()) == ["measurements", "ratchet.json"]


def test_update_ratchet_of_a_named_file_creates_then_tightens_it(tmp_path, capsys):
    """With ``--ratchet FILE`` a user's records tighten that file: a missing one is created from
    their figures (figures they have no records for stay null) and then holds them; a loosened
    figure is lowered again, never raised. Malformed lines (exit 2) write nothing. Plain validation
    with a missing ``--ratchet FILE`` stays a one-line error."""
    from ftplan import cli

    mine = tmp_path / "mine.jsonl"
    mine.write_bytes((ROOT / "benchmarks" / "measurements" / "cpu-tiny.jsonl").read_bytes())
    mine_rat = tmp_path / "mine-ratchet.json"
    assert cli.main(["validate", str(mine), "--ratchet", str(mine_rat)]) == 2  # plain validation
    assert "no such file" in capsys.readouterr().err and not mine_rat.exists()
    assert cli.main(["validate", str(mine), "--update-ratchet", "--ratchet", str(mine_rat), "--json"]) == 0
    out, err = capsys.readouterr()
    assert err.strip() == f"created {mine_rat}"
    rep = json.loads(out)
    assert "ratchet" not in rep  # nothing to hold the records to before the file existed
    figs = json.loads(mine_rat.read_text())["figures"]
    assert set(figs) == set(V.RATCHET_KEYS)
    assert figs["cpu.model_states.max_pct"] == 0.0 and figs["cpu.activations.max_pct"] == 0.0
    assert figs["gpu.peak_allocated.median_pct"] is None and figs["gpu.false_fits"] is None
    assert sorted(rep["ratchet_updated"]) == sorted(f"{k}: None -> 0.0" for k in figs if k.startswith("cpu."))
    assert cli.main(["validate", str(mine), "--ratchet", str(mine_rat), "--check"]) == 0
    assert f"ratchet {mine_rat}: held" in capsys.readouterr().out
    data = json.loads(mine_rat.read_text())
    data["figures"]["cpu.activations.max_pct"] = 5.0
    mine_rat.write_text(json.dumps(data))
    assert cli.main(["validate", str(mine), "--update-ratchet", "--ratchet", str(mine_rat)]) == 0
    out, err = capsys.readouterr()
    assert "ratchet tightened: cpu.activations.max_pct: 5.0 -> 0.0" in out and err == ""
    assert json.loads(mine_rat.read_text())["figures"]["cpu.activations.max_pct"] == 0.0
    # a file with a malformed line exits 2: no ratchet is created or tightened from what is left
    bad = tmp_path / "bad.jsonl"
    bad.write_text(mine.read_text() + "{not json\n")
    fresh = tmp_path / "fresh.json"
    assert cli.main(["validate", str(bad), "--update-ratchet", "--ratchet", str(fresh)]) == 2
    assert not fresh.exists()
    data["figures"]["cpu.activations.max_pct"] = 5.0
    mine_rat.write_text(json.dumps(data))
    before = mine_rat.read_bytes()
    assert cli.main(["validate", str(bad), "--update-ratchet", "--ratchet", str(mine_rat)]) == 2
    assert mine_rat.read_bytes() == before
    capsys.readouterr()


def test_plain_update_ratchet_still_tightens_the_committed_ratchet(tmp_path, monkeypatch, capsys):
    """``ftplan validate --update-ratchet`` (no RECORDS) scores the committed records, holds them
    to benchmarks/ratchet.json and lowers a figure above the one reached (here in a copy of the
    repository's layout, as the working directory)."""
    from ftplan import cli

    if not sorted((ROOT / "benchmarks" / "measurements").glob("*.jsonl")):
        pytest.skip("no committed measurement records")
    root = _repo_copy(tmp_path)
    monkeypatch.chdir(root)
    path = root / "benchmarks" / "ratchet.json"
    data = json.loads(path.read_text())
    reached = data["figures"]["gpu.peak_allocated.max_pct"]
    data["figures"]["gpu.peak_allocated.max_pct"] = 50.0
    path.write_text(json.dumps(data, indent=2) + "\n")
    assert cli.main(["validate", "--update-ratchet", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["ratchet"] == {"path": str(path), "violations": []}
    assert rep["ratchet_updated"] == [f"gpu.peak_allocated.max_pct: 50.0 -> {reached}"]
    after = json.loads(path.read_text())
    assert after["figures"] == {**data["figures"], "gpu.peak_allocated.max_pct": reached}
    assert after["_doc"] == data["_doc"]  # the notes in the file are kept
    assert cli.main(["validate", "--update-ratchet"]) == 0  # nothing left to tighten: unchanged
    assert json.loads(path.read_text()) == after and "ratchet tightened" not in capsys.readouterr().out


def test_an_interrupted_ratchet_write_leaves_the_old_file(tmp_path, monkeypatch):
    """The ratchet is written to a temporary file in its folder and renamed over the old one: a
    failing rename leaves the old bytes and no temporary file, and is a one-line error."""
    path = tmp_path / "ratchet.json"
    path.write_text(json.dumps({"schema": "ftplan.ratchet/1", "figures": {"gpu.false_fits": 3}}))
    before = path.read_bytes()

    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(V.os, "replace", fail)
    with pytest.raises(MeasurementError, match="cannot be written: No space left on device"):
        V.update_ratchet({"figures": {"gpu.false_fits": 0}}, path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["ratchet.json"]
    monkeypatch.undo()
    path.chmod(0o640)
    assert V.update_ratchet({"figures": {"gpu.false_fits": 0}}, path) == ["gpu.false_fits: 3 -> 0"]
    assert json.loads(path.read_text())["figures"]["gpu.false_fits"] == 0
    assert (path.stat().st_mode & 0o777) == 0o640 and [p.name for p in tmp_path.iterdir()] == ["ratchet.json"]
