"""``sky.yaml``: a SkyPilot task that rents the plan's hardware and runs the training script.

* ``resources``: the plan's accelerators by their SkyPilot name (``H100:8``), its provider as
  SkyPilot ``infra`` (SkyPilot >= 0.10; ``cloud``/``region``/``zone`` are deprecated there) where
  SkyPilot has that cloud, ``use_spot`` for spot offers, with ``job_recovery`` (``EAGER_NEXT_REGION``,
  for ``sky jobs launch``: a preempted run restarts elsewhere and ``train.py`` resumes from the last
  checkpoint in ``OUTPUT_DIR``). Other feasible offers of the same search that run the *same* files
  (same layout and job variant) become fallbacks, in the search's order, through
  ``resources.ordered`` (SkyPilot tries them in turn). The names come from
  ``catalog/data/skypilot_names.json`` (sources in that file).
* ``num_nodes``: the layout's nodes; ``disk_size``/``memory``: room for the weights and
  checkpoints, and the host RAM that offload needs (from the plan's memory estimate).
* ``setup`` installs the Python packages the target needs; ``run`` is the target's launch line
  (``accelerate launch ... train.py``, ``axolotl train``, ``llamafactory-cli train``); on several
  nodes with ``NODE_RANK`` = ``SKYPILOT_NODE_RANK`` and ``HEAD_IP`` = the first of
  ``SKYPILOT_NODE_IPS`` (and ``NNODES``/``MASTER_ADDR``/``MASTER_PORT`` for torchrun launchers).
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from importlib import resources
from typing import Any

from ..job import Job, Layout
from .accelerate import MAIN_PROCESS_PORT
from .yamltext import Commented, dump_yaml, user_text

__all__ = ["skypilot_names", "sky_cloud", "sky_accelerator", "sky_candidates", "render_sky_yaml",
           "setup_packages", "MAX_FALLBACKS"]

MAX_FALLBACKS = 8

_GB = 10**9


@lru_cache(maxsize=1)
def skypilot_names() -> dict[str, Any]:
    path = resources.files("ftplan.catalog") / "data" / "skypilot_names.json"
    return json.loads(path.read_text(encoding="utf-8"))


def sky_cloud(provider: str | None) -> tuple[str | None, str | None]:
    """(SkyPilot cloud, note) for an offer's provider; cloud None where SkyPilot has none."""
    if not provider:
        return None, None
    entry = skypilot_names()["providers"].get(provider.strip().lower())
    if entry is None:
        return None, f"{provider} is not a SkyPilot cloud that ftplan knows"
    return entry.get("cloud"), entry.get("note")


def sky_accelerator(gpu: str, cloud: str | None = None) -> str | None:
    """SkyPilot accelerator name of a GPU slug (per cloud where the cloud names it differently)."""
    entry = skypilot_names()["accelerators"].get(gpu)
    if entry is None:
        return None
    if cloud and cloud in entry.get("per_cloud", {}):
        return entry["per_cloud"][cloud]
    return entry.get("name")


def _same_files(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """True when plan ``b`` runs with exactly the files rendered for plan ``a``."""
    return a.get("layout") == b.get("layout") and a.get("job") == b.get("job")


def sky_candidates(plan: dict[str, Any], alternatives=()) -> tuple[list[dict[str, Any]], list[str]]:
    """The resource candidates (primary first) and notes on what could not be mapped."""
    out: list[dict[str, Any]] = []
    notes: list[str] = []
    seen: set[tuple] = set()
    for i, p in enumerate([plan, *[a for a in alternatives if _same_files(plan, a)]]):
        o = p.get("offer", {})
        provider = o.get("provider")
        cloud, cloud_note = sky_cloud(provider)
        accel = sky_accelerator(o.get("gpu", ""), cloud)
        label = f"{provider} {o.get('sku')} ({o.get('gpu')})"
        if accel is None:
            if i == 0:
                notes.append(f"{o.get('gpu')} has no SkyPilot accelerator name: the chosen offer {label} "
                             "is not in sky.yaml")
            continue
        if cloud is None and i > 0:
            continue  # a fallback on a provider SkyPilot cannot target adds nothing
        if cloud is None:
            notes.append(f"{provider}: {cloud_note or 'not a SkyPilot cloud'}; sky.yaml asks for "
                         f"{accel} on any cloud you have enabled (after the offers on named clouds)")
        count = int(o.get("gpus_per_instance") or p["layout"]["gpus_per_node"])
        spot = str(o.get("pricing", "")).lower() == "spot"
        if str(o.get("pricing", "")).lower() == "reserved" and i == 0:
            notes.append(f"the chosen offer is a reserved price ({label}); sky.yaml asks for on-demand capacity")
        if out and count != int(out[0]["accelerators"].rsplit(":", 1)[1]):
            continue  # a fallback asks for the same number of GPUs per node as the chosen offer
        key = (cloud, accel, count, spot)
        if key in seen:
            continue
        seen.add(key)
        res: dict[str, Any] = {}
        if cloud:
            res["infra"] = cloud
        res["accelerators"] = f"{accel}:{count}"
        res["use_spot"] = spot
        out.append(res)
        if len(out) > MAX_FALLBACKS:  # the chosen offer + MAX_FALLBACKS
            break
    # an offer on a provider SkyPilot cannot target becomes "any cloud": the last resort
    out.sort(key=lambda r: "infra" not in r)
    return out, notes


def transformers_floor(kind: str, family: str | None = None) -> str:
    """The lowest transformers the exported job runs on: 5.0, 5.17 for TP loading with
    ``DistributedConfig``, and the family's first release with its modeling code (qwen3_5: 5.2)."""
    from ..model import FAMILIES

    floors = ["5.17" if kind == "tp" else "5.0"]
    if family in FAMILIES:
        floors.append(FAMILIES[family].min_transformers)
    return max(floors, key=lambda v: tuple(int(x) for x in v.split(".")))


def setup_packages(job: Job, kind: str, family: str | None = None) -> list[str]:
    """pip requirement specs for the cloud machine (same floors as ftplan's ``train`` extra)."""
    # FSDP2 through accelerate's config and ParallelismConfig: accelerate >= 1.12 (the HF Trainer
    # refuses ParallelismConfig below it); TP loading with DistributedConfig: transformers >= 5.17
    accel = "accelerate>=1.12" if kind in ("fsdp", "tp") else "accelerate>=1.0"
    tf = f"transformers>={transformers_floor(kind, family)}"
    pkgs = ["torch", tf, "trl>=0.20", "datasets>=3.0", accel]
    if job.uses_lora:
        pkgs.append("peft>=0.21" if kind == "tp" else "peft>=0.17")  # LoRA on DTensor TP: peft 0.21
    if job.method == "qlora" or "8bit" in job.optimizer:
        pkgs.append("bitsandbytes>=0.45")
    if kind in ("deepspeed", "autotp"):
        pkgs.append("deepspeed>=0.16.4" if kind == "autotp" else "deepspeed>=0.16")
    if job.low_precision == "fp8-tensorwise":
        pkgs.append("torchao>=0.10")  # accelerate's fp8_backend AO
    elif job.low_precision in ("fp8-te-delayed", "mxfp8-te"):
        pkgs.append("transformer-engine[pytorch]>=2.0")  # accelerate's fp8_backend TE (builds against CUDA)
    return pkgs


def _disk_gb(params_total: int | None, job: Job, layout: Layout) -> int:
    """Local disk per node: the bf16 download + the final save (+ a sharded full checkpoint)."""
    if not params_total:
        return 256
    need = 2 * params_total * 2
    if job.method == "full":
        need += 14 * params_total / max(1, layout.nodes)  # fp32 master + Adam + bf16, sharded
    gb = need * 1.25 / _GB
    return max(256, int(math.ceil(gb / 128.0)) * 128)


def _name(text: str) -> str:
    s = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return re.sub(r"-+", "-", s)[:50].strip("-") or "ftplan"


def _run_script(layout: Layout, launch: dict[str, Any]) -> str:
    lines = [
        "set -e",
        'if [ -z "$DATASET" ]; then',
        '  echo "sky.yaml: no dataset: sky launch sky.yaml --env DATASET=<hub name or path in this folder>" >&2',
        "  exit 2",
        "fi",
    ]
    if layout.nodes > 1:
        lines += [
            'export NODE_RANK="$SKYPILOT_NODE_RANK"',
            'export HEAD_IP=$(echo "$SKYPILOT_NODE_IPS" | head -n1)',
            'export NNODES="$SKYPILOT_NUM_NODES" MASTER_ADDR="$HEAD_IP" '
            f'MASTER_PORT={MAIN_PROCESS_PORT} NPROC_PER_NODE="$SKYPILOT_NUM_GPUS_PER_NODE"',
        ]
    lines += launch.get("sky_prelude", [])
    lines.append(launch["sky_command"])
    return "\n".join(lines) + "\n"


def render_sky_yaml(plan: dict[str, Any], alternatives=(), *, job: Job, layout: Layout, kind: str,
                    model_ref: str, dataset: str | None, title: str, params_total: int | None,
                    launch: dict[str, Any] | None = None) -> tuple[str | None, list[str], list[dict[str, Any]]]:
    """(sky.yaml text or None when no offer has a SkyPilot name, notes, resource candidates)."""
    cands, notes = sky_candidates(plan, alternatives)
    if not cands:
        return None, notes + ["no offer of this plan has a SkyPilot accelerator name: no sky.yaml written"], cands
    if launch is None:
        from .accelerate import launch_command

        launch = {"packages": setup_packages(job, kind), "sky_command": launch_command(
            layout, '--model "$MODEL" --dataset "$DATASET" --output-dir "$OUTPUT_DIR"')}
    res: dict[str, Any] = {}
    if len(cands) == 1:
        res.update(cands[0])
    if any(c.get("use_spot") for c in cands):
        res["job_recovery"] = Commented(
            {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 1},
            "managed job (sky jobs launch): on preemption restart in the next region/offer; the run resumes\n"
            "from the last checkpoint in OUTPUT_DIR (mount a bucket there to keep it across machines)")
    res["disk_size"] = Commented(_disk_gb(params_total, job, layout),
                                 "GB per node: bf16 weights downloaded + saved (+ a sharded full checkpoint)")
    host = int((plan.get("memory") or {}).get("host_bytes") or 0) * layout.gpus_per_node
    if host:
        res["memory"] = Commented(f"{int(math.ceil(host * 1.25 / _GB)) + 32}+",
                                  f"host RAM per node: offload needs {host / _GB:,.0f} GB (+25 % and 32 GB)")
    if len(cands) > 1:
        res["ordered"] = Commented(cands, "tried in this order: the chosen offer first, then other offers "
                                          "of the same search that run these exact files")
    pkgs = launch["packages"]
    setup = "set -e\npip install --upgrade pip\npip install " + " ".join(f'"{p}"' for p in pkgs) + "\n"
    if job.attn_impl == "flash":
        setup += "pip install flash-attn --no-build-isolation\n"
    task: dict[str, Any] = {
        "name": _name(title),
        "workdir": Commented(".", "this folder (the bundle's files) is synced to every node"),
        "num_nodes": layout.nodes,
        "resources": res,
        "envs": {
            "MODEL": Commented(user_text(model_ref, "model reference"),
                               "hub id or path the script loads (--env MODEL=... overrides)"),
            "DATASET": Commented(user_text(dataset or "", "dataset", allow_empty=True),
                                 "hub dataset name or a file in this folder: --env DATASET=... (required)"),
            "OUTPUT_DIR": "output",
            "HF_TOKEN": Commented("", "gated models: --env HF_TOKEN (passes your local HF_TOKEN)"),
        },
        "setup": setup,
        "run": _run_script(layout, launch),
    }
    header = (f"SkyPilot task for {title}\n"
              "generated by ftplan export; run from this folder: sky launch -c ftplan sky.yaml --env DATASET=...\n"
              "(spot: sky jobs launch sky.yaml --env DATASET=... for automatic recovery); SkyPilot >= 0.10 (infra)")
    return dump_yaml(task, header=header), notes, cands
