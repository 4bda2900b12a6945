"""Export of FP8 plans: the accelerate config selects the recipe as accelerate itself reads it.

Only the FP8-specific keys are ftplan's here (``mixed_precision: fp8``, ``fp8_config``, ``bf16`` off
in train.py, the backend package): the config is parsed and validated by accelerate's own
``accelerate launch`` code, its ``ACCELERATE_FP8_*`` environment is built by accelerate, and an
``Accelerator`` created from that environment converts a tiny real model to torchao's
``Float8Linear`` and trains one step on CPU.
"""

from __future__ import annotations

import warnings

import pytest

from ftplan import api
from ftplan.errors import ConfigError

accelerate = pytest.importorskip("accelerate")


@pytest.fixture(scope="module")
def fp8_search():
    return api.recommend("llama-3.1-8b", method="full", tokens="20M", precision="fp8", gpus_filter="h100-sxm",
                         gradient_checkpointing=True, max_gpus=8)


def _launch_env(tmp_path, text: str) -> tuple[object, dict[str, str]]:
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import setup_fp8_env

    path = tmp_path / "accelerate_config.yaml"
    path.write_text(text)
    cfg = load_config_from_file(str(path))
    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, _, _ = _validate_launch_command(args)
    return cfg, setup_fp8_env(args, {})


def test_fp8_plan_exports_an_accelerate_fp8_config(fp8_search, tmp_path):
    b = api.export_bundle(fp8_search, plan=1, zero3_backend="fsdp")
    cfg, env = _launch_env(tmp_path, b.files["accelerate_config.yaml"])
    assert cfg.mixed_precision == "fp8" and cfg.fp8_config["backend"] == "AO"
    assert env["ACCELERATE_FP8_BACKEND"] == "AO" and env["ACCELERATE_FP8_PAD_INNER_DIM"] == "True"
    # FSDP2: torchao gathers the converted weights in FP8; accelerate refuses AO with FSDP2's
    # CPU-RAM-efficient loading, so the export turns that off
    assert env["ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER"] == "True"
    assert cfg.fsdp_config["fsdp_version"] == 2 and cfg.fsdp_config["fsdp_cpu_ram_efficient_loading"] is False
    # SFTConfig(bf16=True) would override the launcher's fp8
    assert "BF16 = False" in b.files["train.py"]
    assert "torchao" in b.files["sky.yaml"]


def test_te_plan_exports_te_recipe(tmp_path):
    rec = api.recommend("llama-3.1-8b", method="full", tokens="20M", precision="fp8-te-delayed",
                        gpus_filter="h100-sxm", gradient_checkpointing=True, max_gpus=8)
    b = api.export_bundle(rec, plan=1, zero3_backend="fsdp")
    cfg, env = _launch_env(tmp_path, b.files["accelerate_config.yaml"])
    assert env["ACCELERATE_FP8_BACKEND"] == "TE" and env["ACCELERATE_FP8_AMAX_HISTORY_LEN"] == "1024"
    assert env["ACCELERATE_FP8_FORMAT"] == "HYBRID"


@pytest.mark.parametrize("precision,match", [("fp8-rowwise", "selected in code"), ("nvfp4-te", "selected in code")])
def test_recipes_accelerate_cannot_select_are_refused(precision, match):
    gpu = "b200" if "nvfp4" in precision else "h100-sxm"
    rec = api.recommend("llama-3.1-8b", method="full", tokens="20M", precision=precision, gpus_filter=gpu,
                        gradient_checkpointing=True, max_gpus=8)
    with pytest.raises(ConfigError, match=match):
        api.export_bundle(rec, plan=1, zero3_backend="fsdp")


def test_fp8_with_deepspeed_is_refused(fp8_search):
    with pytest.raises(ConfigError, match="MS-AMP"):
        api.export_bundle(fp8_search, plan=1, zero3_backend="deepspeed")


@pytest.mark.torch
def test_exported_fp8_environment_trains_with_float8_linears(fp8_search, tmp_path, monkeypatch):
    """The environment accelerate builds from the exported config makes ``Accelerator()`` convert
    the model's linears to torchao ``Float8Linear`` (all but the first and the last) and train."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pytest.importorskip("torchao")
    import ftplan.measure.torchref as TR

    b = api.export_bundle(fp8_search, plan=1, zero3_backend="fsdp")
    text = b.files["accelerate_config.yaml"].replace("distributed_type: FSDP", "distributed_type: NO")
    assert "distributed_type: NO" in text
    _, env = _launch_env(tmp_path, text)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp8")
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from torchao.float8.float8_linear import Float8Linear

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    try:
        cfg = dict(TR.TINY_CONFIGS["llama"], intermediate_size=128)
        model = TR.build_model(cfg, dtype="fp32", attn_implementation="sdpa")
        acc = Accelerator(cpu=True)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        model, opt = acc.prepare(model, opt)
        f8 = [n for n, m in model.named_modules() if isinstance(m, Float8Linear)]
        assert len(f8) == 2 * 7 - 1 and not any("lm_head" in n for n in f8)
        ids = torch.randint(0, cfg["vocab_size"], (2, 32))
        loss = model(input_ids=ids, labels=ids).loss
        acc.backward(loss)
        opt.step()
        assert torch.isfinite(loss)
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
