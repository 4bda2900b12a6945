"""--plot on estimate / recommend / compare: files are real PNG/SVG, written atomically, one-line errors."""

from __future__ import annotations

import os
import struct

import pytest

pytest.importorskip("matplotlib")

from ftplan.cli import main  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _png_size(path) -> tuple[int, int]:
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == PNG_SIGNATURE
    assert head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def test_recommend_png_and_svg(tmp_path, capsys):
    png = tmp_path / "frontier.png"
    rc = main(["recommend", "llama-3.1-70b", "--method", "lora", "--tokens", "100M", "--plot", str(png)])
    out, err = capsys.readouterr()
    assert rc == 0
    assert "cheapest" in out  # the normal text output is still printed
    assert err.strip() == f"wrote {png}"
    w, h = _png_size(png)
    assert w >= 1200 and h >= 700  # 150 dpi
    import matplotlib.image as mpimg

    img = mpimg.imread(str(png))
    assert img.shape[:2] == (h, w)
    assert img[..., :3].std() > 0.05  # not a blank canvas
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".ftplan-plot-")]  # temp file renamed

    svg = tmp_path / "frontier.svg"
    assert main(["compare", "llama-3.1-8b", "--method", "qlora", "--tokens", "20M", "--json",
                 "--plot", str(svg)]) == 0
    out, err = capsys.readouterr()
    assert out.lstrip().startswith("{")  # JSON on stdout untouched; the note goes to stderr
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    for word in ("Pareto frontier", "cheapest", "fastest", "best plan per GPU type", "llama-3.1-8b"):
        assert word in text


def test_estimate_breakdown_with_gpu_capacity(tmp_path, capsys):
    svg = tmp_path / "breakdown.svg"
    rc = main(["estimate", "llama-3.1-70b", "--method", "lora", "--gpu", "h100-sxm", "--plot", str(svg)])
    capsys.readouterr()
    assert rc == 0
    text = svg.read_text()
    assert "h100-sxm capacity" in text and "DOES NOT FIT on h100-sxm" in text
    assert "frozen weights" in text and "activations" in text

    from ftplan.plot import breakdown_figure

    doc = {"schema": "ftplan.estimate/1", "model": {"name": "m"}, "job": {}, "layout": {},
           "per_gpu": {"components": {"cuda_context": 2**29, "frozen_weights": 10 * 2**30,
                                      "activations": 5 * 2**30, "allocator_reserve": 2**30},
                       "device_total_bytes": 2**29 + 16 * 2**30, "peak_phase": "forward_backward"},
           "host_bytes": 0, "gpu": {"name": "toy-gpu", "memory_bytes": 24 * 2**30}}
    fig = breakdown_figure(doc)
    ax = fig.axes[0]
    caps = [ln for ln in ax.lines if ln.get_linestyle() == "--"]
    assert len(caps) == 1 and caps[0].get_xdata()[0] == pytest.approx(24.0)
    assert fig.ftplan_verdict.startswith("FITS on toy-gpu")
    # without a GPU: no capacity line, no verdict
    fig = breakdown_figure({**doc, "gpu": None})
    assert not [ln for ln in fig.axes[0].lines if ln.get_linestyle() == "--"]
    assert fig.ftplan_verdict is None


@pytest.mark.parametrize("argv", [
    ["estimate", "llama-3.1-8b", "--plot", "chart.jpg"],
    ["recommend", "llama-3.1-8b", "--tokens", "1M", "--plot", "chart"],
    ["compare", "llama-3.1-8b", "--tokens", "1M", "--plot", "no-such-folder/chart.png"],
])
def test_bad_plot_path_is_one_line(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""  # checked before any work is done
    assert err.count("\n") == 1 and err.startswith("ftplan: error: cannot plot to")
    assert os.listdir(tmp_path) == []


def test_missing_matplotlib_is_one_line(tmp_path, capsys, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_mpl(name, *args, **kw):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(name)
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    assert main(["estimate", "llama-3.1-8b", "--plot", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'ftplan[plot]'" in err


def test_frontier_from_plan_documents_and_empty(tmp_path):
    from ftplan.plot import frontier_figure, plot_frontier

    def plan(gpu, n, usd, hours, **flags):
        return {"offer": {"gpu": gpu, "provider": "p"}, "layout": {"gpus_per_node": n, "nodes": 1, "strategy": "ddp"},
                "strategy_label": "ddp", "cost": {"usd": usd}, "runtime": {"total_hours": hours}, **flags}

    plans = [plan("a", 1, 10.0, 10.0), plan("a", 8, 30.0, 1.5), plan("b", 8, 50.0, 2.0), plan("b", 64, 90.0, 0.3)]
    fig = frontier_figure(plans)  # no flags: the frontier, cheapest and fastest are computed
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert "cheapest: $10" in texts and "fastest: 18 min" in texts
    assert "8× a · ddp" in texts  # the middle frontier plan is annotated
    assert "8× b" not in texts  # a dominated plan is not
    out = plot_frontier([], tmp_path / "empty.png")
    assert _png_size(out)[0] > 0
