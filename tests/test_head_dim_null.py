"""An explicit ``"head_dim": null`` in config.json, as transformers 5.24 reads it.

Where the config class accepts it (Ernie4_5Config and SeedOssConfig fill in ``hidden_size //
num_attention_heads``, not their default 128; the classes whose default is None anyway) ftplan
plans that width; the strict classes (an int field with a non-None default: qwen3, gemma2/3/4,
gpt_oss, qwen3.5, qwen3_next, llama4, minimax_m2) refuse the config, and so does ftplan, in one line.
"""

from __future__ import annotations

import json
import warnings

import pytest

from ftplan.errors import ConfigError
from ftplan.model import FAMILIES, model_from_config

#: every family whose default head_dim is not None (the others plan hidden // heads for a null
#: head_dim as for a missing one), plus llama as one of those
CASES = sorted(f for f, fam in FAMILIES.items() if fam.defaults.get("head_dim") is not None) + ["llama"]


@pytest.mark.torch
@pytest.mark.parametrize("family", CASES)
def test_null_head_dim_as_transformers_reads_it(family, tmp_path):
    pytest.importorskip("transformers")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    import ftplan.measure.torchref as TR

    cfg = {**TR.TINY_CONFIGS[family], "head_dim": None}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hf = AutoConfig.from_pretrained(tmp_path)
    except Exception as e:  # noqa: BLE001 (strict dataclass validation)
        assert "head_dim" in str(e)
        with pytest.raises(ConfigError, match="head_dim is null") as err:
            model_from_config(cfg)
        assert "\n" not in str(err.value)
        return
    spec = model_from_config(cfg)
    assert spec.attention.head_dim == cfg["hidden_size"] // cfg["num_attention_heads"]
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(hf)
    assert spec.params.total == sum(p.numel() for p in model.parameters())
