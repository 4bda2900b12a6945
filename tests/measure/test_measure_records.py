"""Measurement records: crash-safe appends, torn lines, malformed lines (no torch needed)."""

from __future__ import annotations

import json

import pytest

from ftplan.errors import MeasurementError
from ftplan.job import Job, Layout, LoraSpec, QuantSpec
from ftplan.measure.records import (
    SCHEMA,
    append_record,
    existing_keys,
    job_from_dict,
    job_to_dict,
    layout_from_dict,
    layout_to_dict,
    load_records,
    record_key,
)


def _rec(i: int, outcome: str = "ok") -> dict:
    return {"schema": SCHEMA, "key": f"k{i}", "outcome": outcome, "error": None, "model": {}, "job": {},
            "layout": {}, "run": {}, "measured": {"i": i}}


def test_append_never_rewrites_earlier_lines(tmp_path):
    f = tmp_path / "sub" / "r.jsonl"
    append_record(f, _rec(1))
    first = f.read_bytes()
    append_record(f, _rec(2))
    append_record(f, _rec(3))
    data = f.read_bytes()
    assert data.startswith(first)  # the earlier bytes are untouched
    assert data.endswith(b"\n") and data.count(b"\n") == 3
    recs, problems = load_records([f])
    assert [r["measured"]["i"] for r in recs] == [1, 2, 3] and problems == []
    assert recs[1]["_source"] == f"{f}:2"


def test_torn_last_line_is_kept_and_stepped_over(tmp_path):
    f = tmp_path / "r.jsonl"
    append_record(f, _rec(1))
    with open(f, "ab") as fh:  # a writer killed mid-line
        fh.write(b'{"schema": "ftplan.measurement/1", "key": "k2", "outc')
    before = f.read_bytes()
    append_record(f, _rec(3))
    after = f.read_bytes()
    assert after.startswith(before)  # never truncated
    recs, problems = load_records([f])
    assert [r["key"] for r in recs] == ["k1", "k3"]
    assert len(problems) == 1 and problems[0].startswith(f"{f}:2: malformed JSON")


def test_malformed_and_foreign_lines_reported_with_file_line(tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps(_rec(1)) + "\nnot json\n" + json.dumps({"schema": "other/1"}) + "\n\n"
                 + json.dumps({**_rec(4), "outcome": "weird"}) + "\n")
    recs, problems = load_records([f])
    assert len(recs) == 1
    assert [p.split(": ")[0] for p in problems] == [f"{f}:2", f"{f}:3", f"{f}:5"]


def test_missing_file_is_one_error(tmp_path):
    with pytest.raises(MeasurementError, match="no record file"):
        load_records([tmp_path / "nope.jsonl"])
    recs, problems = load_records([tmp_path / "nope.jsonl"], strict_files=False)
    assert recs == [] and "no such file" in problems[0]


def test_refuses_records_without_schema(tmp_path):
    with pytest.raises(MeasurementError):
        append_record(tmp_path / "r.jsonl", {"key": "x"})


def test_job_layout_roundtrip_and_key():
    job = Job(method="qlora", micro_batch=4, seq_len=512, gradient_checkpointing=True,
              lora=LoraSpec(r=8, target_modules=("q_proj", "v_proj")), quant=QuantSpec(quant_type="fp4"))
    d = json.loads(json.dumps(job_to_dict(job)))
    assert job_from_dict(d) == job
    lay = Layout()
    assert layout_from_dict(json.loads(json.dumps(layout_to_dict(lay)))) == lay
    k1 = record_key("m", job, lay, "cuda", False)
    assert k1 == record_key("m", job_from_dict(d), lay, "cuda", False)
    assert k1 != record_key("m", job.with_(micro_batch=2), lay, "cuda", False)
    assert k1 != record_key("m", job, lay, "cpu", False)


def test_existing_keys_retries_errors(tmp_path):
    f = tmp_path / "r.jsonl"
    append_record(f, _rec(1, "ok"))
    append_record(f, _rec(2, "oom"))
    append_record(f, _rec(3, "error"))
    assert existing_keys(f) == {"k1", "k2"}
    assert existing_keys(tmp_path / "none.jsonl") == set()


def test_every_bundled_matrix_loads_and_its_rows_are_valid_jobs():
    """benchmarks/matrices/*.yaml are what run_campaign.sh runs on a lent GPU: each row must parse
    (YAML lists of target modules included) and be a valid job, before any GPU time is spent."""
    from pathlib import Path

    from ftplan.cli.measure import _row_job
    from ftplan.measure.run import load_matrix

    files = sorted((Path(__file__).resolve().parents[2] / "benchmarks" / "matrices").glob("*.yaml"))
    assert files
    for f in files:
        rows = load_matrix(f)
        assert rows, f
        seen: dict[str, int] = {}
        for i, row in enumerate(rows, 1):
            job = _row_job(row, f"{f.name} row {i}")
            # no row describes the same job as an earlier one (it would be skipped as measured):
            # a default that changed can make two rows equal
            key = record_key(str(row["model"]), job, Layout(), "cuda", bool(row.get("tiny")))
            assert key not in seen, f"{f.name}: row {i} is row {seen.get(key)} again"
            seen[key] = i


def test_a_record_from_before_a_job_field_existed_is_still_recognised(tmp_path):
    """A key is the JSON of every job field, so a field added later changes it; resuming reads the
    stored job back (a missing field gets the value the older version measured) and re-keys it."""
    job = Job(method="lora", micro_batch=2, seq_len=64, loss="hf")
    lay = Layout()
    new_key = record_key("qwen2.5-0.5b", job, lay, "cpu", True)
    old_job = job_to_dict(job)
    del old_job["loss"]  # records written before the loss path was a job option
    ident = json.loads(new_key)
    del ident["job"]["loss"]
    old = {**_rec(1), "key": json.dumps(ident, sort_keys=True, separators=(",", ":")), "job": old_job,
           "layout": layout_to_dict(lay)}
    f = tmp_path / "r.jsonl"
    append_record(f, old)
    assert old["key"] != new_key
    assert existing_keys(f) == {new_key}
    # ...and it is not mistaken for the job that the current default loss path describes
    assert record_key("qwen2.5-0.5b", job.with_(loss="trl"), lay, "cpu", True) not in existing_keys(f)


def test_the_bundled_cpu_matrix_describes_its_bundled_records():
    """Re-running benchmarks/matrices/cpu-tiny.yaml into its records file measures nothing again:
    every row pins what ftplan's changing defaults would otherwise alter."""
    from pathlib import Path

    from ftplan.cli.measure import _row_job
    from ftplan.measure.run import load_matrix

    root = Path(__file__).resolve().parents[2] / "benchmarks"
    done = existing_keys(root / "measurements" / "cpu-tiny.jsonl")
    rows = load_matrix(root / "matrices" / "cpu-tiny.yaml")
    missing = [row for i, row in enumerate(rows, 1)
               if record_key(str(row["model"]), _row_job(row, f"row {i}"), Layout(), "cpu", True) not in done]
    assert not missing
    assert len(done) == len(rows)
