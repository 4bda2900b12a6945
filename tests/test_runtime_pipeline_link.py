"""Interleaved pipeline schedule (layout.pp_virtual) and the offload host link, held against the
published statements they model (no torch):

* Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM", section 2.2.2): with v model chunks per pipeline rank the bubble time fraction is
  (1/v)(p-1)/m and "the amount of communication also increases by v";
* PCIe: an x8 Gen4 (or x16 Gen3) slot carries half the bytes of the x16 Gen4 link on which
  ``pcie_bytes_per_s`` was measured; a Gen5 link is not assumed faster than measured.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ftplan.catalog.efficiency import efficiency
from ftplan.catalog.gpus import load_gpus
from ftplan.errors import FtplanError
from ftplan.job import Job, Layout, validate_job
from ftplan.model import model_from_config
from ftplan.runtime import estimate_runtime, host_link_bytes_per_s, pp_bubble_fraction

CFG = dict(model_type="llama", hidden_size=1024, intermediate_size=4096, num_hidden_layers=8,
           num_attention_heads=16, num_key_value_heads=4, vocab_size=32000, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def model():
    return model_from_config(CFG, name="tiny-8-layers")


def test_interleaved_bubble_fraction_matches_megatron_paper():
    # paper: bubble time / ideal time = (1/v) (p - 1) / m; fraction of the step = that / (1 + that)
    for p, m, v in ((4, 4, 10), (4, 8, 2), (8, 32, 4), (2, 1, 3)):
        rel = (p - 1) / (v * m)
        assert pp_bubble_fraction(p, m, v) == pytest.approx(rel / (1 + rel))
    assert pp_bubble_fraction(4, 8) == pp_bubble_fraction(4, 8, 1) == pytest.approx(3 / 11)
    assert pp_bubble_fraction(1, 8, 4) == 0


def test_interleaving_divides_the_bubble_and_multiplies_the_sends(model):
    h100 = load_gpus()["h100-sxm"]
    job = Job(method="full", micro_batch=1, seq_len=2048, grad_accum=8)
    plain = estimate_runtime(model, job, Layout(gpus_per_node=4, strategy="ddp", pp=4), h100)
    inter = estimate_runtime(model, job, Layout(gpus_per_node=4, strategy="ddp", pp=4, pp_virtual=2), h100)
    # "the amount of communication also increases by v"
    assert inter.breakdown["pp_comm_s"] == pytest.approx(2 * plain.breakdown["pp_comm_s"])
    # the bubble is (p-1)/v micro-batch times instead of (p-1): half, up to the micro-batch time
    # growing by the extra sends
    assert inter.breakdown["pp_bubble_s"] == pytest.approx(plain.breakdown["pp_bubble_s"] / 2, rel=0.02)
    assert inter.step_time_s < plain.step_time_s


def test_pp_virtual_is_validated(model):
    with pytest.raises(FtplanError, match="virtual pipeline stages need pipeline parallelism"):
        validate_job(model, Job(), Layout(gpus_per_node=2, strategy="ddp", pp_virtual=2))
    with pytest.raises(FtplanError, match="model chunks exceed the 8 layers"):
        validate_job(model, Job(), Layout(gpus_per_node=4, strategy="ddp", pp=4, pp_virtual=3))
    validate_job(model, Job(), Layout(gpus_per_node=4, strategy="ddp", pp=4, pp_virtual=2))


def test_host_link_scales_offload_down_never_up():
    eff = efficiency()
    gpus = load_gpus()
    # the catalog's Gen4 x16 cards move offloaded bytes at the measured rate; Gen5 is not assumed faster
    assert host_link_bytes_per_s(gpus["rtx-4090"], eff) == eff.pcie_bytes_per_s
    assert host_link_bytes_per_s(gpus["h100-sxm"], eff) == eff.pcie_bytes_per_s
    # an x8 Gen4 / x16 Gen3 slot (15.75 GB/s per direction) carries half of an x16 Gen4 link
    slow = SimpleNamespace(pcie_bw_gbps=15.75)
    assert host_link_bytes_per_s(slow, eff) == pytest.approx(eff.pcie_bytes_per_s / 2)


def test_slower_host_link_slows_param_offload(model):
    base = load_gpus()["rtx-4090"]

    class Slot:  # the same card in an x8 Gen4 slot
        def __getattr__(self, name):
            return 15.75 if name == "pcie_bw_gbps" else getattr(base, name)

    job = Job(method="full", micro_batch=1, seq_len=1024, grad_accum=1)
    lay = Layout(gpus_per_node=2, strategy="fsdp", offload_params=True)
    fast = estimate_runtime(model, job, lay, base)
    slow = estimate_runtime(model, job, lay, Slot())
    assert slow.breakdown["offload_transfer_s"] == pytest.approx(2 * fast.breakdown["offload_transfer_s"])
