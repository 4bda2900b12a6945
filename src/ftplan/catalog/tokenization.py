"""Token-count estimates per tokenizer family from ``data/tokenization.json``.

Used by :mod:`ftplan.dataset` when no ``tokenizer.json`` is given: characters per token of each
family's tokenizer (published measurements, with sources) and the tokens a chat template adds
per message turn and per conversation. Loaded on first use and validated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from ..errors import CatalogError, ConfigError

__all__ = ["TokenEstimate", "token_estimate", "load_tokenization"]


@dataclass(frozen=True)
class TokenEstimate:
    """How ftplan estimates token counts for one model without its tokenizer."""

    tokenizer: str  # key in tokenization.json, e.g. "llama3"
    chars_per_token: float
    text_special_tokens: int  # BOS/EOS added to a plain-text sample
    template: str
    per_turn: int  # chat-template tokens per message, besides the content
    per_conversation: int  # chat-template tokens once per conversation (BOS, default system block)
    source: str
    template_source: str


def _num(entry: dict, key: str, where: str, *, positive: bool = True) -> float:
    v = entry.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (positive and v == 0):
        raise CatalogError(f"{where}: {key!r} must be a {'positive' if positive else 'non-negative'} number, got {v!r}")
    return v


@lru_cache(maxsize=1)
def load_tokenization() -> dict:
    path = resources.files("ftplan.catalog") / "data" / "tokenization.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise CatalogError(f"cannot read bundled tokenization.json: {e}") from None
    toks, temps = data.get("tokenizers", {}), data.get("templates", {})
    for name, t in temps.items():
        where = f"tokenization.json templates.{name}"
        _num(t, "per_turn", where, positive=False)
        _num(t, "per_conversation", where, positive=False)
        if not t.get("source"):
            raise CatalogError(f"{where}: no 'source'")
    for name, t in toks.items():
        where = f"tokenization.json tokenizers.{name}"
        _num(t, "chars_per_token", where)
        _num(t, "text_special_tokens", where, positive=False)
        if not t.get("source"):
            raise CatalogError(f"{where}: no 'source'")
        if t.get("template") not in temps:
            raise CatalogError(f"{where}: unknown template {t.get('template')!r}")
    for table in ("families", "models"):
        for k, v in data.get(table, {}).items():
            if v is None and table == "models":  # a model whose tokenizer no figure describes
                continue
            if v not in toks:
                raise CatalogError(f"tokenization.json {table}.{k}: unknown tokenizer {v!r}")
    return data


def token_estimate(model_name: str | None, family: str) -> TokenEstimate:
    """The estimate for a catalog model name (override) or its ``model_type`` family."""
    data = load_tokenization()
    models = data.get("models", {})
    if (model_name or "") in models and models[model_name] is None:
        raise ConfigError(f"no token estimate for {model_name}: its tokenizer has no measured chars-per-token "
                          "figure",
                          "pass `tokenizer=tokenizer.json` for an exact count")
    key = models.get(model_name or "") or data.get("families", {}).get(family)
    if key is None:
        raise ConfigError(f"no token estimate for model family {family!r}",
                           "pass `tokenizer=tokenizer.json` for an exact count")
    t = data["tokenizers"][key]
    tmpl = data["templates"][t["template"]]
    return TokenEstimate(
        tokenizer=key,
        chars_per_token=float(t["chars_per_token"]),
        text_special_tokens=int(t["text_special_tokens"]),
        template=t["template"],
        per_turn=int(tmpl["per_turn"]),
        per_conversation=int(tmpl["per_conversation"]),
        source=t["source"],
        template_source=tmpl["source"],
    )
