"""The bundled model catalog and model resolution.

``resolve_model(ref)`` accepts, in this order: a catalog short name (``llama-3.1-70b``), a hub id
or alias known to the catalog (``meta-llama/Llama-3.1-70B``), a path to a ``config.json`` or to a
directory holding one, or any other hub id, fetched with ``huggingface_hub`` (optional extra;
never ``trust_remote_code``: only the config file is downloaded and parsed as JSON).

Catalog entries live in ``data/models/<name>.json``: ``{name, display_name, hf_id, aliases,
source, source_note, config}``, validated at load.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import CatalogError, ConfigError, NotFoundError, did_you_mean
from ..model import ModelSpec, model_from_config

__all__ = ["CatalogModel", "load_model_catalog", "resolve_model", "get_model"]


@dataclass(frozen=True)
class CatalogModel:
    name: str
    display_name: str
    hf_id: str
    aliases: tuple[str, ...]
    source: str
    config: dict[str, Any]
    published_params: int | None = None

    def spec(self) -> ModelSpec:
        return model_from_config(self.config, name=self.name, hf_id=self.hf_id, source=self.source)


def _parse_entry(data: Any, where: str) -> CatalogModel:
    if not isinstance(data, dict):
        raise CatalogError(f"{where}: a model entry must be a JSON object")
    for key in ("name", "hf_id", "source", "config"):
        if not data.get(key):
            raise CatalogError(f"{where}: missing required field {key!r}")
    if not isinstance(data["config"], dict):
        raise CatalogError(f"{where}: 'config' must be an object (the model's config.json)")
    aliases = data.get("aliases") or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise CatalogError(f"{where}: 'aliases' must be a list of strings")
    pub = data.get("published_params")
    return CatalogModel(
        name=data["name"],
        display_name=data.get("display_name") or data["name"],
        hf_id=data["hf_id"],
        aliases=tuple(aliases),
        source=data["source"],
        config=data["config"],
        published_params=pub if isinstance(pub, int) else None,
    )


@lru_cache(maxsize=1)
def load_model_catalog() -> dict[str, CatalogModel]:
    """All bundled models by short name (read on first call, validated)."""
    root = resources.files("ftplan.catalog") / "data" / "models"
    out: dict[str, CatalogModel] = {}
    for item in sorted(root.iterdir(), key=lambda p: p.name):
        if not item.name.endswith(".json"):
            continue
        where = f"models/{item.name}"
        try:
            data = json.loads(item.read_text())
        except json.JSONDecodeError as e:
            raise CatalogError(f"{where}: invalid JSON ({e})") from None
        entry = _parse_entry(data, where)
        if entry.name in out:
            raise CatalogError(f"{where}: duplicate model name {entry.name!r}")
        out[entry.name] = entry
    return out


@lru_cache(maxsize=1)
def _index() -> dict[str, str]:
    idx: dict[str, str] = {}
    for name, m in load_model_catalog().items():
        for key in (name, m.hf_id, *m.aliases):
            k = key.lower()
            if k in idx and idx[k] != name:
                raise CatalogError(f"model alias {key!r} is claimed by both {idx[k]!r} and {name!r}")
            idx[k] = name
    return idx


def get_model(name: str) -> CatalogModel:
    """A catalog entry by short name, hub id or alias (case-insensitive)."""
    key = _index().get(name.lower())
    if key is None:
        hint = did_you_mean(name, list(load_model_catalog())) or "run `ftplan models` to list the catalog"
        raise NotFoundError(f"unknown model {name!r}", hint)
    return load_model_catalog()[key]


def _read_config_file(path: Path) -> dict[str, Any]:
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(f"no config.json at {str(path)!r}", "pass a config.json file or a directory holding one")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"cannot parse {str(path)!r} as JSON: {e}", "pass a valid Hugging Face config.json") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{str(path)!r} is not a JSON object", "pass a valid Hugging Face config.json")
    return data


def _fetch_hub_config(repo_id: str) -> dict[str, Any]:
    try:
        from huggingface_hub import hf_hub_download  # optional extra, imported only here
    except ImportError:
        raise NotFoundError(
            f"model {repo_id!r} is not in the catalog and huggingface_hub is not installed",
            "pip install 'ftplan[hub]', or pass a local config.json",
        ) from None
    try:
        path = hf_hub_download(repo_id, "config.json")
    except Exception as e:  # offline, gated, missing: one clear line
        kind = type(e).__name__
        raise NotFoundError(
            f"cannot fetch config.json of {repo_id!r} from the Hugging Face hub ({kind})",
            "check the id and your network (offline runs need the file in the local HF cache), "
            "or pass a local config.json",
        ) from None
    return _read_config_file(Path(path))


def resolve_model(ref: str) -> ModelSpec:
    """A ``ModelSpec`` from a catalog name/alias, a local config path, or a hub id."""
    if not ref or not ref.strip():
        raise ConfigError("empty model name", "run `ftplan models` to list the catalog")
    key = _index().get(ref.lower())
    if key is not None:
        return load_model_catalog()[key].spec()
    p = Path(os.path.expanduser(ref))
    if p.exists() or ref.endswith(".json"):
        cfg = _read_config_file(p)
        return model_from_config(cfg, name=p.stem if p.is_file() else p.name, source=str(p))
    if ref.count("/") == 1 and " " not in ref:
        cfg = _fetch_hub_config(ref)
        return model_from_config(cfg, name=ref, hf_id=ref, source=f"https://huggingface.co/{ref}")
    hint = did_you_mean(ref, list(load_model_catalog())) or "run `ftplan models` to list the catalog"
    raise NotFoundError(f"unknown model {ref!r}", hint)
