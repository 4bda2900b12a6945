"""Charts for ``--plot FILE.png|svg``: the per-GPU memory breakdown and the cost-time frontier.

matplotlib is the optional ``plot`` extra (``pip install 'ftplan[plot]'``). It is imported only
inside the functions here, and only its object-oriented API is used (``Figure`` + the Agg
canvas), so the process-wide default backend and pyplot state are never touched.

* ``plot_breakdown(doc_or_breakdown, path, gpu_capacity_bytes=..., gpu_name=...)``: one
  horizontal stacked bar of the per-GPU memory components (GiB), the total, the GPU's capacity
  line and a fits / does-not-fit verdict.
* ``plot_frontier(plans, path, ...)``: cost of the completed job vs time to finish for every
  feasible plan, coloured by GPU type, with the Pareto frontier as a step line and its plans
  annotated; cheapest and fastest are labelled.

The file format comes from the extension (``.png`` at 150 dpi, ``.svg``); files are written
atomically (a temporary file in the same folder, then a rename). ``check_plot_path`` validates
a path (and that matplotlib is installed) before any work is done.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._files import atomic_open
from .errors import ConfigError
from .memory import PEAK_PHASE_TEXT

__all__ = ["check_plot_path", "plot_breakdown", "plot_frontier", "breakdown_figure", "frontier_figure",
           "FORMATS", "PNG_DPI"]

#: extension -> matplotlib format
FORMATS = {".png": "png", ".svg": "svg"}
PNG_DPI = 150
_GIB = 2**30
_INSTALL_HINT = "pip install 'ftplan[plot]'"

# component -> (label, colour); report order of ftplan.memory.COMPONENTS
_COMPONENT_STYLE: dict[str, tuple[str, str]] = {
    "cuda_context": ("CUDA context", "#6b6b6b"),
    "nccl_buffers": ("NCCL communicators", "#a0a0a0"),
    "frozen_weights": ("frozen weights", "#1f5fa8"),
    "trainable_weights": ("trainable weights", "#4c9be8"),
    "master_weights": ("fp32 master weights", "#9cc7f2"),
    "gradients": ("gradients", "#f28e2b"),
    "optimizer_states": ("optimizer states", "#3a9b4a"),
    "comm_buffers": ("engine buffers", "#17becf"),
    "activations": ("activations", "#c0392b"),
    "logits_and_loss": ("logits + loss", "#e377c2"),
    "transient": ("transient peak", "#9c755f"),
    "step_temporaries": ("optimizer-step temporaries", "#9c755f"),
    "stream_pools": ("FSDP2 stream pools", "#d4b9da"),
    "allocator_reserve": ("allocator reserve", "#c9c9c9"),
}
_PEAK_FWD_ONLY = ("activations", "logits_and_loss", "transient")

# distinct colours for GPU types (tab10 then the darker/lighter tab20 companions), and markers
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
            "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
            "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")


# ---------------------------------------------------------------------------------------------
# matplotlib, paths, atomic writes
# ---------------------------------------------------------------------------------------------
def _mpl():
    """(Figure, FigureCanvasAgg, ticker) without touching the global backend or pyplot."""
    try:
        from matplotlib import ticker
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError("`plot` needs matplotlib, which is not installed", _INSTALL_HINT) from None
    return Figure, FigureCanvasAgg, ticker


def check_plot_path(path: str | os.PathLike[str]) -> str:
    """The matplotlib format for ``path`` ('png' or 'svg'); raises ConfigError for an unsupported
    extension, a missing folder, or a missing matplotlib. Cheap; call it before the real work."""
    p = os.fspath(path)
    ext = os.path.splitext(p)[1].lower()
    if ext not in FORMATS:
        raise ConfigError(f"cannot plot to {p!r}: unsupported extension {ext or '(none)'!r}",
                          "use a .png or .svg file name")
    folder = os.path.dirname(os.path.abspath(p))
    if not os.path.isdir(folder):
        raise ConfigError(f"cannot plot to {p!r}: folder {folder!r} does not exist", "create it first")
    _mpl()
    return FORMATS[ext]


def _save(fig, path: str | os.PathLike[str]) -> str:
    """Write ``fig`` to ``path`` atomically (temp file in the same folder + rename)."""
    fmt = check_plot_path(path)
    p = os.fspath(path)
    kw: dict[str, Any] = {"format": fmt}
    if fmt == "png":
        kw["dpi"] = PNG_DPI
    else:
        kw["metadata"] = {"Date": None}  # reproducible SVGs
    with atomic_open(p, binary=True, mode_bits=0o644) as f:
        fig.savefig(f, **kw)
    return p


def _new_figure(w: float, h: float):
    Figure, FigureCanvasAgg, _ = _mpl()
    fig = Figure(figsize=(w, h), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _fmt_gib(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:,.1f}" if v >= 1 else f"{v:,.2f}"


# ---------------------------------------------------------------------------------------------
# memory breakdown
# ---------------------------------------------------------------------------------------------
def _breakdown_parts(source: Any) -> dict[str, Any]:
    """Normalise an estimate JSON document (``ftplan.estimate/1``) or a MemoryBreakdown."""
    if isinstance(source, Mapping):
        per = source.get("per_gpu", source)
        comps = dict(per["components"])
        out = {"components": comps, "total": per.get("device_total_bytes", sum(comps.values())),
               "peak_phase": per.get("peak_phase", "forward_backward"),
               "host": source.get("host_bytes", 0) or 0}
        model, job, layout = source.get("model") or {}, source.get("job") or {}, source.get("layout") or {}
        gpu = source.get("gpu") or {}
        out.update(model=model.get("name"), job=job, layout=layout, gpu_name=gpu.get("name"),
                   gpu_bytes=gpu.get("memory_bytes"))
        return out
    comps = dict(source.components)
    return {"components": comps, "total": source.device_total_bytes, "peak_phase": source.peak_phase,
            "host": source.host_bytes, "model": None, "job": {}, "layout": {}, "gpu_name": None,
            "gpu_bytes": None}


def _segments(parts: dict[str, Any]) -> list[tuple[str, float]]:
    """(component key, bytes) that add up to the device total, in stacking order."""
    comps = parts["components"]
    total = parts["total"]
    keys = [k for k in _COMPONENT_STYLE if k in comps]
    keys += [k for k in comps if k not in _COMPONENT_STYLE]
    if parts["peak_phase"] == "optimizer_step":
        # the peak is the optimizer step: activations are freed, the step's temporaries remain
        keys = [k for k in keys if k not in _PEAK_FWD_ONLY]
        rest = total - sum(comps[k] for k in keys)
        segs = [(k, float(comps[k])) for k in keys]
        if rest > 0:
            segs.insert(len(segs) - 1 if segs and segs[-1][0] == "allocator_reserve" else len(segs),
                        ("step_temporaries", float(rest)))
    else:
        segs = [(k, float(comps[k])) for k in keys]
    # CUDA context first, allocator reserve last: the bar reads "driver, model states, peak, slack"
    return [(k, v) for k, v in segs if v > 0]


def _layout_text(lo: Mapping[str, Any]) -> str:
    if not lo:
        return ""
    world = lo.get("gpus_per_node", 1) * lo.get("nodes", 1)
    s = f"{world} GPU{'s' if world > 1 else ''}"
    if lo.get("nodes", 1) > 1:
        s += f" ({lo['nodes']} nodes)"
    s += f", {lo.get('strategy', 'single')}"
    for k in ("tp", "pp"):
        if lo.get(k, 1) > 1:
            s += f", {k}={lo[k]}"
    if lo.get("offload_params"):
        s += ", offload params"
    elif lo.get("offload_optimizer"):
        s += ", offload optimizer"
    return s


def breakdown_figure(source: Any, *, gpu_capacity_bytes: int | None = None, gpu_name: str | None = None,
                     title: str | None = None):
    """The memory-breakdown Figure (see ``plot_breakdown``); for tests and embedding."""
    parts = _breakdown_parts(source)
    cap = gpu_capacity_bytes if gpu_capacity_bytes is not None else parts["gpu_bytes"]
    gname = gpu_name or parts["gpu_name"] or "GPU"
    segs = _segments(parts)
    total = parts["total"] / _GIB

    fig = _new_figure(12.5, 5.0)
    ax = fig.add_subplot()
    ax.set_facecolor("white")
    span = max(total, (cap or 0) / _GIB) * 1.16 or 1.0
    left = 0.0
    handles = []
    from matplotlib import patheffects
    from matplotlib.patches import Patch

    for key, v in segs:
        gib = v / _GIB
        label, color = _COMPONENT_STYLE.get(key, (key.replace("_", " "), "#bbbbbb"))
        ax.barh(0, gib, left=left, height=0.56, color=color, edgecolor="white", linewidth=1.2, zorder=2)
        frac = gib / span
        if frac >= 0.075:
            dark = _luminance(color) < 0.55
            name = label if frac >= 0.13 else label.replace(" ", "\n", 1)
            ax.text(left + gib / 2, 0, f"{name}\n{_fmt_gib(gib)} GiB", ha="center", va="center",
                    fontsize=12 if frac >= 0.11 else 10.5, color="white" if dark else "#1a1a1a",
                    fontweight="bold", zorder=7, linespacing=1.15,
                    path_effects=[patheffects.withStroke(linewidth=3, foreground=color)])
        handles.append(Patch(facecolor=color, edgecolor="none", label=f"{label}  {_fmt_gib(gib)} GiB"))
        left += gib

    ax.text(total + span * 0.008, 0.33, f"total {_fmt_gib(total)} GiB", ha="left", va="bottom",
            fontsize=13, fontweight="bold", color="#1a1a1a", zorder=5)
    verdict = None
    if cap:
        cap_gib = cap / _GIB
        fits = parts["total"] <= cap
        color = "#1e7d32" if fits else "#c62828"
        ax.axvline(cap_gib, color=color, linewidth=2.5, linestyle="--", zorder=6)
        ax.text(cap_gib, -0.40, f"{gname}: {_fmt_gib(cap_gib)} GiB ", ha="right", va="top",
                fontsize=12.5, color=color, fontweight="bold", zorder=6,
                path_effects=[patheffects.withStroke(linewidth=3, foreground="white")])
        if not fits:
            ax.axvspan(cap_gib, span, color="#c62828", alpha=0.07, zorder=0)
        head = (cap - parts["total"]) / _GIB
        verdict = (f"FITS on {gname} — {_fmt_gib(head)} GiB headroom" if fits
                   else f"DOES NOT FIT on {gname} — short by {_fmt_gib(-head)} GiB")
        ax.text(0.995, 0.965, verdict, transform=ax.transAxes, ha="right", va="top", fontsize=14,
                fontweight="bold", color="white", zorder=7,
                bbox={"boxstyle": "round,pad=0.4", "facecolor": color, "edgecolor": "none"})
        handles.append(_line_handle(color, f"{gname} capacity"))

    ax.set_xlim(0, span)
    ax.set_ylim(-0.62, 0.62)
    ax.set_yticks([])
    ax.set_xlabel("GiB per GPU (what nvidia-smi shows at the peak)", fontsize=13)
    ax.tick_params(axis="x", labelsize=12)
    ax.grid(axis="x", color="#e3e3e3", zorder=0)
    for s in ("left", "right", "top"):
        ax.spines[s].set_visible(False)

    if title is None:
        job, lo = parts["job"], parts["layout"]
        bits = [parts["model"] or "model"]
        if job:
            bits.append(f"{job.get('method', '?')} ({job.get('precision', '?')}, {job.get('optimizer', '?')})")
            bits.append(f"micro-batch {job.get('micro_batch', '?')} × {job.get('seq_len', '?')}"
                        + (", checkpointing" if job.get("gradient_checkpointing") else ""))
        if lo:
            bits.append(_layout_text(lo))
        title = " · ".join(bits)
    phase = PEAK_PHASE_TEXT.get(parts["peak_phase"], "forward/backward")
    sub = f"per-GPU memory at the peak ({phase})"
    if parts["host"]:
        sub += f"; plus {_fmt_gib(parts['host'] / _GIB)} GiB host RAM for offload"
    fig.suptitle(title, fontsize=15, fontweight="bold", x=0.01, ha="left")
    ax.set_title(sub, fontsize=12.5, loc="left", color="#444444")
    fig.legend(handles=handles, loc="outside lower center", ncol=min(4, len(handles)), fontsize=11.5,
               frameon=False, handlelength=1.4, columnspacing=1.6)
    fig.ftplan_verdict = verdict  # type: ignore[attr-defined]
    return fig


def plot_breakdown(source: Any, path: str | os.PathLike[str], *, gpu_capacity_bytes: int | None = None,
                   gpu_name: str | None = None, title: str | None = None) -> str:
    """Write the per-GPU memory breakdown of ``source`` (an ``ftplan.estimate/1`` document, as
    ``report.estimate_json`` builds it, or a ``MemoryBreakdown``) to ``path`` (.png or .svg).

    With a GPU (in the document, or ``gpu_capacity_bytes`` + ``gpu_name``) the chart draws its
    capacity and says whether the job fits. Returns the path written."""
    check_plot_path(path)
    return _save(breakdown_figure(source, gpu_capacity_bytes=gpu_capacity_bytes, gpu_name=gpu_name,
                                  title=title), path)


def _luminance(hex_color: str) -> float:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) / 255 for i in (0, 2, 4))
    return 0.299 * r + 0.587 * g + 0.114 * b


def _line_handle(color: str, label: str):
    from matplotlib.lines import Line2D

    return Line2D([], [], color=color, linewidth=2.5, linestyle="--", label=label)


# ---------------------------------------------------------------------------------------------
# cost-time frontier
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Pt:
    gpu: str
    gpus: int
    nodes: int
    strategy: str
    provider: str
    usd: float
    hours: float
    pareto: bool
    cheapest: bool
    fastest: bool

    @property
    def label(self) -> str:
        return f"{self.gpus}× {self.gpu} · {self.strategy}"


def _point(p: Any) -> _Pt:
    if isinstance(p, Mapping):  # a plan document (cli_planner.plan_dict / the JSON output)
        lo, o = p["layout"], p["offer"]
        return _Pt(gpu=o["gpu"], gpus=lo["gpus_per_node"] * lo["nodes"], nodes=lo["nodes"],
                   strategy=p.get("strategy_label") or lo["strategy"], provider=o.get("provider", ""),
                   usd=float(p["cost"]["usd"]), hours=float(p["runtime"]["total_hours"] or 0.0),
                   pareto=bool(p.get("pareto")), cheapest=bool(p.get("cheapest")),
                   fastest=bool(p.get("fastest")))
    return _Pt(gpu=p.gpu.name, gpus=p.layout.world_size, nodes=p.layout.nodes, strategy=p.strategy_label,
               provider=p.offer.provider, usd=float(p.usd), hours=float(p.hours), pareto=bool(p.pareto),
               cheapest=bool(p.cheapest), fastest=bool(p.fastest))


def _pareto_of(pts: Sequence[_Pt]) -> list[_Pt]:
    best = []
    for q in sorted(pts, key=lambda q: (q.hours, q.usd)):
        if not best or q.usd < best[-1].usd:
            best.append(q)
    return best


def _pick_annotated(front: Sequence[_Pt], limit: int) -> list[_Pt]:
    """Cheapest, fastest and up to ``limit`` frontier plans spread evenly along the frontier."""
    if len(front) <= limit:
        return list(front)
    idx = {0, len(front) - 1}
    for i in range(1, limit - 1):
        idx.add(round(i * (len(front) - 1) / (limit - 1)))
    return [front[i] for i in sorted(idx)]


def _money(v: float) -> str:
    if v >= 10_000:
        return f"${v / 1000:,.0f}k"
    if v >= 1000:
        return f"${v / 1000:,.1f}k"
    if v >= 100:
        return f"${v:,.0f}"
    if v >= 1:
        return f"${v:,.2f}".rstrip("0").rstrip(".") if v < 10 else f"${v:,.1f}".rstrip("0").rstrip(".")
    return f"${v:,.2f}"


def _hours(v: float) -> str:
    if v >= 48:
        return f"{v / 24:,.1f} d"
    if v >= 10:
        return f"{v:,.0f} h"
    if v >= 1:
        return f"{v:,.1f} h"
    return f"{v * 60:,.0f} min"


def _money_tick(v: float) -> str:
    if v >= 1000:
        k = v / 1000
        return f"${k:,.0f}k" if k == int(k) else f"${k:,.1f}k"
    return f"${v:,.0f}" if v >= 1 else f"${v:,.2f}"


def _hours_tick(v: float) -> str:
    if v >= 1:
        return f"{v:,.0f} h" if v == int(v) else f"{v:,.1f} h"
    return f"{v * 60:,.0f} min"


def _axis_ticks(ax, axis: str, lo: float, hi: float, fmt) -> None:
    """Log scale if the range is wide (> 15x), with readable 1-2-5 ticks either way."""
    _, _, ticker = _mpl()
    a = ax.xaxis if axis == "x" else ax.yaxis
    if hi / max(lo, 1e-12) > 15:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
        a.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        a.set_minor_locator(ticker.LogLocator(base=10, subs=tuple(range(1, 10))))
        a.set_minor_formatter(ticker.NullFormatter())
    else:
        a.set_major_locator(ticker.MaxNLocator(nbins=7, steps=[1, 2, 2.5, 5, 10]))
    a.set_major_formatter(ticker.FuncFormatter(lambda v, _pos: fmt(v) if v > 0 else "0"))


def _place_labels(fig, ax, items, hard_px, soft_px, lines_px=()) -> None:
    """Greedy label placement, most important label first. Each (x, y, text, style, required) gets
    the candidate offset with the lowest score: overlap with earlier labels or frontier points and
    leader lines crossing earlier leaders (hard), leader lines crossing the frontier line, ordinary
    points covered (soft), then distance from its point; never outside the axes. A label that is
    not ``required`` and has no free spot is left out rather than overlap."""
    from matplotlib.text import Text
    from matplotlib.transforms import Bbox

    renderer = fig.canvas.get_renderer()
    axbox = ax.get_window_extent(renderer)
    placed: list = list(hard_px)
    leaders: list = []
    dirs = [(1, 0, "left", "center"), (-1, 0, "right", "center"), (0, 1, "center", "bottom"),
            (0, -1, "center", "top"), (1, 1, "left", "bottom"), (-1, -1, "right", "top"),
            (1, -1, "left", "top"), (-1, 1, "right", "bottom"), (0.4, 1, "left", "bottom"),
            (-0.4, 1, "right", "bottom"), (0.4, -1, "left", "top"), (-0.4, -1, "right", "top")]
    # leader lines (far offsets) only on slants: a horizontal or vertical one could hide on the step line
    cands = [(dx * d, dy * d, ha, va) for d in (11, 30, 55, 85, 120) for dx, dy, ha, va in dirs
             if d == 11 or (dx and dy)]
    px_per_pt = fig.dpi / 72
    for x, y, text, style, required in items:
        best = None
        ox, oy = (float(v) for v in ax.transData.transform((x, y)))
        # the text box's size does not depend on where it goes: measure once, then place arithmetically
        probe = ax.annotate(text, (x, y), xytext=(0, 0), textcoords="offset points", ha="left",
                            va="bottom", **style)
        probe.update_positions(renderer)
        ext = Text.get_window_extent(probe, renderer)
        probe.remove()
        w, h = ext.width, ext.height
        pad = 6.0 * px_per_pt
        for dx, dy, ha, va in cands:
            far = abs(dx) + abs(dy) > 25
            axp, ayp = ox + dx * px_per_pt, oy + dy * px_per_pt
            x0 = axp - {"left": 0.0, "center": w / 2, "right": w}[ha]
            y0 = ayp - {"bottom": 0.0, "center": h / 2, "top": h}[va]
            box = Bbox.from_extents(x0 - pad, y0 - pad, x0 + w + pad, y0 + h + pad)
            inside = (box.x0 >= axbox.x0 + 2 and box.x1 <= axbox.x1 - 2 and box.y0 >= axbox.y0 + 2
                      and box.y1 <= axbox.y1 - 2)
            hits = [a for a in (_overlap_area(box, b) for b in placed) if a > 0]
            leader = None
            crossings = 0
            if far:
                leader = ((ox, oy), (axp, ayp))
                own = 9 * px_per_pt
                for b in placed:  # the leader must not run through labels or other frontier points
                    if not (b.x0 <= ox <= b.x1 and b.y0 <= oy <= b.y1) and _segment_hits_box(leader, b, own):
                        hits.append(1.0)
                hits += [1.0 for seg in leaders if _segments_cross(leader, seg)]
                crossings = sum(1 for seg in lines_px if _segments_cross(leader, seg))
            soft = sum(1 for b in soft_px if _overlap_area(box, b) > 0)
            score = ((0 if inside else 1e12) + len(hits) * 1e6 + sum(hits) + crossings * 2e4 + soft * 100
                     + math.hypot(dx, dy) * 40)
            if best is None or score < best[0]:
                best = (score, (dx, dy, ha, va, far), box, leader)
        if best is None or (best[0] >= 1e6 and not required):
            continue  # no free spot: an optional label is left out rather than overlap
        dx, dy, ha, va, far = best[1]
        ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", ha=ha, va=va, zorder=8,
                    annotation_clip=False,
                    arrowprops={"arrowstyle": "-", "color": "#444444", "lw": 1.0, "shrinkA": 0,
                                "shrinkB": 6} if far else None, **style)
        placed.append(best[2])
        if best[3] is not None:
            leaders.append(best[3])


def _segments_cross(s1, s2) -> bool:
    (ax_, ay), (bx, by) = s1
    (cx, cy), (dx, dy) = s2

    def orient(px, py, qx, qy, rx, ry):
        v = (qx - px) * (ry - py) - (qy - py) * (rx - px)
        return 1 if v > 1e-9 else -1 if v < -1e-9 else 0

    o1, o2 = orient(ax_, ay, bx, by, cx, cy), orient(ax_, ay, bx, by, dx, dy)
    o3, o4 = orient(cx, cy, dx, dy, ax_, ay), orient(cx, cy, dx, dy, bx, by)
    return o1 * o2 < 0 and o3 * o4 < 0


def _segment_hits_box(seg, b, skip_start: float) -> bool:
    """Whether the segment passes through box ``b`` (sampled), ignoring its first ``skip_start`` px."""
    (x0, y0), (x1, y1) = seg
    length = math.hypot(x1 - x0, y1 - y0) or 1.0
    n = max(8, int(length / 3))
    for i in range(n + 1):
        t = i / n
        if t * length < skip_start:
            continue
        x, y = x0 + (x1 - x0) * t, y0 + (y1 - y0) * t
        if b.x0 <= x <= b.x1 and b.y0 <= y <= b.y1:
            return True
    return False


def _overlap_area(a, b) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0


def frontier_figure(plans: Iterable[Any], *, title: str | None = None, subtitle: str | None = None,
                    highlight: Iterable[Any] = (), max_labels: int = 7):
    """The cost-time Figure (see ``plot_frontier``); for tests and embedding."""
    if hasattr(plans, "plans") and not isinstance(plans, Mapping):
        plans = plans.plans  # a PlanSet
    pts = [_point(p) for p in plans]
    hl = {(q.gpu, q.gpus, q.strategy, q.provider, round(q.usd, 6), round(q.hours, 9))
          for q in (_point(p) for p in highlight)}

    fig = _new_figure(13.0, 7.8)
    ax = fig.add_subplot()
    fig.suptitle(title or "cost vs time of the completed job", fontsize=16, fontweight="bold", x=0.01,
                 ha="left")
    if not pts:
        ax.text(0.5, 0.5, "no feasible plan", transform=ax.transAxes, ha="center", va="center",
                fontsize=18, color="#c62828")
        ax.set_xticks([])
        ax.set_yticks([])
        return fig

    front = [q for q in pts if q.pareto] or _pareto_of(pts)
    front = sorted(front, key=lambda q: (q.hours, q.usd))
    if not any(q.cheapest for q in pts):
        c = min(pts, key=lambda q: (q.usd, q.hours))
        pts = [q if q is not c else _Pt(**{**q.__dict__, "cheapest": True}) for q in pts]
    if not any(q.fastest for q in pts):
        f = min(pts, key=lambda q: (q.hours, q.usd))
        pts = [q if q is not f else _Pt(**{**q.__dict__, "fastest": True}) for q in pts]
    cheapest = next(q for q in pts if q.cheapest)
    fastest = next(q for q in pts if q.fastest)

    # GPU types, ordered by their cheapest plan so the strongest colours go to the likely choices
    order: list[str] = []
    for q in sorted(pts, key=lambda q: (q.usd, q.hours)):
        if q.gpu not in order:
            order.append(q.gpu)
    style = {g: (_PALETTE[i % len(_PALETTE)], _MARKERS[i % len(_MARKERS)]) for i, g in enumerate(order)}
    counts = {g: sum(1 for q in pts if q.gpu == g) for g in order}
    for g in order:
        xs = [q.hours for q in pts if q.gpu == g]
        ys = [q.usd for q in pts if q.gpu == g]
        color, marker = style[g]
        ax.scatter(xs, ys, s=46, c=color, marker=marker, alpha=0.6, linewidths=0.4, edgecolors="white",
                   zorder=2, label=f"{g} ({counts[g]})")
    if hl:
        hq = [q for q in pts if (q.gpu, q.gpus, q.strategy, q.provider, round(q.usd, 6), round(q.hours, 9))
              in hl]
        ax.scatter([q.hours for q in hq], [q.usd for q in hq], s=170, facecolors="none",
                   edgecolors="#222222", linewidths=1.4, zorder=3, label="best plan per GPU type")

    # frontier: for any time budget >= a plan's time, its cost is attainable -> steps-post in time order
    fx = [q.hours for q in front]
    fy = [q.usd for q in front]
    xmax = max(q.hours for q in pts)
    ax.plot(fx + [xmax * 1.6], fy + [fy[-1]], drawstyle="steps-post", color="#111111", linewidth=2.2,
            zorder=4, label=f"Pareto frontier ({len(front)} plans)")
    ax.scatter(fx, fy, s=120, c=[style[q.gpu][0] for q in front], marker="o", edgecolors="#111111",
               linewidths=1.8, zorder=5)
    for q in (cheapest, fastest):
        ax.scatter([q.hours], [q.usd], s=340, marker="*", c="#ffd400", edgecolors="#111111", linewidths=1.3,
                   zorder=6)

    xs = [q.hours for q in pts]
    ys = [q.usd for q in pts]
    _axis_ticks(ax, "x", min(xs), max(xs), _hours_tick)
    _axis_ticks(ax, "y", min(ys), max(ys), _money_tick)
    ax.set_xlim(*_padded(min(xs), max(xs), ax.get_xscale() == "log", 0.12, 0.06))
    ax.set_ylim(*_padded(min(ys), max(ys), ax.get_yscale() == "log", 0.22, 0.06))
    ax.set_xlabel("time to finish (hours, including start-up)", fontsize=14)
    ax.set_ylabel("cost of the completed job (USD)", fontsize=14)
    ax.tick_params(labelsize=12.5)
    ax.grid(True, which="major", color="#e0e0e0", zorder=0)
    ax.grid(True, which="minor", color="#f3f3f3", zorder=0)
    for s in ("right", "top"):
        ax.spines[s].set_visible(False)
    if subtitle is None:
        subtitle = (f"{len(pts)} feasible plans on {len(order)} GPU types; "
                    f"lower-left is better; ★ cheapest and fastest")
    ax.set_title(subtitle, fontsize=12.5, loc="left", color="#444444")
    from matplotlib.lines import Line2D

    handles, _labels = ax.get_legend_handles_labels()
    handles.append(Line2D([], [], linestyle="none", marker="*", markersize=16, markerfacecolor="#ffd400",
                          markeredgecolor="#111111", label="cheapest / fastest"))
    leg = ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=11.5, title="GPU type (plans)",
                    title_fontsize=12, frameon=False, markerscale=1.3, borderaxespad=0.0)
    leg.set_zorder(10)

    # annotations: cheapest, fastest, then frontier plans spread along it
    items = []
    picked = _pick_annotated(front, max_labels)
    bold = {"fontsize": 12, "fontweight": "bold", "color": "#111111",
            "bbox": {"boxstyle": "round,pad=0.25", "facecolor": "#fff6bf", "edgecolor": "#b59a00", "lw": 0.8}}
    plain = {"fontsize": 11, "color": "#222222",
             "bbox": {"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "#bbbbbb", "lw": 0.6,
                      "alpha": 0.92}}
    items.append((cheapest.hours, cheapest.usd,
                  f"cheapest: {_money(cheapest.usd)}, {_hours(cheapest.hours)}\n{cheapest.label} "
                  f"({cheapest.provider})", bold, True))
    if fastest is not cheapest:
        items.append((fastest.hours, fastest.usd,
                      f"fastest: {_hours(fastest.hours)}, {_money(fastest.usd)}\n{fastest.label} "
                      f"({fastest.provider})", bold, True))
    for q in picked:
        if q.cheapest or q.fastest or (q.hours, q.usd) in {(cheapest.hours, cheapest.usd),
                                                          (fastest.hours, fastest.usd)}:
            continue
        items.append((q.hours, q.usd, f"{q.label}\n{_money(q.usd)}, {_hours(q.hours)}", plain, False))
    # frontier points, stars and the step line are hard obstacles for labels; other points soft
    # finalise the layout, then freeze it: labels must not move the axes after they are placed
    fig.draw_without_rendering()
    fig.set_layout_engine("none")
    from matplotlib.transforms import Bbox

    def box(x: float, y: float, r_pt: float):
        px, py = ax.transData.transform((x, y))
        r = r_pt * fig.dpi / 72
        return Bbox.from_extents(px - r, py - r, px + r, py + r)

    hard = [box(q.hours, q.usd, 8.0) for q in front + [cheapest, fastest]]
    for (x0, y0), (x1, y1) in zip(zip(fx, fy), zip(fx[1:], fy[1:])):  # the step line, sampled
        for t in (0.2, 0.4, 0.6, 0.8):
            hard.append(box(_interp(x0, x1, t, ax.get_xscale() == "log"), y0, 2.0))
            hard.append(box(x1, _interp(y0, y1, t, ax.get_yscale() == "log"), 2.0))
    for t in (0.1, 0.25, 0.4, 0.55, 0.7, 0.85, 1.0):  # and its tail to the right of the cheapest
        hard.append(box(_interp(fx[-1], xmax * 1.6, t, ax.get_xscale() == "log"), fy[-1], 2.0))
    soft = [box(q.hours, q.usd, 3.5) for q in pts]
    step = [tuple(float(v) for v in ax.transData.transform(xy))
            for xy in zip(*_steps(fx + [xmax * 1.6], fy + [fy[-1]]))]
    lines = list(zip(step, step[1:]))
    _place_labels(fig, ax, items, hard, soft, lines)
    return fig


def _steps(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    """Vertices of a steps-post line through (xs, ys)."""
    ox, oy = [xs[0]], [ys[0]]
    for i in range(1, len(xs)):
        ox += [xs[i], xs[i]]
        oy += [ys[i - 1], ys[i]]
    return ox, oy


def _interp(a: float, b: float, t: float, log: bool) -> float:
    if log and a > 0 and b > 0:
        return math.exp(math.log(a) + (math.log(b) - math.log(a)) * t)
    return a + (b - a) * t


def _padded(lo: float, hi: float, log: bool, pad_lo: float, pad_hi: float) -> tuple[float, float]:
    if log:
        a, b = math.log10(lo), math.log10(hi)
        w = max(b - a, 0.3)
        return 10 ** (a - w * pad_lo), 10 ** (b + w * pad_hi)
    w = (hi - lo) or max(abs(hi), 1.0) * 0.5
    return max(0.0, lo - w * pad_lo), hi + w * pad_hi


def plot_frontier(plans: Iterable[Any], path: str | os.PathLike[str], *, title: str | None = None,
                  subtitle: str | None = None, highlight: Iterable[Any] = (), max_labels: int = 7) -> str:
    """Write the cost-vs-time chart of ``plans`` to ``path`` (.png or .svg).

    ``plans``: a PlanSet, Plans, or plan documents (``ftplan.recommend/1`` plan objects). Every
    plan is a point coloured by GPU type; the Pareto frontier (plans flagged ``pareto``, or
    computed when none is) is a step line with its plans ringed and up to ``max_labels`` of them
    annotated; the cheapest and fastest are starred and labelled. ``highlight``: plans to ring
    (``compare`` rings the best plan of each GPU type). Returns the path written."""
    check_plot_path(path)
    return _save(frontier_figure(plans, title=title, subtitle=subtitle, highlight=highlight,
                                 max_labels=max_labels), path)


def search_title(model: Any, job: Any, ps: Any) -> str:
    """'llama-3.1-70b · lora · 100M tokens · seq 2048' for a search's chart."""
    toks = (job.dataset_tokens or 0) * job.epochs
    tok = f"{toks / 1e9:,.3g}B" if toks >= 1e9 else f"{toks / 1e6:,.3g}M"
    bits = [model.name, job.method, f"{tok} tokens" + (f" ({job.epochs:g} epochs)" if job.epochs != 1 else ""),
            f"seq {job.seq_len}"]
    return " · ".join(bits) + " — cost vs time of the completed job"


def plot_search(path: str | os.PathLike[str], model: Any, job: Any, ps: Any, *, command: str = "recommend") -> str:
    """The frontier chart of a ``recommend`` / ``compare`` search (``compare`` rings the best plan
    of each GPU type). Returns the path written."""
    highlight: Sequence[Any] = ps.best_per_gpu() if command == "compare" else ()
    n_types = len({p.gpu.name for p in ps.plans})
    sub = (f"{len(ps.plans)} feasible plans on {n_types} GPU types from {ps.stats.offers} offers; "
           f"lower-left is better" if ps.plans else None)
    return plot_frontier(ps.plans, path, title=search_title(model, job, ps), subtitle=sub, highlight=highlight)
