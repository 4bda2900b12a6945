"""The command line: the command table, flags from the schema, one-line errors that name flags."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ftplan.cli import COMMANDS, build_parser, main


def run(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_the_command_table_is_the_parser():
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    assert list(sub.choices) == [name for name, _ in COMMANDS]


@pytest.mark.parametrize("command", [name for name, _ in COMMANDS])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    assert "usage: ftplan " + command in capsys.readouterr().out


def test_help_shows_the_schema_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["estimate", "--help"])
    out = capsys.readouterr().out
    assert "--seq-len SEQ_LEN" in out and "max_length default:" in out and "--micro-batch MICRO_BATCH, --batch-size" in out


@pytest.mark.parametrize("argv, line", [
    (["estimate", "llama-3.1-8b", "--micro-batch", "0", "--seq-len", "0"],
     "micro-batch must be >= 1 (got 0); sequence length must be >= 1 (got 0)"),
    (["estimate", "mixtral-8x7b", "--method", "lora", "--lora-dropout", "0.1"],
     "(use --lora-dropout 0, or target attention only, e.g. --lora-targets q_proj,k_proj,v_proj,o_proj)"),
    (["estimate", "llama-3.1-8b", "--strategy", "zero3"], "needs more than one GPU (use single, or --gpus N)"),
    (["estimate", "llama-3.1-8b", "--tokens", "0"], "dataset tokens must be > 0 (got 0) (e.g. --tokens 50M)"),
    (["estimate", "llama-3.1-8b", "--micro-batch", "x"], "argument --micro-batch/--batch-size: expected an integer"),
    (["estimate", "llama-70b"], "did you mean 'llama-3.3-70b'"),
    (["estimate", "nope-model-xyz"], "(run 'ftplan models' to list the catalog)"),
    (["recommend", "qwen2.5-0.5b"], "the planner needs the dataset size (pass --tokens, e.g. --tokens 50M)"),
    (["recommend", "qwen2.5-0.5b", "--tokens", "1M", "--margin", "1.5", "--top", "-1", "--objective", "x"],
     "unknown objective 'x' (use one of cost, time); safety margin must be in [0, 1) (got 1.5) (e.g. --margin 0.05); "
     "--top must be >= 0 (got -1) (e.g. --top 10)"),
    (["recommend", "qwen2.5-0.5b", "--tokens", "1M", "--no-bundled-offers"],
     "no offers to search (drop --no-bundled-offers or pass --offers FILE)"),
    (["fit", "qwen2.5-0.5b"], "the following arguments are required: --gpu (see 'ftplan fit --help')"),
    (["export", "--out", "x"], "nothing to export: give a MODEL or --from-json FILE (see 'ftplan export --help')"),
    (["nope"], "invalid choice: 'nope'"),
])
def test_bad_input_is_one_line_naming_flags(argv, line, capsys):
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.startswith("ftplan: error: ") and err.count("\n") == 1 and line in err, err


def test_json_documents(capsys, tmp_path):
    rc, out, _ = run(capsys, "estimate", "qwen2.5-0.5b", "--method", "lora", "--json")
    assert rc == 0 and json.loads(out)["schema"] == "ftplan.estimate/1"
    rc, out, err = run(capsys, "export", "qwen2.5-0.5b", "--method", "lora", "--tokens", "5M", "--out",
                       str(tmp_path / "b"), "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["schema"] == "ftplan.export/1" and doc["plan"]["schema"] == "ftplan.plan/1"
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == doc["files"]


def test_module_entry_point():
    r = subprocess.run([sys.executable, "-m", "ftplan.cli", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("ftplan ")
