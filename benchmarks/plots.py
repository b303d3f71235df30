"""The benchmark's plots (matplotlib, Agg backend: no display needed), from benchmark.py's results.

make_plots(results, out_dir) writes
  benchmark_heatmap.png           median speed-up over gamma x max_gen (one panel per temperature),
  benchmark_speedup_vs_gamma.png  measured speed-up (median, IQR bars) per max_gen, and the
                                  speed-up Leviathan's formula predicts from the measured alpha, c
                                  and verification cost; gamma policies (auto, heuristic) as
                                  horizontal lines,
  benchmark_acceptance.png        acceptance by draft position, beside alpha^i: under the theory's
                                  assumption (each token accepted independently with chance alpha)
                                  position i is reached and accepted with chance alpha^i.
"""

import functools
import itertools
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import TwoSlopeNorm  # noqa: E402

from .common import gamma_order  # noqa: E402

DPI = 100


def make_plots(results: dict, out_dir) -> list[Path]:
    """One panel per temperature (columns) and drafter (rows, when benchmark.py ran several)."""
    out_dir = Path(out_dir)
    cells = results["cells"]
    temperatures = sorted({c["temperature"] for c in cells})
    drafters = list(dict.fromkeys(c.get("drafter", "model") for c in cells))
    title = pair_title(results["environment"])
    paths = [out_dir / "benchmark_heatmap.png", out_dir / "benchmark_speedup_vs_gamma.png",
             out_dir / "benchmark_acceptance.png"]
    speedup_plot = functools.partial(speedup_vs_gamma, repeats=results["environment"].get("repeats"))
    for path, draw in zip(paths, (heatmap, speedup_plot, acceptance_by_position)):
        fig, axes = plt.subplots(len(drafters), len(temperatures), squeeze=False,
                                 figsize=(max(6.8, 5.2 * len(temperatures) + 0.6), 4.8 * len(drafters)))
        for (i, drafter), (j, t) in itertools.product(enumerate(drafters), enumerate(temperatures)):
            ax = axes[i][j]
            draw(ax, [c for c in cells if c["temperature"] == t and c.get("drafter", "model") == drafter], t)
            if len(drafters) > 1:
                ax.set_title(f"drafter {drafter}: " + ax.get_title(), fontsize=10)
        fig.suptitle(title, fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=DPI)
        plt.close(fig)
    return paths


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


def heatmap(ax, cells, t):
    gammas = sorted({c["gamma"] for c in cells}, key=gamma_order)
    max_gens = sorted({c["max_gen"] for c in cells})
    grid = np.full((len(gammas), len(max_gens)), np.nan)
    for c in cells:
        grid[gammas.index(c["gamma"]), max_gens.index(c["max_gen"])] = c["speedup_median"]
    # The ends on the colour bar's 0.01 grid, outside the data: its ticks are rounded to 0.01, and
    # a tick past an end breaks the bar's layout (a singular transform)
    lo, hi = np.floor(np.nanmin(grid) * 100) / 100, np.ceil(np.nanmax(grid) * 100) / 100
    norm = TwoSlopeNorm(vcenter=1.0, vmin=min(lo, 0.99), vmax=max(hi, 1.01))  # white = no gain
    image = ax.imshow(grid, cmap="RdYlGn", norm=norm, aspect="auto", origin="lower")
    for i in range(len(gammas)):
        for j in range(len(max_gens)):
            ax.text(j, i, f"{grid[i, j]:.2f}x", ha="center", va="center", fontsize=9)
    ax.set_xticks(range(len(max_gens)), [str(m) for m in max_gens])
    ax.set_yticks(range(len(gammas)), [str(g) for g in gammas])
    ax.set_xlabel("max_gen (new tokens)")
    ax.set_ylabel("gamma (draft tokens per round)")
    ax.set_title(f"Median speed-up, {temperature_label(t)}", fontsize=10)
    bar = ax.figure.colorbar(image, ax=ax, label="speed-up over the target alone")
    # TwoSlopeNorm gives the part below 1.0 its own ticks only if asked: label both sides.
    bar.set_ticks(sorted(set(np.round(np.r_[np.linspace(norm.vmin, 1.0, 3), np.linspace(1.0, norm.vmax, 4)], 2))))


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
    for m in sorted({c["max_gen"] for c in cells}):
        row = sorted((c for c in cells if c["max_gen"] == m), key=lambda c: c["gamma"])
        median = np.array([c["speedup_median"] for c in row])
        spread = [median - [c["speedup_q1"] for c in row], [c["speedup_q3"] for c in row] - median]
        ax.errorbar([c["gamma"] for c in row], median, yerr=spread, marker="o", capsize=3,
                    label=f"measured median, max_gen {m}")
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
        line, = ax.plot(positions, rate, marker="o", label=f"gamma {g}")
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
