"""Export never lets user text inject YAML keys, shell words or script code, never deletes a foreign
directory, and refuses malformed plan files with one line (issue 16, items 6, 7 and 10).

Oracles: PyYAML's safe loader and SkyPilot's own ``sky.Task.from_yaml``, Python's ``compile``,
``shlex.split``; hypothesis over arbitrary text (every Unicode category, lone surrogates included).
"""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftplan.cli import main
from ftplan.errors import ConfigError
from ftplan.export import load_plan_json, render_bundle, write_bundle
from ftplan.export.yamltext import Commented, dump_yaml, user_text
from ftplan.model import model_from_config

DATA = Path(__file__).parent / "data" / "export"
QLORA = DATA / "recommend-70b-qlora.json"
FUZZ = settings(max_examples=200, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                       HealthCheck.function_scoped_fixture])
yaml = pytest.importorskip("yaml")

#: every code point class, lone surrogates included, plus the strings that broke sky.yaml
_any_char = st.characters(codec=None, exclude_categories=())
_tricky = st.sampled_from(["\r", "\n", "\r\n", "\x85", "\u2028", "\u2029", "\t", "\x00", "\x1b", "\ufeff", "\ud800",
                           "\u202e", "#", ": ", "- ", "'", '"', "\\", "{", "}", "[", "]", "&a", "*a", "!!python/object",
                           "|", ">", "---", "...", "%YAML", "\r\nnum_nodes: 100", "\rfile_mounts:\r  /tmp: /etc",
                           "\nfile_mounts:\n  /x: /", "\u2028num_nodes: 7", "${HOME}", "$(id)", "`id`", ";rm -rf ~"])
_text = st.lists(st.one_of(st.text(alphabet=_any_char, max_size=4), _tricky), max_size=8).map("".join)


@FUZZ
@given(value=_text, comment=_text)
def test_any_text_round_trips_through_yaml_and_adds_no_key(value, comment):
    doc = {"name": "t", "envs": {"DATASET": Commented(value, comment), "OUTPUT_DIR": "output"},
           "list": [value, {"k": value}], "num_nodes": 1}
    text = dump_yaml(doc, header=comment)
    assert yaml.safe_load(text) == {"name": "t", "envs": {"DATASET": value, "OUTPUT_DIR": "output"},
                                    "list": [value, {"k": value}], "num_nodes": 1}


@pytest.fixture(scope="module")
def plan():
    return load_plan_json(QLORA, 1)


@FUZZ
@given(dataset=_text, model_ref=_text)
def test_user_text_cannot_inject_keys_into_sky_yaml(plan, dataset, model_ref):
    doc, others = plan
    try:
        files = render_bundle(doc, alternatives=others, dataset=dataset or None, model_ref=model_ref or None)
    except ConfigError as e:
        msg = e.one_line()
        assert "control or invisible characters" in msg or "is empty" in msg, msg
        return
    task = yaml.safe_load(files["sky.yaml"])
    assert set(task) == {"name", "workdir", "num_nodes", "resources", "envs", "setup", "run"}
    assert task["num_nodes"] == 1 and set(task["envs"]) == {"MODEL", "DATASET", "OUTPUT_DIR", "HF_TOKEN"}
    assert task["envs"]["DATASET"] == (dataset or "")
    assert task["envs"]["MODEL"] == (model_ref or "meta-llama/Llama-3.1-70B")
    for line in files["README.md"].splitlines():
        if line.startswith("accelerate launch") and dataset:
            args = shlex.split(line)
            assert args[args.index("--dataset") + 1] == dataset  # one shell word, whatever it holds
    accel = yaml.safe_load(files["accelerate_config.yaml"])
    assert isinstance(accel, dict) and "distributed_type" in accel
    compile(files["train.py"], "train.py", "exec")


@pytest.mark.parametrize("dataset", ["a\r\nnum_nodes: 100", "x\rfile_mounts:\r  /tmp: /etc", "d\x85num_nodes: 3",
                                     "d\u2028num_nodes: 3", "tab\there", "esc\x1b[2J", "bidi\u202etxt.lmx"])
def test_control_characters_in_dataset_are_refused(plan, dataset, tmp_path):
    doc, others = plan
    with pytest.raises(ConfigError, match="dataset .* control or invisible characters"):
        render_bundle(doc, alternatives=others, dataset=dataset)
    out = tmp_path / "b"
    rc = main(["export", "--from-json", str(QLORA), "--dataset", dataset, "--out", str(out)])
    assert rc == 2 and not out.exists()


@pytest.mark.parametrize("value", ["a: b", "#x", "{a: 1}", "'q'", '"dq"', "&a *a", "!!python/object:os.system",
                                   "- x", "> y", "| z", "key: [1, 2]", "~", "null", "yes", "1e3", ".inf",
                                   "C:\\data\\x.jsonl", "s3://b/k?x=1&y=2", "données/€uro", "x" * 300])
def test_skypilot_parses_nasty_printable_values_back_exactly(plan, value, tmp_path):
    sky = pytest.importorskip("sky")
    from export_checks import _legacy_sky, sky_has_infra

    doc, others = plan
    files = render_bundle(doc, alternatives=others, dataset=value, model_ref=value)
    path = tmp_path / "sky.yaml"
    text = files["sky.yaml"]
    if not sky_has_infra(sky):  # SkyPilot < 0.10 (CI's 0.9.2) names the cloud without 'infra'
        text = yaml.safe_dump(_legacy_sky(yaml.safe_load(text)))
    path.write_text(text, encoding="utf-8")
    task = sky.Task.from_yaml(str(path))
    assert task.envs["DATASET"] == value and task.envs["MODEL"] == value
    assert task.num_nodes == 1 and not task.file_mounts


def test_user_text_is_checked_in_one_place():
    assert user_text("trl-lib/Capybara", "dataset") == "trl-lib/Capybara"
    for bad in ("a\rb", "\x00", "\u2028", 5, None):
        with pytest.raises(ConfigError):
            user_text(bad, "dataset")


def test_model_name_cannot_break_the_train_script():
    from ftplan.export.script import render_train_script
    from ftplan.job import Job, Layout

    cfg = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 128, "vocab_size": 100}
    for name in ('x"""; import os; os.system("id"); """', "back\\slash\\", "line\nbreak", "nul\x00", '"'):
        spec = model_from_config(cfg, name=name)
        text = render_train_script(spec, Job(), Layout(), model_ref=name)
        ns: dict = {}
        exec(compile(text.split("\nimport argparse")[0], "train.py", "exec"), ns)  # the docstring part
        assert ns["__doc__"].startswith("Fine-tune ")
        compile(text, "train.py", "exec")


# ---------------------------------------------------------------------------------------------
# item 7: --force replaces only an earlier bundle
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def files(plan):
    doc, others = plan
    return render_bundle(doc, alternatives=others)


def test_force_refuses_a_foreign_directory(files, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    (out / "sub").mkdir()
    with pytest.raises(ConfigError, match="only replaces an earlier ftplan bundle") as e:
        write_bundle(files, out, force=True)
    assert "nothing was deleted" in e.value.one_line()
    assert sorted(p.name for p in out.iterdir()) == ["sub", "thesis.tex"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # no temporary left behind


def test_force_replaces_an_earlier_bundle(files, tmp_path):
    out = tmp_path / "b"
    write_bundle(files, out)
    (out / "README.md").write_text("edited by hand")  # still a bundle file
    write_bundle(files, out, force=True)
    assert (out / "README.md").read_text() == files["README.md"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


@pytest.mark.parametrize("extra", ["output/", "notes.txt", "link"])
def test_force_refuses_a_bundle_with_other_things_in_it(files, tmp_path, extra):
    out = tmp_path / "b"
    write_bundle(files, out)
    if extra.endswith("/"):
        (out / extra).mkdir()
        (out / extra / "checkpoint-500").write_text("weights")
    elif extra == "link":
        (out / "link").symlink_to(tmp_path)
    else:
        (out / extra).write_text("mine")
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(ConfigError, match="which no ftplan export writes"):
        write_bundle(files, out, force=True)
    assert sorted(p.name for p in out.iterdir()) == before


def test_force_refuses_a_plan_json_of_another_kind(files, tmp_path):
    out = tmp_path / "b"
    out.mkdir()
    (out / "plan.json").write_text(json.dumps({"schema": "something/1"}))
    with pytest.raises(ConfigError, match="not an ftplan plan"):
        write_bundle(files, out, force=True)
    (out / "plan.json").write_text("[" * 100_000)
    with pytest.raises(ConfigError, match="not an ftplan plan"):
        write_bundle(files, out, force=True)


def test_force_never_touches_home_or_symlinks(files, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("x")
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(ConfigError, match="home directory"):
        write_bundle(files, home, force=True)
    real = tmp_path / "real"
    write_bundle(files, real)
    (tmp_path / "alias").symlink_to(real)
    with pytest.raises(ConfigError, match="symbolic link"):
        write_bundle(files, tmp_path / "alias", force=True)
    assert (home / ".bashrc").exists() and (real / "plan.json").exists()


def test_cli_export_force_on_a_foreign_directory(tmp_path, capsys):
    out = tmp_path / "data"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    rc = main(["export", "--from-json", str(QLORA), "--out", str(out), "--force"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "earlier ftplan bundle" in err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


# ---------------------------------------------------------------------------------------------
# item 10: malformed plan files (--from-json) are one line, before anything is written
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, words", [
    ('{"schema": "ftplan.plan/1", "x": NaN}', "NaN is not a JSON number"),
    ("[" * 100_000, "nested too deeply"),
    ('{"a": ' * 200 + "1" + "}" * 200, "nested deeper than"),
    ("\x00{}", "NUL byte"),
])
def test_plan_files_that_are_not_plans(tmp_path, text, words):
    p = tmp_path / "plan.json"
    p.write_text(text)
    with pytest.raises(ConfigError, match=words):
        load_plan_json(p)


def test_plan_file_with_bom_and_latin1(tmp_path):
    p = tmp_path / "plan.json"
    p.write_text("\ufeff" + QLORA.read_text(encoding="utf-8"), encoding="utf-8")
    assert load_plan_json(p)[0]["schema"] == "ftplan.plan/1"
    p.write_bytes(b'{"schema": "ftplan.recommend/1", "x": "caf\xe9"}')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_plan_json(p)


_json_leaf = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
              | st.text(alphabet=_any_char, max_size=6) | _tricky)
_json_value = st.recursive(_json_leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c,
                                                                                          max_size=3), max_leaves=6)
_PATHS = [("offer", k) for k in ("provider", "sku", "gpu", "gpus_per_instance", "usd_per_gpu_hour", "pricing",
                                 "region", "as_of", "source", "inter_node_gbps", "billing_granularity_s")] + \
    [("layout", k) for k in ("gpus_per_node", "nodes", "strategy", "tp", "pp", "offload_params")] + \
    [("job", k) for k in ("method", "precision", "micro_batch", "seq_len", "grad_accum", "lora", "quant", "epochs",
                          "gradient_checkpointing", "attn_impl", "optimizer", "dataset_tokens")] + \
    [("memory", "components"), ("memory", "device_total_bytes"), ("runtime", "total_hours"),
     ("runtime", "tokens_per_s"), ("cost", "usd"), ("model", "name"), ("model", "params_total"), ("", "notes"),
     ("", "strategy_label"), ("", "offer"), ("", "layout")]


@FUZZ
@given(edits=st.lists(st.tuples(st.sampled_from(_PATHS), _json_value), min_size=1, max_size=3),
       alt_edits=st.lists(st.tuples(st.sampled_from(_PATHS), _json_value), max_size=2))
def test_fuzz_plan_documents(plan, edits, alt_edits):
    doc, others = copy.deepcopy(plan[0]), copy.deepcopy(plan[1][:2])
    for target, changes in ((doc, edits), *((o, alt_edits) for o in others[:1])):
        for (section, key), value in changes:
            node = target if not section else target.get(section)
            if isinstance(node, dict):
                node[key] = value
    try:
        files = render_bundle(doc, alternatives=others)
    except ConfigError as e:
        assert "\n" not in e.one_line()
        return
    yaml.safe_load(files["accelerate_config.yaml"])
    if "sky.yaml" in files:
        yaml.safe_load(files["sky.yaml"])
    if "train.py" in files:
        compile(files["train.py"], "train.py", "exec")
        assert "= inf" not in files["train.py"] and "= nan" not in files["train.py"]
