"""Hypothesis-driven command lines through ``ftplan.cli.main(argv)`` in-process (issue 16).

Every command and flag is read from the real argparse parser (so new options are fuzzed without
editing this file); values are drawn from numbers that broke ftplan before (``inf``, ``nan``,
``1e400``, 5000-digit integers), odd text (control characters, 300-character names, lone
surrogates as argv delivers undecodable bytes) and files that are not what they claim (deep JSON,
NaN, BOM, NUL, YAML alias bombs). The contract: exit code 0 or 2 (3 = no plan fits is allowed;
1 only where documented: ``validate --check``), never ``internal error`` or a traceback on stderr.

What would run real training is stubbed below the input checks: ``train``'s launch and machine
probe, ``measure``'s torch import, ``serve``'s uvicorn loop.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftplan.cli import build_parser, main
from ftplan.options import FIT_OPTIONS, OPTIONS, options_by_name

HERE = Path(__file__).parent
PLAN = HERE / "data" / "export" / "recommend-70b-qlora.json"
INVOCATIONS = 220
FUZZ = settings(max_examples=INVOCATIONS, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))

NUMBERS = ["inf", "-inf", "nan", "NaN", "1e400", "-1", "0", "1", "2", "8", "3.5", "1e9", "9" * 40, "9" * 5000,
           "20M", "1.5B", "", " ", "abc", "0x10", "1_000", "١٢", "$5", "1,000", "1e-300", "-0"]
TEXT = ["x" * 300, "a\rb", "a\nb", "a\x00b", "a\tb", "\udcff", "caf\udce9", "\u202eevil", "-", "--", "~", "/", ".",
        "..", "a,b", ",", "all-linear", "q_proj", "h100-sxm", "NVIDIA H100 80GB HBM3", "aws", "spot", "any"]
MODELS = ["llama-3.2-1b", "qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3", "someorg/somemodel", "x" * 300]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzzcli")
    tiny = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100}
    texts = {
        "tiny.json": json.dumps(tiny),
        "deep.json": "[" * 50_000,
        "nan.json": '{"model_type": "llama", "hidden_size": NaN}',
        "layers.json": json.dumps({**tiny, "num_hidden_layers": 10**9}),
        "bom.json": "\ufeff" + json.dumps(tiny),
        "plan.json": PLAN.read_text(encoding="utf-8"),
        "records.jsonl": '{"schema": "ftplan.measurement/1"}\n[1]\n' + "[" * 5000 + "\n" + '{"x": NaN}\n',
        "matrix.yaml": "jobs: &a [{model: llama-3.2-1b}]\nmore: *a\n",
        "matrix2.yaml": "jobs:\n  - {model: llama-3.2-1b, steps: abc}\n",
        "matrix.csv": 'model,steps\nllama-3.2-1b,"3\n',
        "offers.csv": "provider,sku,gpu\nacme,x,h100-sxm\n",
        "gpus.csv": "\ufeffname\nx\n",
        "data.jsonl": '{"text": "hello world"}\n',
        "nul.csv": "a\x00b\n",
    }
    paths = {}
    for name, text in texts.items():
        (d / name).write_text(text, encoding="utf-8")
        paths[name] = str(d / name)
    model = d / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(tiny))
    (model / "tokenizer.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    paths["model"] = str(model)
    paths["dir"] = str(d)
    return paths


@functools.lru_cache(maxsize=1)
def _commands():
    """The subcommand parsers to draw command lines from (built once: ``main`` builds its own)."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


def _kind(action: argparse.Action) -> str:
    opt = options_by_name(OPTIONS, FIT_OPTIONS).get(action.dest)
    if opt is not None:
        return opt.type
    name = getattr(action.type, "__name__", "")
    if action.type is int or "int" in name or "port" in name or "plan_index" in name:
        return "int"
    if action.type is float or "float" in name:
        return "float"
    return "str"


@st.composite
def command_lines(draw, files):
    commands = _commands()
    name = draw(st.sampled_from(sorted(commands)))
    parser = commands[name]
    paths = [v for k, v in files.items() if k != "dir"]
    text = st.sampled_from(TEXT + paths) | st.text(max_size=12)
    argv = [name]
    for action in parser._actions:
        if action.option_strings or action.dest in ("help",):
            continue
        if action.nargs == "?" and draw(st.booleans()):
            continue
        if action.dest == "model":
            argv.append(draw(st.sampled_from(MODELS + [files["tiny.json"], files["deep.json"], files["nan.json"],
                                                       files["layers.json"], files["bom.json"]]) | text))
        elif action.dest == "model_dir":
            argv.append(draw(st.sampled_from([files["model"], files["dir"]]) | text))
        elif action.dest == "records":
            argv += draw(st.lists(st.sampled_from([files["records.jsonl"], files["plan.json"]]) | text, max_size=2))
        else:
            argv.append(draw(text))
    optionals = [a for a in parser._actions if a.option_strings and a.dest not in ("help", "version")]
    for action in draw(st.lists(st.sampled_from(optionals), max_size=6)):
        flag = draw(st.sampled_from(action.option_strings))
        if action.nargs == 0:
            argv.append(flag)
            continue
        kind = _kind(action)
        if action.choices:
            value = draw(st.sampled_from(list(action.choices)) | text)
        elif kind in ("int", "float", "tokens"):
            value = draw(st.sampled_from(NUMBERS) | st.integers(-5, 70_000).map(str)
                         | st.floats(allow_nan=True, allow_infinity=True).map(repr))
        elif flag in ("--out", "--record"):
            value = draw(st.sampled_from([os.path.join(files["dir"], "out", str(draw(st.integers(0, 10**9)))),
                                          files["dir"], files["plan.json"], "/", os.path.join(files["dir"], "a\rb"),
                                          "~"]))
        else:
            value = draw(st.sampled_from(list(files.values())) | text)
        argv += [flag, value]
    # the searches need a dataset size most of the time, fit a GPU
    if name in ("recommend", "compare", "export") and "--tokens" not in argv and draw(st.booleans()):
        argv += ["--tokens", "20M"]
    if name == "fit" and "--gpu" not in argv:
        argv += ["--gpu", draw(st.sampled_from(["h100-sxm", "b200", "x"]))]
    if name in ("export", "train") and "--out" not in argv:
        argv += ["--out", os.path.join(files["dir"], "out", str(draw(st.integers(0, 10**9))))]
    if name == "train" and "--dataset" not in argv:
        argv += ["--dataset", files["data.jsonl"]]
    return argv


@contextlib.contextmanager
def _no_heavy_work(monkeypatch: pytest.MonkeyPatch):
    """Stub what would train a model or start a server, below the input checks."""
    import ftplan.measure.run as mrun
    import ftplan.train as train_mod
    from ftplan.errors import MeasurementError

    def fake_stream(cmd, log_path, **kw):
        report = cmd[cmd.index("--report-json") + 1]
        Path(report).write_text(json.dumps({"steps": 1, "wall_s": 0.1, "device": "cpu", "tokens_per_s": 1.0}))
        return 0, ""

    monkeypatch.setattr(train_mod, "check_machine", lambda job, layout: train_mod.Machine("cpu", 0))
    monkeypatch.setattr(train_mod, "run_streaming", fake_stream)

    def no_torch():
        raise MeasurementError("torch is stubbed out in the CLI fuzz test")

    monkeypatch.setattr(mrun, "import_torch", no_torch)
    try:  # hub ids resolve from an empty local cache only: no network, deterministic
        from huggingface_hub import constants

        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", os.path.join(os.path.dirname(__file__), "_no_hf_cache"))
    except ImportError:
        pass
    try:
        import uvicorn

        monkeypatch.setattr(uvicorn, "run", lambda *a, **k: None)
    except ImportError:
        pass
    yield


def _run(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:  # --help / --version
            rc = e.code if isinstance(e.code, int) else 2
    return rc, err.getvalue()


def _allowed(argv: list[str], rc: int) -> bool:
    if rc in (0, 2, 3):
        return True
    return rc == 1 and argv[0] == "validate" and "--check" in argv  # documented: a target missed


@FUZZ
@given(data=st.data())
def test_fuzz_cli(files, data):
    argv = data.draw(command_lines(files), label="argv")
    with pytest.MonkeyPatch.context() as mp, _no_heavy_work(mp):
        mp.chdir(files["dir"])  # relative outputs (`--out ~` is a folder named '~') stay in the temp dir
        t0 = time.perf_counter()
        rc, err = _run(argv)
        if os.environ.get("FTPLAN_FUZZ_SLOW") and time.perf_counter() - t0 > 0.5:
            print(f"SLOW {time.perf_counter() - t0:.1f}s {argv}", file=sys.__stderr__)
    assert "internal error" not in err and "Traceback" not in err, (argv, err[-2000:])
    assert _allowed(argv, rc), (argv, rc, err[-2000:])
    if rc == 2 and argv[0] != "validate":
        lines = [ln for ln in err.splitlines() if ln.startswith("ftplan: error:")]
        assert len(lines) == 1 and len(lines[0]) < 4000, (argv, err[-2000:])


# ---------------------------------------------------------------------------------------------
# regressions of the classes the fuzz pass found (each one line, exit code 2)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, words", [
    (["recommend", "llama-3.2-1b", "--tokens", "inf"], "--tokens"),
    (["recommend", "llama-3.2-1b", "--tokens", "1e400"], "--tokens"),
    (["recommend", "llama-3.2-1b", "--tokens", "nan"], "--tokens"),
    (["recommend", "llama-3.2-1b", "--tokens", "20M", "--epochs", "inf"], "--epochs"),
    (["recommend", "llama-3.2-1b", "--tokens", "20M", "--deadline", "nan"], "--deadline"),
    (["recommend", "llama-3.2-1b", "--tokens", "20M", "--budget", "1e400"], "--budget"),
    (["recommend", "llama-3.2-1b", "--tokens", "20M", "--margin", "inf"], "--margin"),
    (["estimate", "llama-3.2-1b", "--seq-len", "9" * 5000], "--seq-len"),
    (["estimate", "llama-3.2-1b", "--seq-len", "99999999999999999999"], "sequence length must be in [1, 16777216]"),
    (["estimate", "llama-3.2-1b", "--lora-dropout", "nan", "--method", "lora"], "--lora-dropout"),
    (["fit", "llama-3.2-1b", "--gpu", "h100-sxm", "--max-gpus", "99999999999999999999"], "max GPUs"),
    (["estimate", "x" * 300], "unknown model"),
    (["estimate", "a\rb"], "control"),
    (["serve", "--log-level", "bogus"], "log level"),
    (["validate", "{deep}"], "nested too deeply"),
])
def test_cli_regressions(files, argv, words):
    argv = [a.replace("{deep}", files["deep.json"]) for a in argv]
    with pytest.MonkeyPatch.context() as mp, _no_heavy_work(mp):
        mp.chdir(files["dir"])
        rc, err = _run(argv)
    assert rc == 2 and err.startswith("ftplan: error: ") and err.count("\n") == 1 and words in err, err


def test_validate_survives_deep_and_nan_records(files):
    rc, err = _run(["validate", files["records.jsonl"]])
    assert rc == 2 and "internal error" not in err
    assert "nested too deeply" in err and "NaN is not a JSON number" in err


def test_measure_matrix_alias_bomb_and_bad_rows(files):
    out = os.path.join(files["dir"], "m.jsonl")
    for name, words in (("matrix.yaml", "anchors and aliases"), ("matrix2.yaml", "steps"),
                        ("matrix.csv", "malformed CSV")):
        rc, err = _run(["measure", "--matrix", files[name], "--out", out])
        assert rc == 2 and words in err and err.count("\n") == 1, err
    assert not os.path.exists(out)


def test_serve_port_in_use_is_one_line():
    import socket

    pytest.importorskip("uvicorn")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        rc, err = _run(["serve", "--port", str(s.getsockname()[1])])
    assert rc == 2 and "already in use" in err and err.count("\n") == 1, err
