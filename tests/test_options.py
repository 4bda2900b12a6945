"""The options schema is the one source: CLI flags, web request fields and JSON keys all equal it.

A forgotten place fails here: a Job/Layout field without option metadata, a CLI flag or web field
that is not in the schema (or missing), a JSON key that is not a field.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from ftplan.cli import build_parser
from ftplan.cli.options import add_options, values
from ftplan.errors import ConfigError
from ftplan.job import Job, Layout, LoraSpec, QuantSpec
from ftplan.options import (
    DATA_OPTIONS,
    FIT_OPTIONS,
    JOB_OPTIONS,
    LAYOUT_OPTIONS,
    OFFER_OPTIONS,
    SEARCH_OPTIONS,
    build_job,
    build_layout,
    job_from_dict,
    job_to_dict,
    layout_from_dict,
    layout_to_dict,
    schema_doc,
    to_dict,
)
from ftplan.optionspec import option, walk

LORA = Job(method="lora", lora=LoraSpec(r=8, alpha=16, dropout=0.1, target_modules=("q_proj", "v_proj")))
QLORA = Job(method="qlora", seq_len=4096, quant=QuantSpec(quant_type="fp4", double_quant=False),
            dataset_tokens=50_000_000, epochs=2.0)


def _subparser(command: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def _flags(parser: argparse.ArgumentParser, group: str) -> dict[str, set[str]]:
    """dest -> option strings of an argument group."""
    g = next(g for g in parser._action_groups if g.title == group)
    return {a.dest: set(a.option_strings) for a in g._group_actions}


def _schema_flags(table) -> dict[str, set[str]]:
    return {o.name: set(o.all_flags) for o in table if o.cli}


# ---------------------------------------------------------------------------------------------
# every field declares what it is
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [Job, Layout, LoraSpec, QuantSpec])
def test_every_field_has_option_metadata(cls):
    opts = list(walk(cls))  # raises TypeError for a field declared without option/json_field/internal
    assert {o.attr.split(".")[0] for o in opts} <= {f.name for f in dataclasses.fields(cls)}


def test_option_defaults_are_the_dataclass_defaults():
    for o in JOB_OPTIONS + LAYOUT_OPTIONS:
        value = Job() if o.group == "job" else Layout()
        for part in o.attr.split("."):
            value = getattr(value, part)
        if o.auto is not None:
            assert o.default is None, o.name  # "auto" in the CLI and the web
        elif o.invert:
            assert o.default is (not value), o.name
        else:
            assert o.default == value, o.name


def test_option_names_are_unique_and_well_formed():
    names = [o.name for o in JOB_OPTIONS + LAYOUT_OPTIONS + SEARCH_OPTIONS + OFFER_OPTIONS]
    assert len(names) == len(set(names))
    for o in JOB_OPTIONS + LAYOUT_OPTIONS + SEARCH_OPTIONS + OFFER_OPTIONS + FIT_OPTIONS:
        assert o.name.isidentifier() and o.name == o.name.lower(), o.name
        assert o.help, f"{o.name} has no help"
        assert all(f.startswith("--") for f in o.flags)


# ---------------------------------------------------------------------------------------------
# CLI flags == schema
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command, groups", [
    ("estimate", {"job": JOB_OPTIONS, "layout": LAYOUT_OPTIONS, "data": DATA_OPTIONS}),
    ("recommend", {"job": JOB_OPTIONS, "offers": OFFER_OPTIONS, "search": SEARCH_OPTIONS, "data": DATA_OPTIONS}),
    ("compare", {"job": JOB_OPTIONS, "offers": OFFER_OPTIONS, "search": SEARCH_OPTIONS, "data": DATA_OPTIONS}),
    ("export", {"job": JOB_OPTIONS, "offers": OFFER_OPTIONS, "search": SEARCH_OPTIONS}),
    ("fit", {"job": JOB_OPTIONS, "fit": FIT_OPTIONS, "data": DATA_OPTIONS}),
    ("measure", {"job": JOB_OPTIONS, "layout": LAYOUT_OPTIONS}),
    ("train", {"job": JOB_OPTIONS, "layout": LAYOUT_OPTIONS}),
    ("offers", {"offers": OFFER_OPTIONS}),
])
def test_cli_flags_equal_the_schema(command, groups):
    p = _subparser(command)
    for group, table in groups.items():
        assert _flags(p, group) == _schema_flags(table), (command, group)


def test_existing_flags_and_aliases_are_kept():
    flags = set().union(*_schema_flags(JOB_OPTIONS + LAYOUT_OPTIONS).values())
    assert {"--method", "--precision", "--optimizer", "--micro-batch", "--batch-size", "--seq-len", "--grad-accum",
            "--gradient-checkpointing", "--gc", "--attn", "--lora-r", "--lora-alpha", "--lora-dropout",
            "--lora-targets", "--quant-type", "--no-double-quant", "--compute-dtype", "--tokens", "--epochs",
            "--gpus", "--nodes", "--strategy", "--offload-optimizer", "--offload-params", "--tp", "--pp", "--ep",
            "--pp-virtual",  # interleaved pipeline schedule (issue 15)
            "--fsdp-version", "--fsdp-reduce-dtype", "--no-reshard", "--hsdp", "--ddp-bucket-view", "--ds-reduce-bucket-size",
            # checkpointing is on by default (TRL SFTConfig): the --no- forms turn it off
            "--no-gradient-checkpointing", "--no-gc", "--checkpointing", "--checkpoint-every",
            "--activation-offloading", "--loss", "--keep-output", "--padding-free", "--packing",
            "--base-dtype",  # the LoRA base's load dtype (TRL loads a model id in fp32)
            # runtime-only job options (issue 15)
            "--optimizer-impl", "--compile", "--torch-compile",
            "--qlora-recipe",  # PEFT's or TRL SFTTrainer's QLoRA preparation
            "--padded-batches", "--padded",  # a padded micro-batch (attention_mask with zeros)
            # DeepSpeed ZeRO-3's gather limits (sharding._ds_capped_gather_elems)
            "--ds-max-live-parameters", "--ds-max-reuse-distance", "--ds-prefetch-bucket-size",
            "--fsdp-wrap"} == flags  # torchtune's own FSDP2 units (Layout.fsdp_wrap)


def test_cli_values_build_the_job():
    a = build_parser().parse_args(["estimate", "m", "--method", "QLoRA", "--batch-size", "4", "--gc", "--attn",
                                   "EAGER", "--optimizer", "AdamW-8bit", "--lora-targets", "q_proj, v_proj",
                                   "--no-double-quant", "--tokens", "1.5B", "--gpus", "2"])
    v = values(a, JOB_OPTIONS)
    assert "seq_len" not in v  # only what was given: the defaults live in the schema
    job = build_job(v)
    assert job == Job(method="qlora", micro_batch=4, gradient_checkpointing=True, attn_impl="eager",
                      optimizer="adamw_8bit", lora=LoraSpec(target_modules=("q_proj", "v_proj")),
                      quant=QuantSpec(double_quant=False), dataset_tokens=1_500_000_000)
    assert build_layout(values(a, LAYOUT_OPTIONS)) == Layout(gpus_per_node=2, strategy="ddp")


# ---------------------------------------------------------------------------------------------
# web request fields == schema
# ---------------------------------------------------------------------------------------------
def test_web_request_fields_equal_the_schema():
    schemas = pytest.importorskip("ftplan.web.schemas")
    ref = {"model", "config", "config_name"}
    web = lambda table: {o.name for o in table if o.web}  # noqa: E731
    assert set(schemas.JobRequest.model_fields) == ref | web(JOB_OPTIONS)
    assert set(schemas.EstimateRequest.model_fields) == ref | web(JOB_OPTIONS) | web(LAYOUT_OPTIONS) | {"gpu"}
    assert set(schemas.SearchRequest.model_fields) == (ref | web(JOB_OPTIONS) | web(SEARCH_OPTIONS)
                                                        | web(OFFER_OPTIONS))
    assert set(schemas.ExportRequest.model_fields) == (set(schemas.SearchRequest.model_fields)
                                                        | {"plan_index", "alternatives", "dataset", "export_target"})
    assert set(schemas.FitRequest.model_fields) == ref | web(JOB_OPTIONS) | web(FIT_OPTIONS)
    # files are never web fields: the web app reads no server path
    assert not web(OFFER_OPTIONS) & {"offers", "skypilot_catalog", "no_bundled_offers"}
    # defaults and choices are the schema's
    fields = schemas.EstimateRequest.model_fields
    for o in JOB_OPTIONS + LAYOUT_OPTIONS:
        want = list(o.default) if isinstance(o.default, tuple) else o.default
        assert fields[o.name].default == want, o.name


def test_web_requests_normalize_like_the_cli():
    schemas = pytest.importorskip("ftplan.web.schemas")
    r = schemas.SearchRequest(model="m", method=" LoRA", optimizer="AdamW-8bit", tokens="5M", lora_targets="q_proj, ",
                              providers="RunPod, aws", pricing="any")
    assert (r.method, r.optimizer, r.tokens, r.lora_targets) == ("lora", "adamw_8bit", 5_000_000, ["q_proj"])
    assert r.providers == ["aws", "runpod"] and r.pricing is None
    assert build_job(r.values(JOB_OPTIONS)) == build_job({"method": "lora", "optimizer": "adamw_8bit",
                                                          "tokens": "5M", "lora_targets": "q_proj"})


# ---------------------------------------------------------------------------------------------
# JSON keys == schema
# ---------------------------------------------------------------------------------------------
def _paths(d: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in d.items():
        out |= _paths(v, prefix + k + ".") if isinstance(v, dict) else {prefix + k}
    return out


def test_json_keys_equal_the_schema():
    opts = list(walk(Job))
    always = {o.attr for o in opts if o.json == "always"}
    data = {o.attr for o in opts if o.json == "data"}
    assert _paths(job_to_dict(QLORA)) == always
    assert _paths(job_to_dict(QLORA, data=True)) == always | data
    assert _paths(job_to_dict(Job())) == {a for a in always if "." not in a}  # lora/quant only when used
    assert _paths(job_to_dict(LORA)) == {a for a in always if not a.startswith("quant.")}
    assert _paths(layout_to_dict(Layout())) == {o.attr for o in walk(Layout)}


def test_full_json_is_asdict():
    """Measurement records (and their resume keys) keep every field, as dataclasses.asdict."""
    for job in (Job(), LORA, QLORA):
        assert job_to_dict(job, full=True) == json.loads(json.dumps(dataclasses.asdict(job)))
    lay = Layout(gpus_per_node=8, strategy="zero3", offload_optimizer=True)
    assert layout_to_dict(lay, full=True) == dataclasses.asdict(lay)


@pytest.mark.parametrize("job", [Job(), LORA, QLORA, Job(method="full", gradient_checkpointing=True, seq_len=8192)])
def test_json_round_trips(job):
    assert job_from_dict(json.loads(json.dumps(job_to_dict(job, full=True)))) == job
    assert job_from_dict(job_to_dict(job, data=True)) == job
    lay = Layout(gpus_per_node=4, nodes=2, strategy="fsdp", offload_params=True, tp=2)
    assert layout_from_dict(json.loads(json.dumps(layout_to_dict(lay)))) == lay


def test_json_reader_names_the_bad_key():
    with pytest.raises(ConfigError) as e:
        job_from_dict({"method": "lora", "micro_batch": "many", "lora": {"r": "x"}})
    assert {p.message.split(":")[0] for p in e.value.problems} == {"job.micro_batch", "job.lora.r"}
    assert job_from_dict({"method": "lora", "unknown_key": 1}).method == "lora"  # newer documents still read


def test_schema_doc_is_json():
    doc = json.loads(json.dumps(schema_doc()))
    assert doc["schema"] == "ftplan.options/1"
    assert [o["name"] for o in doc["groups"]["job"]] == [o.name for o in JOB_OPTIONS]
    seq = next(o for o in doc["groups"]["job"] if o["name"] == "seq_len")
    assert seq["default"] == 1024 and seq["flag"] == "--seq-len" and seq["minimum"] == 1  # TRL max_length


# ---------------------------------------------------------------------------------------------
# adding an option is one declaration
# ---------------------------------------------------------------------------------------------
def test_adding_an_option_is_one_field():
    """One new field with option metadata is a CLI flag, a web field, a JSON key and a checked bound."""
    ext = dataclasses.make_dataclass(
        "ExtJob", [("packing_ratio", float, option(1.0, minimum=0.0, maximum=1.0, flags=("--pack",),
                                                   help="fraction of padding removed by packing"))],
        bases=(Job,), frozen=True)
    table = tuple(o for o in walk(ext) if o.is_option)
    new = next(o for o in table if o.name == "packing_ratio")
    assert (new.flag, new.attr, new.default) == ("--packing-ratio", "packing_ratio", 1.0)
    # CLI
    p = argparse.ArgumentParser()
    add_options(p, table, "job")
    assert values(p.parse_args(["--pack", "0.5"]), table) == {"packing_ratio": 0.5}
    # JSON
    assert to_dict(ext(packing_ratio=0.5))["packing_ratio"] == 0.5
    # bounds
    assert [p.field for p in new.check(2.0)] == ["packing_ratio"]
    # web
    schemas = pytest.importorskip("ftplan.web.schemas")
    ann, field = schemas.option_fields(table)["packing_ratio"]
    assert ann is float and field.default == 1.0
