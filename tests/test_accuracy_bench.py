"""``benchmarks/accuracy.py``: the peer comparison runs over the committed records and prints both
tables (peers that are not installed are reported as unavailable, never a crash)."""

from __future__ import annotations

import importlib.util
import json
import re
import runpy
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "accuracy.py"
GIB = 1024**3
TOOLS = ("ftplan", "accelerate", "deepspeed-zero2", "deepspeed-zero3", "llm-analysis")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def _run_here(monkeypatch, capsys, *args: str, hide: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """The script run as ``python benchmarks/accuracy.py ARGS`` runs it (``runpy``, ``__main__``,
    its ``sys.exit`` status), but in this process: a subprocess spends ~4 s of CPU importing torch,
    accelerate and deepspeed again. ``hide``: modules made unimportable (``sys.modules[name] =
    None``). sys.path (the script puts src/ and benchmarks/ first) and sys.argv are restored after.
    test_committed_records_both_tables keeps the real subprocess."""
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *args])
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(ROOT)
    for name in hide:
        monkeypatch.setitem(sys.modules, name, None)
    capsys.readouterr()
    try:
        runpy.run_path(str(SCRIPT), run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out = capsys.readouterr()
    return subprocess.CompletedProcess([str(SCRIPT), *args], code, out.out, out.err)


def _table(out: str, title: str) -> dict[str, list[str]]:
    """Rows of the table that follows ``title``: {tool: cells}."""
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(title))
    rows: dict[str, list[str]] = {}
    header_seen = False
    for ln in lines[start + 1:]:
        if ln.startswith("tool "):
            header_seen = True
            continue
        if header_seen:
            cells = ln.split()
            if not cells or cells[0] not in TOOLS:
                break
            rows[cells[0]] = cells[1:]
    return rows


def test_committed_records_both_tables():
    p = _run()
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    out = p.stdout
    assert "Table 1 - GPU peak" in out and "Table 2 - model states" in out
    t1, t2 = _table(out, "Table 1"), _table(out, "Table 2")
    assert set(t1) == set(TOOLS) and set(t2) == set(TOOLS)
    committed = sorted((ROOT / "benchmarks" / "measurements").glob("*.jsonl"))
    has_tensors = any(json.loads(ln).get("measured", {}).get("tensors")
                      for f in committed for ln in f.read_text().splitlines() if ln.strip())
    if has_tensors:
        n, med, _sgn, mx = t2["ftplan"]
        assert int(n) >= 1 and med != "-" and float(mx) >= float(med)
    # which DeepSpeed / llm-analysis was used is stated, installed or not
    ds = re.search(r"^deepspeed-zero2/3: (.*)$", out, re.M)
    assert ds
    if importlib.util.find_spec("deepspeed") is None:
        assert "reimplementation" in ds.group(1)
    assert re.search(r"^llm-analysis: ", out, re.M)
    if importlib.util.find_spec("llm_analysis") is None:
        assert "llm-analysis: unavailable" in out
    assert "needs GPU records" in out


QWEN_05B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
            "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
            "tie_word_embeddings": True, "hidden_act": "silu", "rms_norm_eps": 1e-6}


def _gpu_record(i: int, outcome: str, reserved: int | None, method: str = "full") -> dict:
    job = {"method": method, "precision": "bf16-mixed", "optimizer": "adamw", "micro_batch": 2,
           "seq_len": 512, "grad_accum": 1, "gradient_checkpointing": False, "attn_impl": "sdpa",
           "lora": {"r": 16, "alpha": 32, "dropout": 0.05, "target_modules": ["all-linear"]},
           "quant": {}, "dataset_tokens": None, "epochs": 1.0}
    return {"schema": "ftplan.measurement/1", "key": f"k{i}", "outcome": outcome,
            "error": "CUDA out of memory" if outcome == "oom" else None,
            "model": {"name": "qwen2.5-0.5b", "config": QWEN_05B}, "job": job, "layout": {},
            "run": {"device": "cuda", "tiny": False},
            "env": {"gpu_name": "NVIDIA H100 80GB HBM3", "gpu_total_bytes": 80 * GIB},
            "measured": {"peak_allocated_bytes": reserved, "peak_reserved_bytes": reserved, "tensors": None}}


def test_synthetic_gpu_records_fill_table_1(tmp_path, monkeypatch, capsys):
    f = tmp_path / "gpu.jsonl"
    recs = [_gpu_record(0, "ok", 12 * GIB), _gpu_record(1, "ok", 6 * GIB, "lora"), _gpu_record(2, "oom", None)]
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    p = _run_here(monkeypatch, capsys, str(f))
    assert p.returncode == 0, p.stderr
    t1 = _table(p.stdout, "Table 1")
    n, med, _sgn, mx, ff = t1["ftplan"]
    assert int(n) == 2 and med != "-"
    # the OOM record's estimate fits 80 GiB for every tool: one false fit out of one OOM
    assert ff == "1/1"
    for tool in ("accelerate", "deepspeed-zero2", "deepspeed-zero3"):
        assert t1[tool][0] == "2" and t1[tool][-1] == "1/1"
    if importlib.util.find_spec("llm_analysis") is None:
        assert t1["llm-analysis"][0] == "0"
    # no tensor accounting in these records: the model-state table is empty but printed
    t2 = _table(p.stdout, "Table 2")
    assert t2["ftplan"][0] == "0"


def test_without_peers_falls_back(tmp_path, monkeypatch, capsys):
    """deepspeed and llm-analysis made unimportable: the reimplementation is used and said so,
    llm-analysis rows are marked unavailable, exit status 0."""
    p = _run_here(monkeypatch, capsys, hide=("deepspeed", "llm_analysis"))
    assert p.returncode == 0, p.stderr
    assert "deepspeed-zero2/3: reimplementation" in p.stdout
    assert "llm-analysis: unavailable" in p.stdout
    t2 = _table(p.stdout, "Table 2")
    assert t2["llm-analysis"][0] == "0" and "ftplan" in t2
