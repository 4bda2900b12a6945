"""Planner speed: wall time of the whole ``ftplan recommend`` process and the candidate rate.

    python benchmarks/planner_speed.py [--runs 7] [--json]

Runs ``ftplan recommend llama-3.1-70b --method qlora --tokens 20M --seq-len 4096`` as a
subprocess several times (median wall time, goal < 1 s on 2 cores), then times ``recommend`` in
process to report candidates evaluated per second. Uses a temporary Llama-3.1-70B config when
the catalog entry is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ARGS = ["--method", "qlora", "--tokens", "20M", "--seq-len", "4096"]
CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 8192,
          "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
          "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False,
          "max_position_embeddings": 131072}

_CLI = "import sys, ftplan.cli as c\nsys.exit(c.main(sys.argv[1:]))\n"


def _model_ref() -> str:
    from ftplan.catalog.models import load_model_catalog

    if "llama-3.1-70b" in load_model_catalog():
        return "llama-3.1-70b"
    fd, path = tempfile.mkstemp(suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(CONFIG, f)
    return path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    ref = _model_ref()
    cmd = [sys.executable, "-c", _CLI, "recommend", ref, *ARGS]
    walls = []
    for _ in range(a.runs):
        t = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        walls.append(time.perf_counter() - t)
        if r.returncode not in (0, 3):
            print(r.stderr, file=sys.stderr)
            return 1
    from ftplan.catalog.models import resolve_model
    from ftplan.catalog.offers import load_offers
    from ftplan.job import Job
    from ftplan.planner import recommend

    model = resolve_model(ref)
    offers = load_offers()
    job = Job(method="qlora", seq_len=4096, dataset_tokens=20_000_000)
    rates, searches = [], []
    for _ in range(3):
        ps = recommend(model, job, offers)
        searches.append(ps.stats.seconds)
        rates.append(ps.stats.candidates_per_s)
    s = ps.stats
    doc = {"command": "ftplan recommend " + " ".join(["llama-3.1-70b", *ARGS]),
           "runs": a.runs, "wall_s_median": statistics.median(walls), "wall_s_min": min(walls),
           "wall_s_max": max(walls), "search_s_median": statistics.median(searches),
           "offers": s.offers, "gpu_types": s.gpu_types, "layouts": s.layouts, "candidates": s.candidates,
           "memory_evals": s.memory_evals, "runtime_evals": s.runtime_evals,
           "candidates_per_s": statistics.median(rates), "cpus": os.cpu_count(), "goal_s": 1.0}
    if a.json:
        print(json.dumps(doc, indent=2))
    else:
        for k, v in doc.items():
            print(f"{k:>18}: {v:.3f}" if isinstance(v, float) else f"{k:>18}: {v}")
    return 0 if doc["wall_s_median"] < 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
