"""The benchmark's plots (matplotlib, Agg backend: no display needed), from benchmark.py's results.

make_plots(results, out_dir) writes
  benchmark_heatmap.png           median speed-up over gamma x max_gen (one panel per temperature,
                                  one colour scale for all; bars per gamma when there is one max_gen),
  benchmark_speedup_vs_gamma.png  measured speed-up (median, IQR bars) per max_gen, and the
                                  speed-up Leviathan's formula predicts from the measured alpha, c
                                  and verification cost; gamma policies (auto, heuristic) as
                                  horizontal lines,
  benchmark_acceptance.png        acceptance by draft position, beside alpha^i: under the theory's
                                  assumption (each token accepted independently with chance alpha)
                                  position i is reached and accepted with chance alpha^i.
A cell some of whose runs looped (spec_decoding/presentation/loops.py: the text is mostly one repeated n-gram,
which both models predict, so its acceptance and speed-up are inflated) is marked in each of them.
"""

import functools
import itertools
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import TwoSlopeNorm  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from spec_decoding.presentation.loops import LOOP_MARK  # noqa: E402

from .common import gamma_order  # noqa: E402

DPI = 100
PLOT_FILES = ("benchmark_heatmap.png", "benchmark_speedup_vs_gamma.png", "benchmark_acceptance.png")
LOOP_COLOUR = "tab:red"


def make_plots(results: dict, out_dir) -> list[Path]:
    """Write the three plots (draw_figures) as PNGs into out_dir; returns their paths."""
    paths = []
    for name, fig in draw_figures(results).items():
        paths.append(Path(out_dir) / name)
        fig.savefig(paths[-1], dpi=DPI)
        plt.close(fig)
    return paths


def draw_figures(results: dict) -> dict:
    """file name -> figure, one panel per temperature (columns) and drafter (rows, when benchmark.py
    ran several). The heatmap's panels share one colour scale (shared_norm), so a colour means the
    same speed-up in every panel; a grid of one max_gen draws bars instead (one column of colour
    says less than bar heights). A cell some of whose runs looped (spec_decoding/presentation/loops.py) is marked
    in every plot."""
    cells = results["cells"]
    temperatures = sorted({c["temperature"] for c in cells})
    drafters = list(dict.fromkeys(c.get("drafter", "model") for c in cells))
    title = pair_title(results["environment"])
    one_column = len({c["max_gen"] for c in cells}) == 1
    first = functools.partial(speedup_bars if one_column else heatmap, norm=shared_norm(cells))
    speedup_plot = functools.partial(speedup_vs_gamma, repeats=results["environment"].get("repeats"))
    figures = {}
    for name, draw in zip(PLOT_FILES, (first, speedup_plot, acceptance_by_position)):
        fig, axes = plt.subplots(len(drafters), len(temperatures), squeeze=False,
                                 figsize=(max(6.8, 5.2 * len(temperatures) + 0.6), 4.8 * len(drafters)))
        for (i, drafter), (j, t) in itertools.product(enumerate(drafters), enumerate(temperatures)):
            ax = axes[i][j]
            draw(ax, [c for c in cells if c["temperature"] == t and c.get("drafter", "model") == drafter], t)
            if len(drafters) > 1:
                ax.set_title(f"drafter {drafter}: " + ax.get_title(), fontsize=10)
        if any(c.get("looped_runs") for c in cells):
            fig.text(0.01, 0.005, f"looped (hatched, ringed, or named) = {LOOP_MARK}: most of a run's text repeats one n-gram, "
                     f"which both models predict (spec_decoding/presentation/loops.py)", fontsize=8, color=LOOP_COLOUR,
                     va="bottom")
        fig.suptitle(title, fontsize=9)
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        figures[name] = fig
    return figures


def pair_title(env: dict) -> str:
    drafters = env.get("drafters", ["model"])
    if drafters == ["model"]:
        names = f"draft {short_name(env['draft'])} -> target {short_name(env['target'])}"
    else:
        names = f"target {short_name(env['target'])}, drafters {', '.join(drafters)}"
        if "model" in drafters:
            names += f" (model = {short_name(env['draft'])})"
    threads = f"{env['threads']} thread" + ("s" if env["threads"] != 1 else "")
    lines = [f"Speculative decoding, {names}", f"{env['device']} {env['dtype']}, {threads}"]
    if env.get("standins"):
        lines.insert(1, "random-weight stand-ins of the real shapes: real speed, not real text")
    return "\n".join(lines)


def short_name(name_or_path: str) -> str:
    """'gpt2' stays; a folder /a/b/pair/target becomes pair/target."""
    parts = Path(name_or_path).parts
    return "/".join(parts[-2:]) if len(parts) > 1 else name_or_path


def temperature_label(t: float) -> str:
    return "temperature 0 (greedy)" if t == 0 else f"temperature {t:g} (sampling)"


def looped(cell: dict) -> bool:
    return bool(cell.get("looped_runs"))


def shared_norm(cells) -> TwoSlopeNorm:
    """One colour scale for all the heatmap's panels: white at 1.0 (no gain), red below, green
    above, ends on the colour bar's 0.01 grid outside the data (its ticks are rounded to 0.01, and a
    tick past an end breaks the bar's layout: a singular transform)."""
    speedups = np.array([c["speedup_median"] for c in cells], dtype=float)
    lo, hi = np.floor(np.nanmin(speedups) * 100) / 100, np.ceil(np.nanmax(speedups) * 100) / 100
    return TwoSlopeNorm(vcenter=1.0, vmin=min(lo, 0.99), vmax=max(hi, 1.01))


def heatmap(ax, cells, t, norm=None):
    """Median speed-up over gamma (rows) x max_gen (columns); norm: the colour scale (shared_norm of
    these cells if None). A looped cell says so under its number."""
    gammas = sorted({c["gamma"] for c in cells}, key=gamma_order)
    max_gens = sorted({c["max_gen"] for c in cells})
    grid = np.full((len(gammas), len(max_gens)), np.nan)
    loops = np.zeros(grid.shape, dtype=bool)
    for c in cells:
        grid[gammas.index(c["gamma"]), max_gens.index(c["max_gen"])] = c["speedup_median"]
        loops[gammas.index(c["gamma"]), max_gens.index(c["max_gen"])] = looped(c)
    norm = norm or shared_norm(cells)
    image = ax.imshow(grid, cmap="RdYlGn", norm=norm, aspect="auto", origin="lower")
    for i in range(len(gammas)):
        for j in range(len(max_gens)):
            ax.text(j, i, f"{grid[i, j]:.2f}x" + ("\nlooped" if loops[i, j] else ""), ha="center",
                    va="center", fontsize=9, fontweight="bold" if loops[i, j] else "normal",
                    bbox=dict(facecolor="white", alpha=0.8, linewidth=0) if loops[i, j] else None)
            if loops[i, j]:  # hatched in black: visible on every colour of the scale but the darkest
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//", edgecolor="black",
                                       linewidth=1))
    ax.set_xticks(range(len(max_gens)), [str(m) for m in max_gens])
    ax.set_yticks(range(len(gammas)), [str(g) for g in gammas])
    ax.set_xlabel("max_gen (new tokens)")
    ax.set_ylabel("gamma (draft tokens per round)")
    ax.set_title(f"Median speed-up, {temperature_label(t)}", fontsize=10)
    bar = ax.figure.colorbar(image, ax=ax, label="speed-up over the target alone")
    # TwoSlopeNorm gives the part below 1.0 its own ticks only if asked: label both sides.
    bar.set_ticks(sorted(set(np.round(np.r_[np.linspace(norm.vmin, 1.0, 3), np.linspace(1.0, norm.vmax, 4)], 2))))


def speedup_bars(ax, cells, t, norm=None):
    """One max_gen: the median speed-up per gamma as bars (quartiles as error bars), coloured on the
    shared scale; a looped cell's bar is hatched and labelled."""
    cells = sorted(cells, key=lambda c: gamma_order(c["gamma"]))
    norm = norm or shared_norm(cells)
    x = np.arange(len(cells))
    median = np.array([c["speedup_median"] for c in cells])
    spread = [median - [c.get("speedup_q1", m) for c, m in zip(cells, median)],
              [c.get("speedup_q3", m) for c, m in zip(cells, median)] - median]
    bars = ax.bar(x, median, color=plt.get_cmap("RdYlGn")(norm(median)), edgecolor="black",
                  yerr=spread, capsize=3)
    for bar, c, m in zip(bars, cells, median):
        if looped(c):
            bar.set_hatch("//")
        ax.text(bar.get_x() + bar.get_width() / 2, c.get("speedup_q3", m), f"{m:.2f}x" + ("\nlooped" if looped(c) else ""),
                ha="center", va="bottom", fontsize=9, fontweight="bold" if looped(c) else "normal")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylim(0, max(1.1, float(np.max(median)) * 1.25))
    ax.set_xticks(x, [str(c["gamma"]) for c in cells])
    ax.set_xlabel("gamma (draft tokens per round)")
    ax.set_ylabel("speed-up over the target alone")
    ax.set_title(f"Median speed-up, max_gen {cells[0]['max_gen']}, {temperature_label(t)}", fontsize=10)


def error_bars_note(cells, repeats: int | None) -> str:
    """What the error bars of these cells span: the runs of a cell are its prompts x repeats."""
    runs = max((c["runs"] for c in cells), default=0)
    if not repeats or runs % repeats:
        return f"error bars: quartiles over each cell's {runs} runs"
    prompts = runs // repeats
    if repeats == 1:
        return f"error bars: quartiles over the {prompts} prompts (1 run each)"
    if prompts == 1:
        return f"error bars: quartiles over the {repeats} repeats of 1 prompt"
    return f"error bars: quartiles over {runs} runs ({prompts} prompts x {repeats} repeats)"


def speedup_vs_gamma(ax, cells, t, repeats: int | None = None):
    policies = sorted({c["gamma"] for c in cells if not isinstance(c["gamma"], int)})
    for style, policy in zip(("-.", ":", "--"), policies):
        ax.axhline(np.mean([c["speedup_median"] for c in cells if c["gamma"] == policy]), ls=style,
                   color="tab:purple", label=f"gamma={policy} (mean over max_gen)")
    cells = [c for c in cells if isinstance(c["gamma"], int)]
    gammas = sorted({c["gamma"] for c in cells})
    ringed = False  # the legend names the ring once
    for m in sorted({c["max_gen"] for c in cells}):
        row = sorted((c for c in cells if c["max_gen"] == m), key=lambda c: c["gamma"])
        median = np.array([c["speedup_median"] for c in row])
        spread = [median - [c["speedup_q1"] for c in row], [c["speedup_q3"] for c in row] - median]
        ax.errorbar([c["gamma"] for c in row], median, yerr=spread, marker="o", capsize=3,
                    label=f"measured median, max_gen {m}")
        loops = [(c["gamma"], c["speedup_median"]) for c in row if looped(c)]
        if loops:  # ringed: these speed-ups measure a loop, not the drafter
            ax.scatter(*zip(*loops), s=160, facecolors="none", edgecolors=LOOP_COLOUR, linewidths=1.5,
                       zorder=4, label=None if ringed else f"ringed: {LOOP_MARK}")
            ringed = True
    predicted = [np.mean([c["predicted_speedup"] for c in cells
                          if c["gamma"] == g and c["predicted_speedup"] is not None] or [np.nan])
                 for g in gammas]
    ax.plot(gammas, predicted, "k--", marker="s", label="predicted (Leviathan, measured alpha, c, verify cost)")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(gammas, [str(g) for g in gammas])
    ax.set_xlabel("gamma (draft tokens per round)")
    ax.set_ylabel("speed-up over the target alone")
    ax.set_title(f"Speed-up vs gamma, {temperature_label(t)}", fontsize=10)
    ax.legend(fontsize=7, title=error_bars_note(cells, repeats), title_fontsize=7)


def acceptance_by_position(ax, cells, t):
    for i, g in enumerate(sorted({c["gamma"] for c in cells}, key=gamma_order)):
        row = [c for c in cells if c["gamma"] == g]
        n = len(row[0]["run_records"][0]["drafted_by_position"])  # gamma, or gamma_max for a policy
        drafted = [sum(r["drafted_by_position"][k] for c in row for r in c["run_records"]) for k in range(n)]
        accepted = [sum(r["accepted_by_position"][k] for c in row for r in c["run_records"]) for k in range(n)]
        rate = [a / d if d else np.nan for a, d in zip(accepted, drafted)]
        positions = np.arange(1, n + 1)
        line, = ax.plot(positions, rate, marker="o", label=f"gamma {g}"
                        + (f" ({LOOP_MARK})" if any(looped(c) for c in row) else ""))
        alphas = [c["alpha"] for c in row if c["alpha"] is not None]
        if alphas:
            # Drawn on top, dashed with crosses: with alpha near 1 it lies on the measured line.
            ax.plot(positions, np.mean(alphas) ** positions, ls="--", marker="x", ms=7,
                    color=line.get_color(), zorder=3)
    ax.plot([], [], "k--", marker="x", label="alpha^i (i.i.d. theory, same colour)")
    ax.set_ylim(0, 1.05)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("draft position i")
    ax.set_ylabel("share of rounds accepting position i")
    ax.set_title(f"Acceptance by draft position, {temperature_label(t)}", fontsize=10)
    ax.legend(fontsize=7)
