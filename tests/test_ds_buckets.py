"""``Layout.ds_reduce_bucket_size``: an explicit DeepSpeed ``reduce_bucket_size`` (e.g. DeepSpeed's own
default, 5e8 elements, which applies when accelerate is given no DeepSpeed JSON).

The memory side (ZeRO-3's ipg bucket allocated at that size) is held byte-exact against a real
DeepSpeed run on CPU in ``tests/test_distributed_memory.py`` (qwen2 ZeRO-3 with an explicit bucket).
Here: the exported ds_config.json carries the value and DeepSpeed's / transformers' own parsers keep
it; the option is refused, naming the field, outside the ZeRO strategies.
"""

from __future__ import annotations

import pytest

from ftplan.errors import ConfigError
from ftplan.export.deepspeed import deepspeed_config
from ftplan.job import Job, Layout, validate_job
from ftplan.catalog.models import resolve_model


def test_export_writes_the_explicit_bucket_and_deepspeed_parses_it():
    job = Job(method="lora", precision="bf16-mixed")
    cfg = deepspeed_config(Layout(8, 1, "zero3", ds_reduce_bucket_size=500_000_000), job)
    assert cfg["zero_optimization"]["reduce_bucket_size"] == 500_000_000
    assert deepspeed_config(Layout(8, 1, "zero3"), job)["zero_optimization"]["reduce_bucket_size"] == "auto"
    zero_config = pytest.importorskip("deepspeed.runtime.zero.config")
    parsed = zero_config.DeepSpeedZeroConfig(**cfg["zero_optimization"])
    assert parsed.reduce_bucket_size == 500_000_000
    # and DeepSpeed's default, when nothing is given, is the value the option names
    assert zero_config.DeepSpeedZeroConfig(stage=3).reduce_bucket_size == 500_000_000


def test_option_outside_zero_is_refused_with_the_field():
    model = resolve_model("llama-3.1-8b")
    with pytest.raises(ConfigError) as e:
        validate_job(model, Job(), Layout(2, 1, "fsdp", ds_reduce_bucket_size=1000))
    assert "ds_reduce_bucket_size" in str(e.value)
    validate_job(model, Job(), Layout(2, 1, "zero2", ds_reduce_bucket_size=1000))  # accepted
