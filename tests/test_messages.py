"""The library's messages name options, never command-line flags (``ftplan.errors``).

Below ``ftplan.cli`` and ``ftplan.web`` every error, problem, hint, plan note, advice text and
option help refers to an option as a backticked field (```seq_len```, ```lora_dropout=0```) or to
a command as ```ftplan models```; the front ends render them: the CLI as ``--seq-len`` (one line,
exit code 2), the web app as ``seq_len`` (a 4xx body located at the field).

* an AST scan of the source finds the strings that reach the user as messages (see
  :func:`_message_strings`) and fails on a bare ``--flag`` outside a backticked command
  (:data:`OTHER_PROGRAMS` lists, exactly, the strings that quote another program's flags);
* every backticked reference in them must render, through the CLI's renderer, into a flag the
  CLI has (or be one of :data:`LIBRARY_ONLY`, parameters no front end passes);
* a few representative errors and notes are run through the CLI and the web API.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

import ftplan.errors as errors_mod
from ftplan.cli import COMMANDS, build_parser, main
from ftplan.cli.options import RENDERER

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "ftplan"
FRONT_ENDS = ("cli", "web")

#: strings that quote another program's flags (module relative to src/ftplan, exact substring):
#: they tell the user how to run *that* program
OTHER_PROGRAMS = {
    ("train.py", "huggingface-cli download ORG/NAME --local-dir DIR"),
}

#: references to library parameters that no front end passes (so no flag renders them)
LIBRARY_ONLY = {
    "text_field",  # ftplan.dataset.profile_dataset(text_field=...): a Python caller's column name
}

#: calls whose arguments are messages (besides the error classes of ftplan.errors and their subclasses)
_MESSAGE_CALLS = {"Problem", "Infeasible", "Assumption", "Suggestion", "_need", "_bad"}
#: keyword arguments that are messages in any call
_MESSAGE_KEYWORDS = {"hint", "message", "reason", "why", "notes", "help", "change", "text"}
#: a variable holding message text (assigned, appended to, extended): ``hint = ...``, ``notes.append(...)``
_MESSAGE_VARS = re.compile(r"(^|_)(hints?|notes?|why|reasons?|message|msg|problems)$")
_COMMAND_REF = re.compile(r"`ftplan(?: [^`]+)?`")
_BARE_FLAG = re.compile(r"(?<![\w-])--[a-z]")
_FIELD_REF = re.compile(r"`([a-z][a-z0-9_]*)(?:=([^`]*))?`")


def _library_files() -> list[Path]:
    return [p for p in sorted(PKG.rglob("*.py")) if p.relative_to(PKG).parts[0] not in FRONT_ENDS]


def _error_classes() -> set[str]:
    """The error classes of ftplan.errors and every subclass declared anywhere in the package."""
    names = {n for n in errors_mod.__all__
             if isinstance(getattr(errors_mod, n), type) and issubclass(getattr(errors_mod, n), Exception)}
    trees = [ast.parse(p.read_text(), str(p)) for p in sorted(PKG.rglob("*.py"))]
    grown = True
    while grown:
        grown = False
        for tree in trees:
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and node.name not in names and any(
                        _name(b) in names for b in node.bases):
                    names.add(node.name)
                    grown = True
    return names


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _text(node: ast.AST) -> str | None:
    """A string constant, or an f-string with ``{}`` for each placeholder."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def _strings(node: ast.AST) -> list[tuple[int, str]]:
    """Every string (constant or f-string template) in the expression ``node``."""
    out = []
    for n in ast.walk(node):
        t = _text(n)
        if t is not None:
            out.append((n.lineno, t))
    return out


def _message_strings() -> list[tuple[str, int, str]]:
    """(module, line, text) of the strings that reach the user as messages: arguments of the
    error classes, Problem, Infeasible, Assumption/Suggestion; message keywords (``hint=``,
    ``help=`` ...); the help of an ``Option(...)``; values assigned or appended to message
    variables (``hint = ...``, ``notes.append(...)``, ``hints += ...``)."""
    calls = _error_classes() | _MESSAGE_CALLS
    out: set[tuple[str, int, str]] = set()
    for path in _library_files():
        rel = str(path.relative_to(PKG))
        tree = ast.parse(path.read_text(), str(path))
        found: list[ast.AST] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                fname = _name(node.func)
                if fname in calls:
                    found += [*node.args, *(k.value for k in node.keywords)]
                elif fname == "Option" and len(node.args) > 3:
                    found.append(node.args[3])
                elif (fname in ("append", "extend", "insert", "add") and isinstance(node.func, ast.Attribute)
                      and _MESSAGE_VARS.search(_name(node.func.value) or "")):
                    found += node.args
                found += [k.value for k in node.keywords if k.arg in _MESSAGE_KEYWORDS]
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(_MESSAGE_VARS.search(_name(t) or "") for t in targets):
                    found.append(node.value)
        found += _returned_by_helpers(tree, found)
        for expr in found:
            out.update((rel, line, text) for line, text in _strings(expr))
    return sorted(out)


def _returned_by_helpers(tree: ast.AST, found: list[ast.AST]) -> list[ast.AST]:
    """The return values of the module's own functions that a message expression calls
    (``notes.append(_merged_experts_note(...))``), followed through helpers that call helpers."""
    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    seen: set[str] = set()
    todo = [e for e in found]
    out: list[ast.AST] = []
    while todo:
        expr = todo.pop()
        for n in ast.walk(expr):
            name = _name(n.func) if isinstance(n, ast.Call) else None
            if name in functions and name not in seen:
                seen.add(name)
                returns = [r.value for r in ast.walk(functions[name])
                           if isinstance(r, ast.Return) and r.value is not None]
                out += returns
                todo += returns
    return out


MESSAGES = _message_strings()


def _allowed(rel: str, text: str) -> bool:
    return any(rel == m and s in text for m, s in OTHER_PROGRAMS)


def test_the_scan_sees_the_messages():
    """The scan is not vacuous: it finds errors, hints, notes, advice and help in the core."""
    by_module = {rel for rel, _, _ in MESSAGES}
    assert {"planner.py", "risk.py", "dataset.py", "train.py", "export/bundle.py", "job.py", "advice.py",
            "options.py", "measure/run.py"} <= by_module
    texts = [t for _, _, t in MESSAGES]
    assert any("`max_gpus` to change" in t for t in texts)  # a plan note
    assert any("`method=qlora`" in t for t in texts)  # a why-not hint
    assert any("`gradient_checkpointing=false`" in t for t in texts)  # an option's help
    # a note built by a helper function and appended by its caller
    assert any(rel == "memory.py" and "W + BA in every forward" in t for rel, _, t in MESSAGES)
    assert len(MESSAGES) > 300


def test_library_messages_name_no_cli_flags():
    bad = [f"{rel}:{line}: {text!r}" for rel, line, text in MESSAGES
           if _BARE_FLAG.search(_COMMAND_REF.sub("", text)) and not _allowed(rel, text)]
    assert not bad, "library messages must name options as `field` (rendered by the front ends):\n" + "\n".join(bad)


def test_the_allow_list_is_exact():
    """Every allow-listed string still exists as a message (a stale entry would hide a new one)."""
    for rel, s in OTHER_PROGRAMS:
        assert any(r == rel and s in t for r, _, t in MESSAGES), (rel, s)


def _cli_flags() -> set[str]:
    flags: set[str] = set()
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for p in sub.choices.values():
        for a in p._actions:
            flags.update(s for s in a.option_strings if s.startswith("--"))
    return flags


def test_every_reference_renders_as_an_existing_flag():
    flags = _cli_flags()
    commands = {name for name, _ in COMMANDS}
    bad = []
    for rel, line, text in MESSAGES:
        for cmd in _COMMAND_REF.findall(text):
            words = cmd.strip("`").split()
            if len(words) > 1 and words[1] not in commands:
                bad.append(f"{rel}:{line}: unknown command {cmd}")
        for m in _FIELD_REF.finditer(_COMMAND_REF.sub("", text)):
            name, value = m.group(1), m.group(2)
            if name in LIBRARY_ONLY:
                continue
            rendered = RENDERER.field(name, value)
            flag = next((w for w in rendered.split() if w.startswith("--")), None)
            if flag not in flags:
                bad.append(f"{rel}:{line}: `{m.group(0).strip('`')}` renders as {rendered!r}, not a CLI flag")
    assert not bad, "\n".join(bad)


def test_the_cli_renders_switches_and_parameters():
    assert RENDERER.field("seq_len", "4096") == "--seq-len 4096"
    assert RENDERER.field("attn", "sdpa") == "--attn sdpa"
    assert RENDERER.field("gradient_checkpointing", "false") == "--no-gradient-checkpointing"
    assert RENDERER.field("packing", "true") == "--packing"
    assert RENDERER.field("fixed_gpus", None) == "--fixed-gpus"
    assert RENDERER.field("plan", "N") == "--plan N"  # a command's own argument, not an option
    assert RENDERER.command("ftplan models") == "'ftplan models'"


# ---------------------------------------------------------------------------------------------
# through the front ends
# ---------------------------------------------------------------------------------------------
def _cli(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ftplan: error: "), err
    assert "`" not in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def search_doc(tmp_path_factory) -> Path:
    """A saved ``ftplan recommend --json`` document (one small search)."""
    import ftplan

    doc = ftplan.recommend("qwen2.5-0.5b", method="lora", tokens="5M", gpus_filter="l4", top=2).to_dict()
    path = tmp_path_factory.mktemp("plans") / "plans.json"
    path.write_text(json.dumps(doc))
    return path


def test_cli_errors_name_flags(capsys, search_doc, tmp_path):
    n = len(json.loads(search_doc.read_text())["plans"])
    cases = [
        # the library's plan-file check (ftplan.train.load_plan_json): `plan=9` -> --plan 9
        (["train", str(tmp_path), "--dataset", "d.jsonl", "--out", str(tmp_path / "o"),
          "--from-json", str(search_doc), "--plan", "9"], "--plan 9 is out of range"),
        # the exporter's (ftplan.export.bundle.plan_from_json): `plan=1..N`
        (["export", "--from-json", str(search_doc), "--plan", str(n + 1), "--out", str(tmp_path / "b")],
         f"(use --plan 1..{n})"),
    ]
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    # the bundle writer (ftplan.export.bundle.write_bundle): `force`, `out`
    cases.append((["export", "--from-json", str(search_doc), "--out", str(tmp_path / "full"), "--force"],
                  "error: --force only replaces an earlier ftplan bundle"))
    for argv, words in cases:
        rc, out, err = _cli(capsys, *argv)
        assert rc == 2, (argv, err)
        line = _one_error_line(err)
        assert words in line, (argv, line)
    assert line.endswith("(pass a new --out directory (nothing was deleted))"), line
    assert (tmp_path / "full" / "x").read_text() == "x"  # nothing already there is lost


def test_cli_notes_name_flags_and_json_names_fields(capsys, tmp_path):
    rc, out, err = _cli(capsys, "recommend", "qwen2.5-0.5b", "--tokens", "5M", "--gpus-filter", "l4", "--top", "1")
    assert rc == 0, err
    assert "note: searched layouts up to 64 GPUs (use --max-gpus to change)" in out
    assert "`" not in out
    rc, out, err = _cli(capsys, "recommend", "qwen2.5-0.5b", "--tokens", "5M", "--gpus-filter", "l4", "--top", "1",
                        "--json")
    doc = json.loads(out)
    assert "searched layouts up to 64 GPUs (use max_gpus to change)" in doc["notes"]
    # a fit note with a value: `seq_len=N`
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": "word " * (20 * i + 5)}) + "\n" for i in range(40)))
    rc, out, err = _cli(capsys, "fit", "qwen2.5-0.5b", "--gpu", "l4", "--dataset", str(data))
    assert rc == 0, err
    assert re.search(r"note: 95 % of the samples untruncated: --seq-len \d+ fits one GPU", out), out
    assert "`" not in out


def test_web_errors_and_notes_name_fields():
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from ftplan.web import create_app

    with TestClient(create_app()) as client:
        r = client.post("/api/estimate", json={"model": "mixtral-8x7b", "method": "lora", "lora_dropout": 0.1})
        assert r.status_code == 422
        msgs = [e["msg"] for e in r.json()["detail"]]
        assert any("lora_dropout=0" in m for m in msgs), msgs
        assert not any("--" in m or "`" in m for m in msgs), msgs
        r = client.post("/api/recommend", json={"model": "qwen2.5-0.5b", "tokens": "5M", "gpus_filter": "l4", "top": 1,
                                                "deadline": 0.001})
        assert r.status_code == 200, r.text
        doc = r.json()
        assert "searched layouts up to 64 GPUs (use max_gpus to change)" in doc["notes"]
        hints = [i["hint"] for i in doc["infeasible"] if i["hint"]]
        assert any("relax deadline / budget or raise max_gpus" in h for h in hints), doc["infeasible"]
        assert "--" not in json.dumps(doc["notes"] + hints)


@pytest.mark.parametrize("argv", [
    ["estimate", "llama-3.1-70b", "--method", "qlora", "--gpu", "h100-sxm"],
    ["estimate", "llama-3.1-8b", "--method", "lora", "--gpu", "l4", "--base-dtype", "fp32"],
    ["estimate", "mixtral-8x7b", "--method", "lora", "--gpu", "h100-sxm", "--no-gradient-checkpointing"],
    ["estimate", "qwen2.5-7b", "--method", "full", "--gpu", "a100-80gb", "--gpus", "4", "--strategy", "zero3"],
    ["recommend", "llama-3.1-70b", "--method", "qlora", "--tokens", "1M", "--gpus-filter", "h100-sxm", "--top", "1"],
])
def test_estimate_text_and_json_render_every_reference(capsys, argv):
    """Every part of an answer (assumption sentences and sources too, not only their 'change'
    field) goes through the front end's renderer: no backticked field reaches the user."""
    rc, out, err = _cli(capsys, *argv)
    assert rc in (0, 1), err
    assert "`" not in out, [ln for ln in out.splitlines() if "`" in ln]
    rc, out, err = _cli(capsys, *argv, "--json")
    assert "`" not in out, [ln for ln in out.splitlines() if "`" in ln][:3]


@pytest.mark.parametrize("argv,words,absent", [
    # torchtune's `dtype` config key once rendered as an ftplan flag (--dtype) here
    (["estimate", "llama-3.1-8b", "--method", "qlora", "--quant-type", "torchao-nf4"],
     "use --precision bf16", "--dtype"),
    # an unknown value is one problem, not also "the x wrapping is an FSDP2 option"
    (["estimate", "llama-3.1-8b", "--fsdp-wrap", "x"], "unknown FSDP wrapping 'x'", "FSDP2 option"),
])
def test_one_line_errors_name_only_ftplan_flags(capsys, argv, words, absent):
    rc, _, err = _cli(capsys, *argv)
    line = _one_error_line(err)
    assert rc == 2 and words in line and absent not in line, line
