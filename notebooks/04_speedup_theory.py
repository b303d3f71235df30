# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 4. How much faster? Theory and measurement
#
# Leviathan et al. (2023), section 3, with
#
# * **alpha**: the probability that the target accepts a draft token it judges (`stats.alpha`),
# * **gamma**: draft tokens per round,
# * **c**: the cost of one draft forward relative to one target forward.
#
# A round accepts a run of draft tokens, then adds one token of the target's, so it yields on
# average `(1 - alpha^(gamma+1)) / (1 - alpha)` tokens. It costs gamma draft forwards and one target
# forward, `gamma c + 1` target-forward units. The speed-up over the target alone is their ratio
# (`spec_decoding.policies.theory`).

# %% [markdown]
# ## Which models? One switch
#
# The first code cell reads a few environment variables. Set them before starting Jupyter, e.g.
# `GPT2_TARGET=gpt2-xl GPT2_DRAFT=gpt2 jupyter lab`:
#
# | variable | default | meaning |
# |---|---|---|
# | `GPT2_TARGET` | `gpt2-large` (offline: the trained pair's `target`) | the **target**: the big model whose output we want |
# | `GPT2_DRAFT` | `gpt2` (offline: the trained pair's `draft`) | the **draft**: the small model that proposes tokens |
# | `DEVICE` | `cuda` if available, else `cpu` | where the models run |
#
# Each model can be an official name (`gpt2`, `gpt2-medium`, `gpt2-large`, `gpt2-xl`), a Hugging Face
# hub id `owner/name`, a local folder holding `config.json` + `model.safetensors`, or a single
# `.safetensors` file. The hub downloads go to the Hugging Face cache (gpt2-large is about 3 GB).
#
# **Offline** (no hub), the default is a small pair of real language models trained on this
# machine from the Python standard library's sources: make it once with
# `python -m offline.train_pair --out runs/trained_pair` (about 10 minutes on 2 CPU cores). They write
# Python-like code, and their draft and target really disagree: you will see rejections and real
# residual distributions. (Random-weight stand-ins would agree almost always and teach nothing about
# rejection.) The project's tests run these notebooks on such a pair trained for only seconds.
#
# Notation, used throughout: **p is the target's next-token distribution, q is the draft's.**
#
# This notebook also reads `BENCHMARK_RESULTS`: the `results.json` written by the project's
# benchmark (default `../runs/benchmark/results.json`). If there is none, it measures a small
# result itself on the pair above.

# %%
# Finds the project, reads the switch (GPT2_TARGET, GPT2_DRAFT, DEVICE): see notebook_setup.py.
from notebook_setup import DEVICE, DRAFT, PROMPT, ROOT, TARGET

import torch
import matplotlib.pyplot as plt
# %matplotlib inline

torch.manual_seed(0)
print(f"target: {TARGET}\ndraft:  {DRAFT}\ndevice: {DEVICE}")

import os
from pathlib import Path

BENCHMARK_RESULTS = Path(os.environ.get("BENCHMARK_RESULTS", ROOT / "runs" / "benchmark" / "results.json"))
print("benchmark results:", BENCHMARK_RESULTS)

# %%
from spec_decoding.policies.theory import best_gamma, expected_tokens_per_round, predicted_speedup

C_EXAMPLE = 0.15  # about gpt2 (124M) vs gpt2-large (774M) by parameter count
alphas = [i / 100 for i in range(0, 100)]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
for g in (1, 2, 4, 8):
    ax1.plot(alphas, [expected_tokens_per_round(a, g) for a in alphas], label=f"gamma = {g}")
ax1.set_xlabel("alpha (acceptance rate)")
ax1.set_ylabel("expected tokens per round")
ax1.legend()
gammas = range(1, 13)
for a in (0.5, 0.7, 0.8, 0.9):
    ax2.plot(gammas, [predicted_speedup(a, g, C_EXAMPLE) for g in gammas], marker=".", label=f"alpha = {a}")
ax2.axhline(1, color="grey", lw=0.8)
ax2.set_xlabel("gamma")
ax2.set_ylabel("predicted speed-up")
ax2.set_title(f"c = {C_EXAMPLE}")
ax2.legend()
plt.tight_layout()
plt.show()
for a in (0.5, 0.7, 0.8, 0.9):
    g = best_gamma(a, C_EXAMPLE)
    print(f"alpha = {a}: best gamma = {g}, predicted speed-up {predicted_speedup(a, g, C_EXAMPLE):.2f}x")

# %% [markdown]
# ## Measured results
#
# The benchmark's `results.json` holds a list of `cells` (one per gamma, max_gen and temperature:
# the median measured speed-up, the acceptance rate, and the speed-up the theory predicts from them)
# and the measured cost ratio `costs.c`. Without that file, the cell below measures a few points
# itself: greedy speculative decoding at gamma = 1, 2, 4 against the target alone, on a short
# generation (noisy, but honest; with the real gpt2-large on a CPU it takes a minute or two).

# %%
import json
import statistics
from dataclasses import asdict

from spec_decoding import CostModel, Observers, SamplingParams
from spec_decoding.calibration import calibrate_costs


def measure_inline(max_gen=32, repeats=3):
    # A small benchmark on the loaded pair: greedy, gamma in (1, 2, 4). It times the models as the
    # scripts run them, with gpt2.speed's step taken (the weight format and kernels measured fastest
    # on this machine): speed-ups are about the fastest decoding each side can do here, so both the
    # target alone and speculative decoding run on the same accelerated models.
    from gpt2 import encode
    from gpt2.speed import load_accelerated
    from spec_decoding import autoregressive_generate, speculative_sampling_greedy

    target = load_accelerated(TARGET, device=DEVICE)
    draft = load_accelerated(DRAFT, device=DEVICE)
    if target.config.vocab_size == 50257:
        prompt_ids = encode(PROMPT)
    else:
        prompt_ids = list(range(1, 12))
    max_gen = min(max_gen, target.config.n_positions - len(prompt_ids), draft.config.n_positions - len(prompt_ids))

    # The per-call costs, timed on warm KV caches (spec_decoding/policies/costs.py): a draft step and
    # the target scoring k = 1 .. 5 tokens in one forward.
    cost_model = calibrate_costs(target, draft, gamma_max=4, context_len=len(prompt_ids), budget_s=2.0)
    c = cost_model.c
    autoregressive_generate(target, prompt_ids, 4)  # warm-ups
    speculative_sampling_greedy(target, draft, prompt_ids, 4, 2)
    # Timed in turns (the target alone, then each gamma, repeat), on one thread: a busy spell of
    # the machine then slows both sides of a ratio alike, and two threads cannot wait on each
    # other for a core another program holds. Each gamma's speed-up is the median of its ratios.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ratios, runs = {g: [] for g in (1, 2, 4)}, {}
    for _ in range(repeats):
        base = autoregressive_generate(target, prompt_ids, max_gen)
        for gamma in ratios:
            runs[gamma] = speculative_sampling_greedy(target, draft, prompt_ids, max_gen, gamma)
            ratios[gamma].append(base.stats.seconds / runs[gamma].stats.seconds)
    torch.set_num_threads(threads)
    cells = []
    for gamma in ratios:
        alpha = runs[gamma].stats.alpha  # accepted / judged draft tokens: the theory's alpha
        print(f"gamma {gamma}: same tokens as the target alone: {runs[gamma].tokens == base.tokens}; "
              f"speed-ups of the {repeats} pairs: {', '.join(f'{r:.2f}x' for r in ratios[gamma])}")
        cells.append(dict(gamma=gamma, max_gen=max_gen, temperature=0.0,
                          speedup_median=statistics.median(ratios[gamma]),
                          alpha=alpha, predicted_speedup=predicted_speedup(
                              alpha, gamma, c, cost_model.verify_cost(gamma))))
    return {"cells": cells, "source": "measured inline",
            "costs": {"c": c, "verify_cost_by_gamma": {g: cost_model.verify_cost(g) for g in (1, 2, 4)},
                      "cost_model": asdict(cost_model)}}


def usable_cells(results):
    # Cells of a fixed gamma with a measured speed-up and alpha (a cell without drafting has none;
    # cells of a gamma policy, "auto" or "heuristic", have no single gamma to plot). alpha is
    # accepted / judged draft tokens; older results only had the acceptance rate (accepted /
    # drafted), which is lower for gamma > 1 because tokens after a rejection are never judged.
    cells = [cell for cell in results.get("cells", []) if isinstance(cell.get("gamma"), int)]
    for cell in cells:
        cell.setdefault("alpha", cell.get("acceptance_rate"))
    return [cell for cell in cells if cell.get("speedup_median") is not None and cell["alpha"] is not None]


results = None
if BENCHMARK_RESULTS.is_file():
    results = json.loads(BENCHMARK_RESULTS.read_text())
    results["source"] = str(BENCHMARK_RESULTS)
    print(f"Read {len(usable_cells(results))} cells from {BENCHMARK_RESULTS}")
    if not usable_cells(results):
        results = None
else:
    print(f"No benchmark results at {BENCHMARK_RESULTS} (run the benchmark, or set BENCHMARK_RESULTS).")
if results is None:
    print("Measuring a small result inline instead (greedy, gamma = 1, 2, 4)...")
    results = measure_inline()

costs = results.get("costs") or {}
c = costs.get("c")
# The benchmark also measures what verifying gamma + 1 tokens costs relative to one target step
# (JSON keys are strings); the idealised theory takes 1.
verify_costs = {int(g): v for g, v in (costs.get("verify_cost_by_gamma") or {}).items()}
cells = usable_cells(results)
for cell in cells:
    if cell.get("predicted_speedup") is None and c is not None:
        cell["predicted_speedup"] = predicted_speedup(cell["alpha"], cell["gamma"], c,
                                                      verify_costs.get(cell["gamma"], 1.0))
print(f"\ncost ratio c = {c if c is None else round(c, 3)}")
print(f"{'gamma':>5} {'max_gen':>7} {'temp':>5} {'alpha':>6} {'measured':>9} {'predicted':>9}")
for cell in sorted(cells, key=lambda d: (d.get("temperature", 0), d.get("max_gen", 0), d["gamma"])):
    pred = cell.get("predicted_speedup")
    print(f"{cell['gamma']:>5} {cell.get('max_gen', '-'):>7} {cell.get('temperature', '-'):>5} "
          f"{cell['alpha']:>6.3f} {cell['speedup_median']:>8.2f}x "
          f"{'-' if pred is None else f'{pred:.2f}x':>9}")

# %% [markdown]
# ## Measured beside predicted
#
# Left: speed-up per gamma, measured (solid) and predicted from the measured alpha and c (dashed),
# one line per (temperature, max_gen); the benchmark's prediction also counts its measured cost of
# verifying gamma + 1 tokens. Right: the measured points on the theory curves over alpha.
# Measurements usually fall below the prediction: verifying gamma + 1 tokens costs a bit more than
# one token, and each round has Python overhead the theory ignores. With tiny random test checkpoints
# c is close to 1 (both models are mostly overhead), so expect no speed-up there.

# %%
from collections import defaultdict

groups = defaultdict(list)
for cell in cells:
    groups[(cell.get("temperature"), cell.get("max_gen"))].append(cell)

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
for (temp, max_gen), group in sorted(groups.items(), key=lambda kv: str(kv[0])):
    group = sorted(group, key=lambda d: d["gamma"])
    g_values = [d["gamma"] for d in group]
    line, = ax1.plot(g_values, [d["speedup_median"] for d in group], marker="o",
                     label=f"measured, T={temp}, max_gen={max_gen}")
    if all(d.get("predicted_speedup") is not None for d in group):
        ax1.plot(g_values, [d["predicted_speedup"] for d in group], ls="--", color=line.get_color())
ax1.plot([], [], "k--", label="predicted (dashed, same colour)")  # one legend entry for all
ax1.axhline(1, color="grey", lw=0.8)
ax1.set_xlabel("gamma")
ax1.set_xticks(sorted({d["gamma"] for d in cells}))
ax1.set_ylabel("speed-up over the target alone")
ax1.legend(fontsize=8)

c_plot = c if c is not None else C_EXAMPLE
all_gammas = sorted({d["gamma"] for d in cells})
colors = {g: f"C{i}" for i, g in enumerate(all_gammas)}
for g in all_gammas:
    v = verify_costs.get(g, 1.0)
    ax2.plot(alphas, [predicted_speedup(a, g, c_plot, v) for a in alphas], color=colors[g], lw=1,
             label=f"theory, gamma = {g}" + (f", verify cost {v:.2f}" if g in verify_costs else ""))
    pts = [d for d in cells if d["gamma"] == g]
    ax2.scatter([d["alpha"] for d in pts], [d["speedup_median"] for d in pts],
                color=colors[g], edgecolor="k", zorder=3)
ax2.axhline(1, color="grey", lw=0.8)
ax2.set_xlabel("alpha (acceptance rate)")
ax2.set_ylabel("speed-up")
ax2.set_title(f"c = {c_plot:.3f}; dots: measured ({results['source']})", fontsize=8)
ax2.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Choosing gamma while generating: `gamma="auto"`
#
# Everything the formula needs can be measured while generating: the costs once, before the run
# (a `CostModel`: seconds of a draft step, t_draft, and of the target scoring k tokens in one
# forward, t_target(k)), and the acceptance as the rounds go by. `spec_decoding/policies/gamma.py` does
# exactly that. Before each round, with a_i its current estimate of the chance that draft token i
# is accepted when those before it were, it drafts
#
# $$g^* = \arg\max_{0 \le g \le \gamma_{max}} \frac{1 + a_1 + a_1 a_2 + \dots + a_1 \cdots a_g}{g\, t_{draft} + t_{target}(g + 1)}$$
#
# tokens: expected tokens per round over the round's seconds. Divided by one target step this is
# the speed-up formula above, with a_i in place of one alpha and the measured verification cost
# in place of 1. **g = 0 is a plain target step**: where speculation does not pay, it is switched
# off (with a one-token probe now and then, so that it can switch back on). The estimates come
# from earlier rounds only, so sampling stays exactly lossless.
#
# Below, with the measured costs (or an example when there are none): the expected speed-up of
# each g over alpha, and the g the policy picks. Left of the break-even alpha no g beats the
# target alone.

# %%
from spec_decoding import AutoGamma, HeuristicGamma
from spec_decoding.policies.theory import expected_tokens_by_position

if costs.get("cost_model") or costs.get("cost_models"):  # measured inline, or by benchmark.py (per drafter)
    cost_model = CostModel(**(costs.get("cost_model") or next(iter(costs["cost_models"].values()))))
else:  # an example: c = 0.15, verifying k tokens costs 1 + 0.1 (k - 1) target steps
    cost_model = CostModel("example target", "example draft", draft_step_s=0.15,
                           target_score_s=[1 + 0.1 * k for k in range(9)])
print(cost_model)


def speedup_of(g, alpha):
    return expected_tokens_by_position([alpha] * g) / cost_model.round_seconds(g) * cost_model.target_step_s


fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
for g in range(0, cost_model.gamma_max + 1, 2):
    ax1.plot(alphas, [speedup_of(g, a) for a in alphas], label=f"g = {g}" + (" (target alone)" if g == 0 else ""))
ax1.set_xlabel("alpha")
ax1.set_ylabel("predicted speed-up")
ax1.legend(fontsize=8)
best = [max(range(cost_model.gamma_max + 1), key=lambda g: speedup_of(g, a)) for a in alphas]
ax2.step(alphas, best, where="post")
if (alpha0 := cost_model.break_even_alpha()) is not None:
    ax2.axvline(alpha0, color="grey", ls=":", label=f"speculation pays from alpha = {alpha0:.2f}")
    ax2.legend(fontsize=8)
ax2.set_xlabel("alpha")
ax2.set_ylabel("g*: draft tokens per round")
plt.tight_layout()
plt.show()

# %% [markdown]
# The policy does not know alpha: it learns it round by round. Here it is fed simulated rounds in
# which the acceptance changes halfway and back (each token accepted with chance 0.9, then 0.1,
# then 0.8), beside transformers' "heuristic" schedule (+2 after a fully accepted round, -1
# otherwise, never below 1, blind to the costs).

# %%
import random

rng = random.Random(0)
phases = [0.9] * 60 + [0.1] * 60 + [0.8] * 60
chosen = {"auto": [], "heuristic": []}
for name, policy in (("auto", AutoGamma(cost_model)), ("heuristic", HeuristicGamma(cost_model.gamma_max))):
    for alpha in phases:
        g = policy.next_gamma()
        n = 0
        while n < g and rng.random() < alpha:
            n += 1
        policy.update(g, n)
        chosen[name].append(g)

fig, ax = plt.subplots(figsize=(11, 3))
for name, gs in chosen.items():
    ax.step(range(len(gs)), gs, where="post", label=f'gamma="{name}"')
ax.set_xlabel("round")
ax.set_ylabel("g (draft tokens)")
ax.set_title("alpha 0.9, then 0.1, then 0.8", fontsize=9)
ax.legend(fontsize=8)
plt.show()
for name, gs in chosen.items():
    rate = sum(speedup_of(g, a) for g, a in zip(gs, phases)) / len(gs)
    print(f'{name:>9}: mean predicted speed-up over the rounds {rate:.2f}x; rounds without drafting: {gs.count(0)}')

# %% [markdown]
# ## Acceptance by position: measured against alpha^i
#
# The theory above assumes every draft token is accepted independently with the same chance
# alpha, so the i-th token of a round is accepted (with all before it) with probability alpha^i.
# Measure it: sample with `Observers(trace=True)` and count, for each position i, how often the i-th draft
# token of a round was accepted. Real text is not i.i.d.: easy stretches (indentation, a closing
# bracket, a common word) are accepted in long runs and hard ones fail early, so the measured
# curve usually decays more slowly than alpha^i after the first position.

# %%
from gpt2 import encode, load_gpt2
from spec_decoding import speculative_sampling

target = load_gpt2(TARGET, device=DEVICE)
draft = load_gpt2(DRAFT, device=DEVICE)
GAMMA_TRACE = 6
prompt_ids = encode(PROMPT) if target.config.vocab_size == 50257 else list(range(1, 12))
traced = speculative_sampling(target, draft, prompt_ids,
                              max_gen=min(120, target.config.n_positions - len(prompt_ids)),
                              gamma=GAMMA_TRACE,
                              sampling=SamplingParams(temperature=1.0, generator=torch.Generator().manual_seed(0)),
                              observers=Observers(trace=True)).trace
counts = traced.acceptance_by_position()  # [(accepted, drafted)] per position
positions = list(range(1, len(counts) + 1))
measured = [a / d if d else float("nan") for a, d in counts]
alpha_run = traced.alpha
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.bar(positions, measured, color="tab:blue", alpha=0.7, label="measured: P(i-th draft token accepted)")
for i, (a, d) in zip(positions, counts):
    ax.annotate(f"{a}/{d}", (i, measured[i - 1]), ha="center", va="bottom", fontsize=8)
ax.plot(positions, [alpha_run ** i for i in positions], "r--", marker="x", zorder=3,
        label=f"alpha^i, alpha = {alpha_run:.3f} (i.i.d. theory)")
ax.set_ylim(0, 1.05)
ax.set_xlabel("position i of the draft token in its round")
ax.set_ylabel("share of rounds")
ax.set_title(f"{len(traced.rounds)} rounds at temperature 1, gamma = {GAMMA_TRACE}", fontsize=10)
ax.legend(fontsize=8)
plt.show()
