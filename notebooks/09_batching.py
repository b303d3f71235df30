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
# # 9. Batching: several prompts at once, each accepting its own number of tokens
#
# Everything so far decoded one sequence. A server decodes many at once, and the next question is
# what speculation does to a batch. Two things change.
#
# **The bookkeeping.** In one round row 0 may accept all gamma draft tokens while row 1 rejects the
# first. From then on the rows have different lengths. GPT-2's position embeddings are learned and
# absolute, so each row needs its own positions, its own KV-cache length and its own attention
# mask. `spec_decoding/algorithms/batched.py` gives every row its own length (a *per-row length*): row b's new
# keys go to slots `lengths[b], lengths[b] + 1, ...` of its cache row, and rolling it back after a
# rejection moves only `lengths[b]`, exactly as `KVCache.truncate` does for one sequence. The new
# tokens of one forward are right-padded to the longest row's count. The padding's keys land past
# the row's length, as a rejected draft token's do, and nothing ever attends to them. (The other
# way, left padding, is in the module's docstring: it has to re-align the rows every round.)
#
# **The economics.** Speculation spends spare arithmetic to save memory-bound steps. At batch 1 a
# step reads all the weights to do very little arithmetic, so scoring gamma + 1 tokens costs
# about as much as scoring one. At batch B the target verifies B x (gamma + 1) rows. Once that many
# rows are compute-bound, verification is no longer free, and the speed-up shrinks and then
# inverts. This notebook measures where that happens on your machine.
#
# Same switch as the other notebooks (`GPT2_TARGET`, `GPT2_DRAFT`, `DEVICE`; see notebook 1).
# `BATCH_RESULTS` may name the `results.json` of `python benchmark.py --batch ...`, and the
# last figure then shows it.

# %%
from notebook_setup import DEVICE, DRAFT, ROOT, TARGET, encode_prompt, load_pair

import os
from pathlib import Path

import matplotlib.pyplot as plt
import torch
# %matplotlib inline

torch.manual_seed(0)
# The pair as gpt2/model.py is written (load_gpt2), so every forward below is code you can step
# into. Where batching stops paying depends on when a forward stops reading weights and starts
# computing, which holds for the accelerated models too; `python benchmark.py --batch ...` times
# those (the scripts take gpt2.speed's step), and BATCH_RESULTS below reads its results.
target, draft = load_pair()
V = target.config.vocab_size
BATCH_RESULTS = Path(os.environ.get("BATCH_RESULTS", ROOT / "runs" / "batched" / "results.json"))

# %% [markdown]
# ## Four prompts of different lengths, one batch
#
# `batched_speculative_sampling` takes a list of prompts. At temperature 0 every row must be
# exactly the target's own greedy output for that prompt alone: the check below compares each row
# with `autoregressive_generate` on the prompt by itself.

# %%
from spec_decoding import autoregressive_generate, Observers
from spec_decoding.algorithms.batched import batched_speculative_sampling

base = encode_prompt("def main():\n    args = parse_args()\n    for name in args.files:\n", V)
prompts = [base[:3], base, base[:7], base[:1]]  # 3, 11+, 7 and 1 tokens
rounds = []
result = batched_speculative_sampling(target, draft, prompts, max_gen=24, gamma=3,
                                      observers=Observers(on_round=rounds.append))
for i, (prompt, row) in enumerate(zip(prompts, result.rows)):
    alone = autoregressive_generate(target, prompt, 24).tokens
    assert row.tokens == alone, f"row {i} differs from the target alone"
    print(f"row {i}: prompt of {len(prompt):2d} tokens, {len(row.tokens)} new, "
          f"alpha {row.stats.alpha:.2f}, {row.stats.tokens_per_target_call:.2f} tokens per target call")
print("every row is identical to the target's own greedy output for its prompt alone")

# %% [markdown]
# ## Each row accepts its own count
#
# `on_round` saw every round (a `BatchRoundReport`). Per round and row: the accepted draft tokens
# (of gamma = 3), and each row's KV-cache length afterwards. The lengths drift apart: that is the
# ragged batch that per-row lengths handle without moving a single cache entry.

# %%
print("round | accepted per row | target cache length per row")
for k, report in enumerate(rounds):
    accepted = {r: n for r, n in zip(report.active, report.n_accepted)}
    lengths = {r: int(n) for r, n in zip(report.active, report.target_cache.lengths)}
    print(f"{k:5d} | " + " ".join(f"{accepted.get(r, '-'):>2}" for r in range(len(prompts)))
          + "   | " + " ".join(f"{lengths.get(r, '-'):>3}" for r in range(len(prompts))))

# %% [markdown]
# ## What a forward costs by rows
#
# `calibrate_batch_costs` times one forward of n rows (n sequences, one new token each) in both
# models. The batch's cost model (`spec_decoding.policies.costs.BatchCostModel`) prices everything by rows:
# a batched step of B sequences is B rows, verifying gamma draft tokens for each is B x (gamma + 1)
# rows. Then, with every row accepting with probability alpha,
#
#     speed-up(B) = E(alpha, gamma) / (gamma c(B) + verify_cost(B, gamma)),
#     c(B) = draft(B rows) / target(B rows),  verify_cost(B, gamma) = target(B (gamma + 1) rows) / target(B rows),
#
# Leviathan's formula with costs measured at the batch size (`spec_decoding/policies/theory.py`).

# %%
from spec_decoding.calibration import calibrate_batch_costs

BATCH_SIZES, GAMMAS = [1, 4, 16], [1, 3]  # more in benchmark.py --batch
costs = calibrate_batch_costs(target, draft, max_rows=max(BATCH_SIZES) * (max(GAMMAS) + 1), repeats=3)
fig, ax = plt.subplots(figsize=(6, 3.6))
ax.plot(costs.rows, [1000 * s for s in costs.target_s], "o-", label="target")
ax.plot(costs.rows, [1000 * s for s in costs.draft_s], "s-", label="draft")
ax.set_xscale("log", base=2)
ax.set_xlabel("rows in one forward")
ax.set_ylabel("ms per forward")
ax.set_title("Flat while memory-bound, then growing with the rows")
ax.legend()
plt.show()
for B in BATCH_SIZES:
    print(f"B = {B:2d}: c = {costs.c(B):.2f}, verify cost for gamma = " +
          ", ".join(f"{g}: {costs.verify_cost(B, g):.2f}" for g in GAMMAS))

# %% [markdown]
# ## Measured beside predicted
#
# Batched autoregressive decoding (the baseline: the target alone, B rows a step) against batched
# speculative decoding, summed tokens per second, for each batch size at its best gamma. With a
# benchmark result (`BATCH_RESULTS`) the figure shows it; otherwise a small run here, on the pair
# loaded above. The crossover is the first batch size at which speculation stops paying.

# %%
import json

from spec_decoding.policies.theory import crossover_batch_size

if BATCH_RESULTS.is_file():
    by_batch = json.loads(BATCH_RESULTS.read_text())["by_batch"]
    print(f"Read {len(by_batch)} batch sizes from {BATCH_RESULTS}")
else:
    print("Measuring a small result inline (no BATCH_RESULTS file) ...")
    from benchmarks.batched_speed import run_batch_grid

    results = run_batch_grid(target, draft, [base[:n] for n in (3, 5, 7, 11)], BATCH_SIZES, GAMMAS,
                             max_gen=8, log=lambda *a: None, costs=costs)
    by_batch = results["by_batch"]
measured = {e["batch"]: e["speedup_measured"] for e in by_batch}
predicted = {e["batch"]: e["best_speedup_predicted"] for e in by_batch}
fig, ax = plt.subplots(figsize=(6, 3.6))
ax.plot(list(measured), list(measured.values()), "o-", label="measured (best gamma)")
ax.plot(list(predicted), list(predicted.values()), "s--", label="predicted (best gamma)")
ax.axhline(1.0, color="grey", lw=0.8)
ax.set_xscale("log", base=2)
ax.set_xlabel("batch size B")
ax.set_ylabel("speculative / autoregressive tokens/s")
ax.legend()
plt.show()
for e in by_batch:
    print(f"B = {e['batch']:2d}: best gamma {e['best_gamma']}, alpha {e['alpha']:.2f}, measured "
          f"{e['speedup_measured']:.2f}x, predicted {e['speedup_predicted']:.2f}x")
print(f"crossover: measured {crossover_batch_size(measured)}, predicted {crossover_batch_size(predicted)} "
      f"(None: speculation paid at every batch size tried)")

# %% [markdown]
# ## What to take away
#
# * Batching speculative decoding is bookkeeping, not new mathematics: each row runs the very same
#   accept/reject step on its own p, q and random draws, so each row stays lossless. What must not
#   happen is one row's verdict deciding another's (tests/test_batched.py plants that bug and the
#   chi-square test catches it).
# * Per-row lengths make a rejection cost nothing but a length; finished rows leave the batch.
# * The speed-up depends on how many rows a forward can take before it stops being memory-bound.
#   On a CPU that happens at a few dozen rows; a GPU has far more arithmetic per byte of weights
#   read, so its crossover sits at a much larger batch. `docs/batching.md` has the measured table
#   for gpt2-large-shaped models on this project's CPU.
