"""The user's training data: sample lengths, the batches a loader forms, and what they cost.

``profile_dataset(path, ...) -> DatasetProfile`` reads a JSONL file, a Parquet file or a local
Hugging Face ``datasets`` folder (``save_to_disk`` arrow files, or parquet/jsonl files in a
folder) and measures every sample's length in tokens: exactly with a local ``tokenizer.json``
(through the ``tokenizers`` package, imported only then), otherwise from a documented
characters-per-token estimate of the model's tokenizer family plus the tokens its chat template
adds (``catalog/data/tokenization.json``, every figure with its source).

``simulate_batches(profile, batching, max_length, micro_batch, ...) -> Batches`` replays what the
training loader does with those lengths:

* ``padded``: every row padded to ``max_length`` (``padding="max_length"``);
* ``longest``: rows padded to the longest in the micro-batch (HF / TRL default collator), in a
  random order (``RandomSampler``);
* ``bucketed``: ``train_sampling_strategy="group_by_length"`` (transformers'
  ``LengthGroupedSampler``: mega-batches of ``min(n // (4 b), 50)`` x ``b`` samples, ``b`` =
  micro-batch x gradient accumulation, sorted by length, cut into micro-batches);
* ``packed``: TRL ``packing=True, packing_strategy="bfd"``: samples truncated to ``max_length``,
  best-fit-decreasing packs of at most ``max_length`` tokens built per chunk of 1,000 samples
  (``datasets.map``'s default batch size), then - TRL turns padding-free on with bfd - each
  micro-batch of packs flattened into one row with ``position_ids``;
* ``padding-free``: TRL ``padding_free=True`` without packing: a micro-batch of truncated samples
  flattened into one row.

The peak memory is set by the largest micro-batch the loader can form (``Batches.peak_rows`` x
``Batches.peak_seq_len``), not by ``seq_len``; time and cost follow the tokens the model
actually computes on (``computed_tokens``, padding included), while $/M tokens counts the real
ones. ``plan_dataset`` puts these together with ``estimate_memory`` / ``estimate_runtime`` /
``estimate_cost``.

Bad or huge files: JSONL is streamed line by line with a bounded line size; a file with more
samples than ``max_samples`` is read twice (count, then a uniform random sample with a fixed
seed; the longest lines by bytes are measured too, apart, so the worst batch is not missed); every
problem is one :class:`ConfigError` naming the file and line.
"""

from __future__ import annotations

import heapq
import json
import math
import os
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .job import Job, Layout

__all__ = [
    "BATCHINGS",
    "DatasetProfile",
    "Batches",
    "DatasetPlan",
    "profile_dataset",
    "profile_from_lengths",
    "simulate_batches",
    "plan_dataset",
    "bfd_pack",
    "MAX_LINE_BYTES",
    "DEFAULT_MAX_SAMPLES",
]

BATCHINGS = ("padded", "longest", "bucketed", "packed", "padding-free")
#: a JSONL line longer than this is refused (one clear error instead of a memory blow-up)
MAX_LINE_BYTES = 64 * 2**20
#: files with more samples are sampled uniformly (seeded); the longest lines are always kept
DEFAULT_MAX_SAMPLES = 200_000
#: the longest lines (by bytes) always measured when a file is sampled
_KEEP_LONGEST = 256
#: ``datasets.Dataset.map(batched=True)`` default batch size: TRL packs per chunk of this many
_PACK_CHUNK = 1000
_TEXT_KEYS = ("text",)
_COLUMNS = frozenset({"text", "messages", "conversations", "prompt", "completion"})


# ---------------------------------------------------------------------------------------------
# profile
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DatasetProfile:
    """Token length of every (sampled) sample of a dataset file."""

    path: str
    file_format: str  # "jsonl" | "parquet" | "arrow"
    kind: str  # "text" | "messages" | "prompt-completion"
    lengths: tuple[int, ...]  # tokens per measured sample (untruncated), in file order
    total_samples: int  # samples in the file (>= len(lengths) when sampled)
    counter: str  # "tokenizer.json" or "estimate"
    counter_detail: str  # tokenizer path, or the estimate's figures and sources
    sampled: bool = False
    sampling: str | None = None
    skipped_empty: int = 0
    notes: tuple[str, ...] = ()
    #: when sampled: the lengths of the longest lines by bytes, measured apart from the uniform
    #: sample (they set the peak batch; the totals and percentiles use the uniform sample only)
    longest: tuple[int, ...] = ()

    @property
    def top_lengths(self) -> list[int]:
        """Every length known, longest first (the uniform sample and the longest lines)."""
        return sorted(self.lengths + self.longest, reverse=True)

    @property
    def measured(self) -> int:
        return len(self.lengths)

    @property
    def scale(self) -> float:
        """Factor from the measured samples to the whole file."""
        return self.total_samples / self.measured if self.measured else 0.0

    @property
    def total_tokens(self) -> int:
        """Tokens in the whole file (estimated from the sample when sampled), before truncation."""
        return round(sum(self.lengths) * self.scale)

    @property
    def max_length(self) -> int:
        return max(self.lengths + self.longest) if (self.lengths or self.longest) else 0

    def percentile(self, q: float) -> int:
        """The smallest length L such that at least ``q`` % of the samples have length <= L."""
        if not self.lengths:
            return 0
        if not 0 < q <= 100:
            raise ConfigError(f"percentile must be in (0, 100] (got {q})", "e.g. 95")
        s = sorted(self.lengths)
        k = max(0, math.ceil(q / 100.0 * len(s)) - 1)
        return s[k]

    def cutoff(self, keep_pct: float) -> int:
        """The sequence-length cut-off that keeps ``keep_pct`` % of samples untruncated."""
        return self.percentile(keep_pct)

    def untruncated_fraction(self, max_length: int) -> float:
        if not self.lengths:
            return 1.0
        return sum(1 for x in self.lengths if x <= max_length) / len(self.lengths)

    def histogram(self, edges: Sequence[int] | None = None) -> list[tuple[int, int, int]]:
        """(low, high, count) bins; default edges are powers of two up to the longest sample."""
        if not self.lengths:
            return []
        if edges is None:
            top = self.max_length
            edges = [0]
            e = 64
            while e < top:
                edges.append(e)
                e *= 2
            edges.append(max(e, top))
        edges = sorted(set(int(x) for x in edges))
        counts = [0] * (len(edges) - 1)
        for x in self.lengths:
            for i in range(len(edges) - 1):
                if edges[i] < x <= edges[i + 1] or (i == 0 and x == edges[0]):
                    counts[i] += 1
                    break
        return [(edges[i], edges[i + 1], counts[i]) for i in range(len(counts))]

    def summary(self) -> dict[str, Any]:
        return {
            "path": self.path, "format": self.file_format, "kind": self.kind,
            "samples": self.total_samples, "measured": self.measured, "sampled": self.sampled,
            "sampling": self.sampling, "counter": self.counter, "counter_detail": self.counter_detail,
            "total_tokens": self.total_tokens, "max": self.max_length,
            "p50": self.percentile(50), "p90": self.percentile(90), "p95": self.percentile(95),
            "p99": self.percentile(99), "skipped_empty": self.skipped_empty,
        }


def profile_from_lengths(lengths: Iterable[int], *, path: str = "<lengths>", kind: str = "text",
                         total_samples: int | None = None) -> DatasetProfile:
    """A profile from known token lengths (tests, or lengths computed elsewhere)."""
    ls = tuple(int(x) for x in lengths)
    if any(x < 0 for x in ls):
        raise ConfigError("sample lengths must be >= 0")
    return DatasetProfile(path=path, file_format="lengths", kind=kind, lengths=ls,
                          total_samples=total_samples if total_samples is not None else len(ls),
                          counter="given", counter_detail="lengths given")


# ---------------------------------------------------------------------------------------------
# counting tokens
# ---------------------------------------------------------------------------------------------
class _Counter:
    """Counts tokens of a batch of records (exact with a tokenizer, else the family estimate)."""

    def __init__(self, tokenizer_path: str | None, model_name: str | None, family: str | None) -> None:
        from .catalog.tokenization import token_estimate

        self.tok = None
        self.est = token_estimate(model_name, family or "llama") if (family or model_name) else None
        if tokenizer_path is not None:
            self.tok = _load_tokenizer(tokenizer_path)
            self.kind = "tokenizer.json"
            self.detail = str(tokenizer_path)
            if self.est is not None:
                self.detail += (f"; chat template overhead estimated from the {self.est.template} template "
                                f"({self.est.per_turn} per turn, {self.est.per_conversation} per conversation)")
        else:
            if self.est is None:
                raise ConfigError("no model family to estimate tokens from",
                                  "pass `tokenizer=tokenizer.json` or a model")
            self.kind = "estimate"
            e = self.est
            self.detail = (f"{e.tokenizer}: {e.chars_per_token:g} chars/token ({e.source}); "
                           f"template {e.template}: +{e.per_turn}/turn, +{e.per_conversation}/conversation; "
                           f"plain text +{e.text_special_tokens} (BOS/EOS)")

    def _count(self, texts: list[str], specials: bool) -> list[float]:
        if self.tok is not None:
            encs = self.tok.encode_batch(texts, add_special_tokens=specials)
            return [float(len(e.ids)) for e in encs]
        cpt = self.est.chars_per_token
        return [len(t) / cpt for t in texts]

    def lengths(self, kind: str, records: list[Any]) -> list[int]:
        """Token length of each record (already reduced to strings / message lists)."""
        if kind == "text":
            # plain text: the tokenizer's own specials (BOS) + the EOS TRL appends
            n = self._count(records, True)
            if self.tok is not None:
                return [int(x) + 1 for x in n]
            return [math.ceil(x) + self.est.text_special_tokens for x in n]
        if kind == "prompt-completion-text":
            n = self._count([p + c for p, c in records], True)
            if self.tok is not None:
                return [int(x) + 1 for x in n]
            return [math.ceil(x) + self.est.text_special_tokens for x in n]
        # messages: content tokens + the template's per-turn and per-conversation tokens
        flat: list[str] = []
        turns: list[int] = []
        for msgs in records:
            turns.append(len(msgs))
            flat.append("".join(msgs))
        n = self._count(flat, False)
        per_turn = self.est.per_turn if self.est is not None else 0
        per_conv = self.est.per_conversation if self.est is not None else 0
        return [math.ceil(x) + per_turn * t + per_conv for x, t in zip(n, turns)]


def _load_tokenizer(path: str):
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise ConfigError(f"tokenizer file {path} not found", "pass a tokenizer.json (or a folder holding one)")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ConfigError("`tokenizer` needs the 'tokenizers' package",
                          "pip install 'ftplan[data]' (or transformers), or leave `tokenizer` out for an estimate") from None
    try:
        return Tokenizer.from_file(str(p))
    except Exception as e:  # tokenizers raises plain Exception subclasses
        raise ConfigError(f"{p}: not a valid tokenizer.json ({str(e).splitlines()[0][:200]})",
                          "pass the tokenizer.json of the model (Hugging Face fast tokenizer format)") from None


# ---------------------------------------------------------------------------------------------
# records -> strings
# ---------------------------------------------------------------------------------------------
def _content(c: Any) -> str:
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):  # multimodal-style parts: keep the text parts
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in c)
    return str(c)


def _detect_kind(keys: Iterable[str], text_field: str | None) -> str:
    keys = set(keys)
    if text_field:
        if text_field not in keys:
            raise ConfigError(f"column {text_field!r} not in the dataset (it has {', '.join(sorted(keys))})",
                              "pass an existing column as `text_field`")
        return "text"
    if "messages" in keys or "conversations" in keys:
        return "messages"
    if "prompt" in keys and "completion" in keys:
        return "prompt-completion"
    for k in _TEXT_KEYS:
        if k in keys:
            return "text"
    raise ConfigError(
        f"no text, messages, conversations or prompt/completion column (found: {', '.join(sorted(keys)) or 'none'})",
        "use TRL's dataset formats: {'text': ...}, {'messages': [{'role', 'content'}]}, or {'prompt', 'completion'}",
    )


def _messages(v: Any, where: str) -> list[str]:
    if not isinstance(v, list):
        raise ConfigError(f"{where}: messages must be a list of {{role, content}} objects")
    out = []
    for m in v:
        if not isinstance(m, dict):
            raise ConfigError(f"{where}: a message is not an object")
        if "content" in m:
            out.append(_content(m.get("content")))
        elif "value" in m:  # ShareGPT {"from", "value"}: TRL converts it to ChatML
            out.append(_content(m.get("value")))
        else:
            raise ConfigError(f"{where}: a message has no 'content'")
    return out


def _reduce(rec: Any, kind: str, text_field: str | None, where: str) -> tuple[str, Any] | None:
    """(counting kind, payload) of one record, or None when it is empty."""
    if not isinstance(rec, dict):
        raise ConfigError(f"{where}: a record must be a JSON object, got {type(rec).__name__}")
    if kind == "text":
        v = rec.get(text_field or "text")
        if v is None:
            raise ConfigError(f"{where}: no {text_field or 'text'!r} field", "every record needs the same columns")
        s = _content(v)
        return ("text", s) if s else None
    if kind == "messages":
        v = rec.get("messages", rec.get("conversations"))
        if v is None:
            raise ConfigError(f"{where}: no 'messages' field", "every record needs the same columns")
        msgs = _messages(v, where)
        return ("messages", msgs) if msgs else None
    p, c = rec.get("prompt"), rec.get("completion")
    if p is None or c is None:
        raise ConfigError(f"{where}: no 'prompt'/'completion' field", "every record needs the same columns")
    if isinstance(p, list) or isinstance(c, list):  # conversational prompt/completion
        msgs = (_messages(p, where) if isinstance(p, list) else [_content(p)]) + \
               (_messages(c, where) if isinstance(c, list) else [_content(c)])
        return "messages", msgs
    return "prompt-completion-text", (_content(p), _content(c))


# ---------------------------------------------------------------------------------------------
# readers: each yields (location, record) for the selected indices
# ---------------------------------------------------------------------------------------------
def _jsonl_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of every non-blank line, streamed; a line over ``MAX_LINE_BYTES`` is
    refused."""
    with open(path, "rb") as f:
        lineno = 0
        while True:
            line = f.readline(MAX_LINE_BYTES + 1)
            if not line:
                return
            lineno += 1
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                raise ConfigError(f"{path}: line {lineno} is longer than {MAX_LINE_BYTES // 2**20} MiB",
                                  "one JSON record per line; split huge records")
            if line.strip():
                yield lineno, line


def _scan_jsonl(path: Path) -> tuple[int, list[int]]:
    """(number of non-blank lines, indices of the longest lines by bytes), streamed."""
    n = 0
    heap: list[tuple[int, int]] = []
    for _, line in _jsonl_lines(path):
        item = (len(line), n)
        if len(heap) < _KEEP_LONGEST:
            heapq.heappush(heap, item)
        elif item > heap[0]:
            heapq.heapreplace(heap, item)
        n += 1
    return n, [i for _, i in heap]


def _iter_jsonl(path: Path, wanted: set[int] | None) -> Iterator[tuple[int, str, Any]]:
    for idx, (lineno, line) in enumerate(_jsonl_lines(path)):
        if wanted is not None and idx not in wanted:
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            msg = e.msg if isinstance(e, json.JSONDecodeError) else "not UTF-8"
            raise ConfigError(f"{path}: line {lineno} is not valid JSON ({msg})",
                              "the file must be JSON Lines: one JSON object per line") from None
        yield idx, f"{path}: line {lineno}", rec


def _pyarrow():
    try:
        import pyarrow  # noqa: F401
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ConfigError("reading Parquet / Arrow datasets needs pyarrow",
                          "pip install 'ftplan[data]', or convert the data to JSONL") from None
    import pyarrow

    return pyarrow


def _arrow_tables(path: Path) -> tuple[str, list[Path]]:
    """(format, files) of a parquet file, an arrow file or a datasets folder."""
    if path.is_file():
        suf = path.suffix.lower()
        if suf == ".parquet":
            return "parquet", [path]
        if suf == ".arrow":
            return "arrow", [path]
        raise ConfigError(f"{path}: unknown dataset format {suf or '(no extension)'}",
                          "use .jsonl, .parquet, or a Hugging Face datasets folder")
    # a DatasetDict saved with save_to_disk: pick the train split
    dd = path / "dataset_dict.json"
    if dd.is_file():
        try:
            splits = json.loads(dd.read_text(encoding="utf-8")).get("splits") or []
        except (OSError, json.JSONDecodeError, AttributeError):
            raise ConfigError(f"{dd}: not a valid dataset_dict.json") from None
        split = "train" if "train" in splits else (splits[0] if splits else None)
        if split is None:
            raise ConfigError(f"{dd}: lists no splits")
        path = path / split
    state = path / "state.json"
    files: list[Path] = []
    if state.is_file():
        try:
            files = [path / d["filename"] for d in json.loads(state.read_text(encoding="utf-8"))["_data_files"]]
        except (OSError, json.JSONDecodeError, KeyError, TypeError):
            raise ConfigError(f"{state}: not a valid datasets state.json") from None
        return "arrow", files
    arrow = sorted(path.rglob("*.arrow"))
    if arrow:
        return "arrow", arrow
    pq = sorted(path.rglob("*.parquet"))
    if pq:
        train = [p for p in pq if "train" in p.name] or pq
        return "parquet", train
    jl = sorted(path.rglob("*.jsonl"))
    if jl:
        return "jsonl", [p for p in jl if "train" in p.name] or jl
    raise ConfigError(f"{path}: no dataset files (.arrow, .parquet, .jsonl) in this folder",
                      "pass a JSONL/Parquet file or a folder written by datasets' save_to_disk")


def _arrow_batches(fmt: str, files: list[Path]):
    """Yield pyarrow RecordBatches of every file, streamed."""
    pa = _pyarrow()
    for f in files:
        if not f.is_file():
            raise ConfigError(f"{f}: listed dataset file is missing")
        try:
            if fmt == "parquet":
                pf = pa.parquet.ParquetFile(str(f))
                yield from pf.iter_batches(batch_size=1024)
            else:
                src = pa.memory_map(str(f), "r")
                try:
                    reader = pa.ipc.open_stream(src)
                except pa.ArrowInvalid:
                    reader = pa.ipc.open_file(src)
                    for i in range(reader.num_record_batches):
                        yield reader.get_batch(i)
                    continue
                yield from reader
        except (pa.ArrowException, OSError) as e:
            raise ConfigError(f"{f}: cannot read as {fmt} ({str(e).splitlines()[0][:200]})",
                              "is the file complete and in the format its name says?") from None


def _arrow_columns(fmt: str, files: list[Path]) -> tuple[list[str], int]:
    pa = _pyarrow()
    names: list[str] = []
    n = 0
    for f in files:
        try:
            if fmt == "parquet":
                pf = pa.parquet.ParquetFile(str(f))
                names = names or list(pf.schema_arrow.names)
                n += pf.metadata.num_rows
            else:
                for b in _arrow_batches(fmt, [f]):
                    names = names or list(b.schema.names)
                    n += b.num_rows
        except (pa.ArrowException, OSError) as e:
            raise ConfigError(f"{f}: cannot read as {fmt} ({str(e).splitlines()[0][:200]})") from None
    return names, n


def _iter_arrow(fmt: str, files: list[Path], wanted: set[int] | None, columns: list[str]) -> Iterator[tuple[int, str, Any]]:
    idx = -1
    for b in _arrow_batches(fmt, files):
        cols = [c for c in columns if c in b.schema.names]
        rows = b.select(cols).to_pylist() if cols else [{}] * b.num_rows
        for r in rows:
            idx += 1
            if wanted is None or idx in wanted:
                yield idx, f"{files[0].parent}: row {idx}", r


# ---------------------------------------------------------------------------------------------
# profile_dataset
# ---------------------------------------------------------------------------------------------
def profile_dataset(
    path: str | os.PathLike,
    *,
    tokenizer: str | os.PathLike | None = None,
    model_name: str | None = None,
    family: str | None = None,
    text_field: str | None = None,
    max_samples: int = DEFAULT_MAX_SAMPLES,
    seed: int = 0,
) -> DatasetProfile:
    """Token length of every sample (or of a seeded uniform sample) of a dataset file.

    ``tokenizer``: a local ``tokenizer.json`` (exact counts; chat-template turns still add the
    family's estimated overhead, a tokenizer.json holds no template). Otherwise ``model_name`` /
    ``family`` select the chars-per-token estimate.
    """
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"dataset {p} not found", "pass a .jsonl/.parquet file or a datasets folder")
    if max_samples < 1:
        raise ConfigError(f"max samples must be >= 1 (got {max_samples})")
    counter = _Counter(str(tokenizer) if tokenizer is not None else None, model_name, family)
    is_jsonl = p.is_file() and p.suffix.lower() in (".jsonl", ".json", ".ndjson")
    if is_jsonl:
        fmt, files = "jsonl", [p]
    else:
        fmt, files = _arrow_tables(p)
    if fmt == "jsonl":
        if len(files) > 1:
            notes_multi = f"read {len(files)} JSONL files"
        else:
            notes_multi = None
        total, longest = 0, []
        counts = []
        for f in files:
            n, lng = _scan_jsonl(f)
            longest += [total + i for i in lng]
            counts.append(n)
            total += n
    else:
        notes_multi = None
        names, total = _arrow_columns(fmt, files)
        longest = []
    if total == 0:
        raise ConfigError(f"dataset {p} has no samples")
    wanted: set[int] | None = None
    sampling = None
    uniform: set[int] | None = None
    forced: set[int] = set()
    if total > max_samples:
        rng = random.Random(seed)
        uniform = set(rng.sample(range(total), max_samples))
        forced = set(longest)
        wanted = uniform | forced
        sampling = (f"{max_samples:,} of {total:,} samples: uniform random (seed {seed})"
                    + (f"; the {len(forced)} longest lines by bytes measured too, for the peak batch"
                       if forced else ""))

    def records() -> Iterator[tuple[int, str, Any]]:
        if fmt == "jsonl":
            base = 0
            for f, n in zip(files, counts):
                sub = None if wanted is None else {i - base for i in wanted if base <= i < base + n}
                for i, where, rec in _iter_jsonl(f, sub):
                    yield base + i, where, rec
                base += n
        else:
            yield from _iter_arrow(fmt, files, wanted, [c for c in names if c in _COLUMNS or c == text_field])

    kind: str | None = None
    lengths: list[int] = []
    extra: list[int] = []
    skipped = 0
    pending: dict[str, list[Any]] = {}
    order: list[tuple[str, bool]] = []

    def flush() -> None:
        got = {k: counter.lengths(k, v) for k, v in pending.items()}
        pos = {k: 0 for k in got}
        for k, in_uniform in order:
            (lengths if in_uniform else extra).append(got[k][pos[k]])
            pos[k] += 1
        pending.clear()
        order.clear()

    for idx, where, rec in records():
        if kind is None:
            if not isinstance(rec, dict):
                raise ConfigError(f"{where}: a record must be a JSON object, got {type(rec).__name__}")
            kind = _detect_kind(rec.keys() if fmt == "jsonl" else set(names), text_field)
        in_uniform = uniform is None or idx in uniform
        red = _reduce(rec, kind, text_field, where)
        if red is None:
            skipped += 1 if in_uniform else 0
            continue
        k, payload = red
        pending.setdefault(k, []).append(payload)
        order.append((k, in_uniform))
        if len(order) >= 1000:
            flush()
    flush()
    if not lengths:
        raise ConfigError(f"dataset {p} has no non-empty samples")
    notes = []
    if notes_multi:
        notes.append(notes_multi)
    if counter.kind == "estimate":
        notes.append("token counts estimated from characters (pass `tokenizer=tokenizer.json` for exact counts)")
    measured_total = total - (skipped if uniform is None else round(skipped * total / len(uniform)))
    return DatasetProfile(
        path=str(p), file_format=fmt, kind=kind or "text", lengths=tuple(lengths),
        total_samples=max(len(lengths), measured_total), counter=counter.kind,
        counter_detail=counter.detail, sampled=wanted is not None, sampling=sampling,
        skipped_empty=skipped, notes=tuple(notes), longest=tuple(sorted(extra, reverse=True)),
    )


# ---------------------------------------------------------------------------------------------
# batches
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Batches:
    """What the loader forms from the data, per epoch, and the largest micro-batch."""

    batching: str
    max_length: int
    micro_batch: int
    micro_batches: int  # micro-batches per epoch (whole dataset, all ranks together)
    real_tokens: int  # tokens per epoch after truncation
    computed_tokens: int  # tokens the model runs on per epoch (padding included)
    truncated_samples: int
    truncated_tokens: int  # tokens cut off by max_length (never trained on)
    peak_rows: int  # the largest micro-batch the loader can form: rows x sequence length
    peak_seq_len: int
    padding_free: bool  # rows are flattened samples with position_ids (no padding)
    packs: int | None = None  # packed sequences (packed only)
    order: str = "random"
    notes: tuple[str, ...] = ()
    #: the largest micro-batch can carry padding (a row shorter than the batch's longest, or than
    #: ``max_length`` under ``padded``): its attention_mask has zeros (``Job.padded_batches``)
    padded: bool = False

    @property
    def peak_tokens(self) -> int:
        return self.peak_rows * self.peak_seq_len

    @property
    def padding_fraction(self) -> float:
        """Share of computed tokens that are padding."""
        return 1.0 - self.real_tokens / self.computed_tokens if self.computed_tokens else 0.0

    @property
    def mean_row_len(self) -> float:
        rows = self.micro_batches * (1 if self.padding_free else self.micro_batch)
        return self.computed_tokens / rows if rows else 0.0

    def memory_job(self, job: Job) -> Job:
        """``job`` at the largest micro-batch: what ``estimate_memory`` takes for the peak.

        Padding-free and packed micro-batches are one row of all their tokens (with
        ``position_ids``); the memory model sees them as ``micro_batch=1, seq_len=tokens``. A
        padded micro-batch (``padded``) plans the attention mask it brings (``padded_batches``)."""
        return job.with_(micro_batch=self.peak_rows, seq_len=self.peak_seq_len,
                         padded_batches=job.padded_batches or self.padded)

    def runtime_job(self, job: Job) -> Job:
        """``job`` at the average micro-batch, with the computed (padded) tokens as the data:
        steps and matmul FLOPs follow the tokens the model runs on. Attention FLOPs are taken at
        the mean row length (for packed rows an upper bound: varlen kernels attend within
        documents)."""
        per_mb = self.computed_tokens / self.micro_batches if self.micro_batches else 1
        if self.padding_free:
            mb, seq = 1, max(1, round(per_mb))
        else:
            mb, seq = self.micro_batch, max(1, round(per_mb / self.micro_batch))
        return job.with_(micro_batch=mb, seq_len=seq, dataset_tokens=max(1, self.computed_tokens))

    def summary(self) -> dict[str, Any]:
        return {
            "batching": self.batching, "max_length": self.max_length, "micro_batch": self.micro_batch,
            "micro_batches_per_epoch": self.micro_batches, "real_tokens_per_epoch": self.real_tokens,
            "computed_tokens_per_epoch": self.computed_tokens, "padding_fraction": self.padding_fraction,
            "truncated_samples": self.truncated_samples, "truncated_tokens": self.truncated_tokens,
            "peak_rows": self.peak_rows, "peak_seq_len": self.peak_seq_len, "padding_free": self.padding_free,
            "packs": self.packs, "order": self.order, "padded": self.padded,
        }


def bfd_pack(lengths: Sequence[int], seq_length: int) -> list[list[int]]:
    """TRL's best-fit-decreasing packing of one chunk (``trl.data_utils._pack_bfd``, truncate):
    lengths already truncated to ``seq_length``; returns the lengths in each bin, bins in
    creation order. Ties keep the input order (a stable descending sort, as pyarrow's)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    totals: list[int] = []
    # free space -> bins (FIFO) with that much room; a sorted list of the spaces available
    by_space: dict[int, list[int]] = {}
    import bisect

    spaces: list[int] = []
    for i in order:
        n = lengths[i]
        if n <= 0:
            continue
        k = bisect.bisect_left(spaces, n)
        if k < len(spaces):
            space = spaces[k]
            b = by_space[space].pop(0)
            if not by_space[space]:
                del by_space[space]
                spaces.pop(k)
        else:
            space = seq_length
            b = len(bins)
            bins.append([])
            totals.append(0)
        bins[b].append(n)
        totals[b] += n
        left = space - n
        if left > 0:
            if left not in by_space:
                by_space[left] = []
                bisect.insort(spaces, left)
            by_space[left].append(b)
    return bins


def _chunks(seq: Sequence[int], n: int) -> Iterator[Sequence[int]]:
    for i in range(0, len(seq), n):
        yield seq[i:i + n]


def _length_grouped(lengths: Sequence[int], batch_size: int, rng: random.Random) -> list[int]:
    """transformers' ``get_length_grouped_indices`` (default mega-batch multiplier)."""
    mult = min(len(lengths) // (batch_size * 4), 50) or 1
    idx = list(range(len(lengths)))
    rng.shuffle(idx)
    mega = mult * batch_size
    megas = [sorted(idx[i:i + mega], key=lambda j: lengths[j], reverse=True) for i in range(0, len(idx), mega)]
    maxes = [lengths[m[0]] for m in megas]
    k = maxes.index(max(maxes))
    megas[0][0], megas[k][0] = megas[k][0], megas[0][0]
    return [i for m in megas for i in m]


def simulate_batches(
    profile: DatasetProfile,
    batching: str,
    max_length: int,
    micro_batch: int,
    *,
    grad_accum: int = 1,
    order: str = "random",
    seed: int = 0,
) -> Batches:
    """Replay the loader over the profile's lengths (see the module docstring).

    ``order``: ``random`` (the Trainer's ``RandomSampler``, seeded here: an expectation, not the
    run's exact order) or ``sequential`` (file order; exact). Counts are scaled to the whole
    file when the profile is a sample. The peak is the worst micro-batch any order can form.
    """
    if batching not in BATCHINGS:
        from .errors import did_you_mean

        raise ConfigError(f"unknown batching {batching!r}",
                          did_you_mean(batching, BATCHINGS) or f"use one of {', '.join(BATCHINGS)}")
    if max_length < 1 or micro_batch < 1 or grad_accum < 1:
        raise ConfigError("max length, micro-batch and gradient accumulation must be >= 1")
    if order not in ("random", "sequential"):
        raise ConfigError(f"unknown order {order!r}", "use random or sequential")
    raw = list(profile.lengths)
    if not raw:
        raise ConfigError("the dataset profile has no samples")
    trunc = [min(x, max_length) for x in raw]
    n_trunc = sum(1 for x in raw if x > max_length)
    lost = sum(raw) - sum(trunc)
    real = sum(trunc)
    rng = random.Random(seed)
    notes: list[str] = []
    packs = None
    padded = False
    # the peak batch: every length known (the sample and, when sampled, the longest lines)
    longest = sorted((min(x, max_length) for x in profile.top_lengths), reverse=True)
    if batching in ("padded", "longest", "bucketed"):
        if batching == "bucketed":
            idx = _length_grouped(trunc, micro_batch * grad_accum, rng)
        else:
            idx = list(range(len(trunc)))
            if order == "random":
                rng.shuffle(idx)
        n_mb = 0
        computed = 0
        for chunk in _chunks(idx, micro_batch):
            n_mb += 1
            row = max_length if batching == "padded" else max(trunc[i] for i in chunk)
            computed += len(chunk) * row
        rows = min(micro_batch, len(trunc))
        seq = max_length if batching == "padded" else longest[0]
        padding_free = False
        # the peak batch can hold a shorter row (TRL's collator then passes an attention_mask with zeros)
        padded = min(trunc) < seq and (batching == "padded" or rows > 1)
    elif batching == "packed":
        pack_lens: list[int] = []
        for chunk in _chunks(trunc, _PACK_CHUNK):
            pack_lens.extend(sum(b) for b in bfd_pack(chunk, max_length))
        packs = len(pack_lens)
        idx = list(range(packs))
        if order == "random":
            rng.shuffle(idx)
        n_mb = -(-packs // micro_batch)
        computed = sum(pack_lens)
        rows = 1
        seq = sum(sorted(pack_lens + [x for x in longest[:micro_batch] if x == max_length],
                         reverse=True)[:micro_batch])
        padding_free = True
        notes.append("packed (TRL bfd): each micro-batch of packs is one padding-free row with position_ids "
                     "(needs a varlen attention kernel: flash attention)")
    else:  # padding-free
        n_mb = -(-len(trunc) // micro_batch)
        computed = real
        rows = 1
        seq = sum(longest[:micro_batch])
        padding_free = True
        notes.append("padding-free (TRL padding_free=True): each micro-batch is one row with position_ids "
                     "(needs flash attention)")
    s = profile.scale if profile.sampled else 1.0
    if profile.sampled:
        notes.append(f"token counts scaled from a sample ({profile.sampling})")
    return Batches(
        batching=batching, max_length=max_length, micro_batch=micro_batch,
        micro_batches=round(n_mb * s), real_tokens=round(real * s), computed_tokens=round(computed * s),
        truncated_samples=round(n_trunc * s), truncated_tokens=round(lost * s),
        peak_rows=rows, peak_seq_len=seq, padding_free=padding_free,
        packs=round(packs * s) if packs is not None else None, order=order, notes=tuple(notes), padded=padded,
    )


# ---------------------------------------------------------------------------------------------
# the plan from the data
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DatasetPlan:
    batches: Batches
    memory: Any  # MemoryBreakdown at the largest micro-batch
    memory_job: Job
    runtime_job: Job
    runtime: Any | None = None  # RuntimeEstimate from the computed tokens
    cost: Any | None = None
    usd_per_million_real_tokens: float | None = None
    notes: tuple[str, ...] = field(default=())


def plan_dataset(model: Any, job: Job, batches: Batches, layout: Layout | None = None, *,
                 gpu: Any | None = None, offer: Any | None = None) -> DatasetPlan:
    """Peak memory at the largest batch the loader forms; with ``gpu``, time from the computed
    (padded) tokens x ``job.epochs``; with ``offer`` too, the cost and $/M real tokens."""
    from .memory import estimate_memory

    layout = layout or Layout()
    mjob = batches.memory_job(job)
    notes = list(batches.notes)
    if batches.padding_free and mjob.attn_impl != "flash":
        mjob = mjob.with_(attn_impl="flash")
        notes.append("padding-free rows: memory taken with flash attention (TRL requires it)")
    mem = estimate_memory(model, mjob, layout)
    rjob = batches.runtime_job(job)
    rt = cost = per_m = None
    if gpu is not None:
        from .runtime import estimate_runtime

        rt = estimate_runtime(model, rjob, layout, gpu, offer=offer)
        if offer is not None:
            from .cost import estimate_cost

            cost = estimate_cost(rt, offer, layout, gpu)
            real = batches.real_tokens * job.epochs
            per_m = cost.usd / real * 1e6 if real else None
    return DatasetPlan(batches=batches, memory=mem, memory_job=mjob, runtime_job=rjob, runtime=rt,
                       cost=cost, usd_per_million_real_tokens=per_m, notes=tuple(notes))
