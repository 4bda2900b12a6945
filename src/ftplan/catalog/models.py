"""The bundled model catalog and model resolution.

``resolve_model(ref)`` accepts, in this order: a catalog short name (``llama-3.1-70b``), a hub id
or alias known to the catalog (``meta-llama/Llama-3.1-70B``), a path to a ``config.json`` or to a
directory holding one, or any other hub id, fetched with ``huggingface_hub`` (optional extra;
never ``trust_remote_code``: only the config file is downloaded and parsed as JSON).

Catalog entries live in ``data/models/<name>.json``: ``{name, display_name, hf_id, aliases,
source, source_note, config}``, validated at load.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import CatalogError, ConfigError, NotFoundError, did_you_mean
from ..inputs import check_text, load_json_text, read_text_file
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


#: bounds on what ``resolve_model`` accepts as a reference and reads as a config.json
MAX_REF_CHARS = 4096  # PATH_MAX on Linux
MAX_CONFIG_BYTES = 8 * 2**20  # real config.json files are < 100 KB
#: seconds the one metadata request to the hub may take (no retries: fail fast when offline)
HUB_TIMEOUT_S = 5.0
#: a Hugging Face repo id: ``org/name``, letters, digits, ``-_.``, at most 96 characters per part
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


def _short(ref: str, n: int = 80) -> str:
    return repr(ref if len(ref) <= n else ref[:n] + "...")


def _read_config_file(path: Path) -> dict[str, Any]:
    hint = "pass a valid Hugging Face config.json"
    try:
        if path.is_dir():
            path = path / "config.json"
        is_file = path.is_file()
    except (OSError, ValueError):
        is_file = False
    if not is_file:
        raise ConfigError(f"no config.json at {_short(str(path))}", "pass a config.json file or a directory holding one")
    text = read_text_file(path, "config file", max_bytes=MAX_CONFIG_BYTES, hint=hint)
    data = load_json_text(text, f"config file {_short(str(path))}", hint=hint)
    if not isinstance(data, dict):
        raise ConfigError(f"{_short(str(path))} is not a JSON object", hint)
    return data


@contextlib.contextmanager
def _quiet_hub() -> Iterator[None]:
    """Silence huggingface_hub's log lines, Python warnings and progress bars for one call
    (restored afterwards): a failed fetch is one line of ftplan's, not ten of the hub's."""
    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logger.setLevel(logging.CRITICAL + 1)
        bars_were_off = True
        try:
            from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars

            bars_were_off = are_progress_bars_disabled()
            disable_progress_bars()
        except ImportError:  # pragma: no cover - older huggingface_hub
            pass
        try:
            yield
        finally:
            logger.setLevel(level)
            if not bars_were_off:
                from huggingface_hub.utils import enable_progress_bars

                enable_progress_bars()


def _hub_offline() -> bool:
    from huggingface_hub import constants

    env = (os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or "").strip().lower()
    return bool(getattr(constants, "HF_HUB_OFFLINE", False)) or env in ("1", "on", "yes", "true")


def _fetch_hub_config(repo_id: str) -> dict[str, Any]:
    """config.json of a hub repo: the local HF cache when offline or unreachable, else one request.

    Never retries: one metadata request with a short timeout says whether the hub is reachable and
    the repo exists; only then is the file downloaded. Offline (``HF_HUB_OFFLINE=1``, or no
    network) only the local cache is used, and a miss is one clear line, within seconds.
    """
    fix = "check the id, or pass a local config.json (offline runs need the file in the local HF cache)"
    try:
        from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url  # optional extra
        from huggingface_hub.errors import (
            EntryNotFoundError,
            GatedRepoError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:
        raise NotFoundError(
            f"model {repo_id!r} is not in the catalog and huggingface_hub is not installed",
            "pip install 'ftplan[hub]', or pass a local config.json",
        ) from None

    def cached() -> dict[str, Any] | None:
        try:
            path = hf_hub_download(repo_id, "config.json", local_files_only=True)
        except Exception:  # not cached (or a broken cache entry): same answer
            return None
        return _read_config_file(Path(path))

    with _quiet_hub():
        if _hub_offline():
            cfg = cached()
            if cfg is None:
                raise NotFoundError(f"model {repo_id!r} is not in the catalog nor in the local Hugging Face cache "
                                    "(HF_HUB_OFFLINE is set)", fix)
            return cfg
        try:
            get_hf_file_metadata(hf_hub_url(repo_id, "config.json"), timeout=HUB_TIMEOUT_S)
        except GatedRepoError:
            raise NotFoundError(f"{repo_id!r} is a gated repo on the Hugging Face hub",
                                "accept its license on huggingface.co and log in (hf auth login), "
                                "or pass a local config.json") from None
        except RepositoryNotFoundError:
            raise NotFoundError(f"unknown model {repo_id!r}: no such repo on the Hugging Face hub "
                                "(or it is private)", fix) from None
        except (EntryNotFoundError, RevisionNotFoundError):
            raise NotFoundError(f"hub repo {repo_id!r} has no config.json", "pass a local config.json") from None
        except Exception as e:  # no network, DNS, timeout, proxy, 5xx: the cache or one clear line
            cfg = cached()
            if cfg is not None:
                return cfg
            raise NotFoundError(f"cannot reach the Hugging Face hub for {repo_id!r} ({type(e).__name__}) and "
                                "its config.json is not in the local cache", fix) from None
        try:
            path = hf_hub_download(repo_id, "config.json", etag_timeout=HUB_TIMEOUT_S)
        except Exception as e:
            raise NotFoundError(f"cannot fetch config.json of {repo_id!r} from the Hugging Face hub "
                                f"({type(e).__name__})", fix) from None
    return _read_config_file(Path(path))


def resolve_model(ref: str) -> ModelSpec:
    """A ``ModelSpec`` from a catalog name/alias, a local config path, or a hub id."""
    if not isinstance(ref, str) or not ref.strip():
        raise ConfigError("empty model name", "run `ftplan models` to list the catalog")
    check_text(ref, "model name", max_chars=MAX_REF_CHARS)
    key = _index().get(ref.lower())
    if key is not None:
        return load_model_catalog()[key].spec()
    p = Path(os.path.expanduser(ref))
    try:
        exists = p.exists()
    except (OSError, ValueError):  # a name longer than NAME_MAX, ...: not a local file
        exists = False
    if exists or ref.endswith(".json"):
        cfg = _read_config_file(p)
        try:
            is_file = p.is_file()
        except OSError:
            is_file = False
        return model_from_config(cfg, name=p.stem if is_file else p.name, source=str(p))
    if ref.count("/") == 1 and _REPO_ID.match(ref) and ".." not in ref and "--" not in ref:
        cfg = _fetch_hub_config(ref)
        return model_from_config(cfg, name=ref, hf_id=ref, source=f"https://huggingface.co/{ref}")
    hint = (did_you_mean(ref, list(load_model_catalog())) if len(ref) <= 200 else None) \
        or "run `ftplan models` to list the catalog"
    raise NotFoundError(f"unknown model {_short(ref)}", hint)
