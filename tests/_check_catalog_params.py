"""Build every catalog model on the meta device and compare parameter counts.

Not a pytest test (the leading underscore keeps it out of collection); run it by hand:

    python tests/_check_catalog_params.py [name ...]

For each model in src/ftplan/catalog/data/models/*.json it builds the architecture with
transformers on the meta device (no weights are allocated or downloaded), counts
``sum(p.numel() for p in model.parameters())`` (tied embeddings counted once) and prints it
next to the entry's ``published_params`` when one is recorded.

Check-only adjustments (the stored files are never modified):
  * ``auto_map`` and ``quantization_config`` are removed (remote code / fp8 loading are not
    needed to build the architecture);
  * Gemma 3 (``Gemma3ForConditionalGeneration``) is built from its ``text_config`` as
    ``gemma3_text``, so the count excludes the SigLIP vision tower and projector;
  * a ``model_type`` of ``ftplan.model.MODEL_TYPE_ALIASES`` (Kimi K2's ``kimi_k2``) is built as the
    architecture it maps to (``deepseek_v3``).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parents[1] / "src" / "ftplan" / "catalog" / "data" / "models"


def build_config(config: dict):
    from transformers import AutoConfig

    cfg = dict(config)
    cfg.pop("auto_map", None)
    cfg.pop("quantization_config", None)
    model_type = cfg.pop("model_type")
    from ftplan.model import MODEL_TYPE_ALIASES  # kimi_k2 -> deepseek_v3 (its remote code)

    model_type = MODEL_TYPE_ALIASES.get(model_type, model_type)
    if model_type == "gemma3" and "text_config" in cfg:
        cfg = dict(cfg["text_config"])
        model_type = cfg.pop("model_type", "gemma3_text")
    return AutoConfig.for_model(model_type, **cfg)


def count_params(config: dict) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    hf_config = build_config(config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str]) -> int:
    warnings.filterwarnings("ignore")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    except Exception:  # pragma: no cover - logging tweak only
        pass

    paths = sorted(DATA_DIR.glob("*.json"))
    if argv:
        wanted = set(argv)
        paths = [p for p in paths if p.stem in wanted]

    header = f"{'name':<20} {'built':>18} {'published':>18}  status"
    print(header)
    print("-" * len(header))
    failures = 0
    for path in paths:
        entry = json.loads(path.read_text())
        published = entry.get("published_params")
        try:
            built = count_params(entry["config"])
        except Exception as exc:  # report and keep going
            failures += 1
            print(f"{entry['name']:<20} {'ERROR':>18} {published or '-':>18}  {type(exc).__name__}: {exc}")
            continue
        if published is None:
            status = "built only (no published figure)"
        elif built == published:
            status = "match"
        else:
            failures += 1
            status = f"MISMATCH (built - published = {built - published:+,})"
        pub = f"{published:,}" if published is not None else "-"
        print(f"{entry['name']:<20} {built:>18,} {pub:>18}  {status}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
