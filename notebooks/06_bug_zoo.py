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
# # 6. The bug zoo: real speculative-decoding bugs, each planted and caught
#
# Speculative sampling is easy to get subtly wrong, and the wrong versions still write fluent
# text, so nobody notices. Well-known libraries and teaching repositories have shipped each of the
# mistakes below. Here every one is planted for a moment into this project's real code (a
# monkeypatch or a small subclass, from `spec_decoding/checks/bug_zoo.py`; the library itself is never
# edited) and the check that catches it is run on it, next to the same check on the correct code.
#
# | bug | caught by | shipped in |
# |---|---|---|
# | the draft takes its argmax while the target samples | exact distribution, chi-square | transformers |
# | the drafter reports q before top-k/top-p but sampled after them | exact distribution, chi-square | transformers |
# | after a rejection, resampling from p instead of norm(max(0, p - q)) | exact distribution, chi-square | EAGLE |
# | top-k/top-p before the temperature, on one model only | exact distribution, chi-square | fish-speech (a plain sampler) |
# | every draft token accepted | exact distribution, chi-square | transformers |
# | a KV cache not rolled back after a rejection | cache vs fresh forward, every round | mlx-swift-lm |
# | a bonus token past max_gen | stopping check | a teaching repository |
# | tokens kept after eos | stopping check | transformers |
# | "sampler match": accept only when a fresh draw from p equals the draft token | speed check | mlxcel |
# | the draft's KV cache rewound two entries too far, never caught up | speed check | mlxcel |
# | the draft cut short by a confidence threshold | speed check | llama.cpp |
# | the target's cache reset where a rollback was meant | greedy equals the target's greedy | aprender |
# | a batch's rows rewound by one shared count | every row equals its prompt's greedy | mlx-vlm |
# | each draft token judged by the wrong logit row | greedy equals the target's greedy | mlx-node |
# | greedy "mismatch" in half precision | not a bug: a near-tie of the logits | |
#
# Every entry carries its source (`bug.source`): the project, the issue or pull request where it was
# reported or fixed, and one sentence of what happened there. The last three kinds are new to most
# test suites: the **speed bugs** keep the output exactly the target's (so no distribution test can
# see them) and only throw acceptance away; the check that catches them compares the run with what
# the pair's own distributions predict, and says "lossless, but slower".
#
# The checks live in `spec_decoding/checks/generator_checks.py`: the tests use them, and so can you on your own
# drafter. The asserts below are tests: the suite runs this notebook (`tests/test_notebooks.py`),
# and `tests/test_bug_zoo.py` tests the rest of the zoo.

# %%
from notebook_setup import ROOT  # noqa: F401  (puts the project on the path)

import inspect
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch
# %matplotlib inline

from gpt2 import GPT2Config, load_gpt2
from offline.random_weights import save_agreeing_pair, save_random_checkpoint
from spec_decoding import autoregressive_generate, speculative_sampling_greedy
from spec_decoding.checks.bug_zoo import BUGS, SPEED_PAIR, SPEED_PAIR_CONFIG, run_check
from spec_decoding.checks import exact_distribution

torch.manual_seed(0)
torch.set_num_threads(1)  # tiny models: threads only add overhead

# %% [markdown]
# ## A pair small enough to enumerate
#
# The sampling checks compare speculative samples with the target's **exact** distribution of the
# first three tokens: P(t1, t2, t3) = p(t1) p(t2 | t1) p(t3 | t1, t2), every one of the V^3
# outcomes. That needs a tiny vocabulary, so this notebook makes its own pair (it ignores the
# GPT2_TARGET/GPT2_DRAFT switch): two unrelated random GPT-2s over 16 tokens (4,096 outcomes). They
# agree about half the time, so rejections, residual draws and bonus tokens are all frequent. The
# bugs are the same bugs with real GPT-2s; only the enumeration needs the small vocabulary.

# %%
TINY_VOCAB = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=32, vocab_size=16)
folder = Path(tempfile.mkdtemp())
target = load_gpt2(save_random_checkpoint(folder / "target", TINY_VOCAB, seed=21, std=0.2, embedding_std=0.3))
draft = load_gpt2(save_random_checkpoint(folder / "draft", TINY_VOCAB, seed=22, std=0.2, embedding_std=0.3))
PROMPT = [1, 2, 3]
SAMPLES = 1000  # per check: enough to catch every sampling bug here at p < 1e-6
speed_pair = tuple(load_gpt2(d) for d in save_agreeing_pair(folder / "speed-target", folder / "speed-draft",
                                                           GPT2Config(**SPEED_PAIR_CONFIG), **SPEED_PAIR))

exact = exact_distribution(target, PROMPT, 3, dict(temperature=1.0))
print("exact distribution:", tuple(exact.shape), "outcomes, sums to", round(exact.sum().item(), 6))
first = exact.sum((1, 2))  # P(t1)
print("most likely first tokens:", {int(t): round(first[t].item(), 3) for t in first.topk(3).indices})

# %% [markdown]
# ## Where each one shipped
#
# Every entry's source: the project, the public issue or pull request where it was reported or
# fixed, and which check catches the planted version (with the words its message says).

# %%
for bug in BUGS.values():
    print(f"{bug.name}  [check_{bug.check}: \"{bug.says}\"]\n  {bug.source.project}: {bug.source.story}")
    for link in bug.source.links or ["(not found reported anywhere)"]:
        print("   ", link)

# %% [markdown]
# ## The checks, on the correct code
#
# * **check_lossless** draws `SAMPLES` speculative generations of three tokens and compares the
#   counts of their outcomes with the exact distribution by Pearson's chi-square test: p > 1e-3
#   passes. It also reports the **total variation** (half the L1 distance) between the samples'
#   empirical distribution and the exact one. With 4,096 outcomes and 1,000 samples even a perfect
#   sampler shows a large one, so the check reports that reference too (a perfect sampler's
#   total variation with as many draws from the exact distribution itself).
# * **check_caches_after_every_round** watches both models' KV caches: at the start of every
#   round a cache of length L must hold exactly the keys and values of a fresh forward over the
#   first L accepted tokens.
# * **check_stopping**: exactly max_gen tokens for max_gen = 1..11, and with eos_id set, the
#   output ends at the first eos.
# * **check_greedy_matches_target** and **check_batch_greedy**: greedy speculative output (each row
#   of a batch) equals the target's own greedy output.
# * **check_speed**: eight seeded generations, measured two ways. At every draft token the target
#   judged, a correct run accepts with probability sum(min(p, q)), p and q taken from *fresh*
#   forwards of both models over the run's own output (no cache the run could have spoiled): the
#   accepted count's expectation is the sum of those numbers and its variance the sum of
#   a (1 - a), exactly. And the tokens per target call, against Leviathan's
#   (1 - alpha^(gamma+1)) / (1 - alpha) with alpha the pair's measured acceptance. Four standard
#   deviations below fails. It runs on a second pair whose draft is the target's first block
#   (agreeing about 70% of the time, less when it loses context): with two unrelated models a
#   draft that forgets its context agrees no less, so there is nothing to lose.

# %%
correct = {}
for bug in BUGS.values():
    key = (bug.check, tuple(sorted(bug.settings.items())))
    if key not in correct:
        models = speed_pair if bug.check == "speed" else (target, draft)
        correct[key] = run_check(bug.check, *models, bug.settings, SAMPLES)
        print(f"{bug.check:9} {bug.settings}: {correct[key]}")
for (check, settings), result in correct.items():
    assert result.passed, result.message
    if check == "lossless":  # no further from the exact distribution than sampling noise
        assert result.total_variation < 1.2 * result.reference_tv, result.message
    if check == "speed":  # not near the threshold of 4 standard deviations
        assert min(result.acceptance_z, result.tokens_z) > -2, result

# %% [markdown]
# ## Each bug: the mistake, why it is tempting, the patch, the check
#
# `show(bug)` prints the code that holds the mistake (the line marked "the bug"), plants it, runs
# the check that catches it and prints the result under the correct code's.

# %%
caught = {}


def show(name):
    bug = BUGS[name]
    source = bug.source
    print(f"THE MISTAKE: {bug.mistake}.\nWHY TEMPTING: {bug.why_tempting}")
    print(f"WHERE IT SHIPPED: {source.project}: {source.story}")
    for link in source.links:
        print("   ", link)
    print()
    print(inspect.getsource(bug.code))
    models = speed_pair if bug.check == "speed" else (target, draft)
    with bug.planted():
        result = run_check(bug.check, *models, bug.settings, SAMPLES)
    good = correct[(bug.check, tuple(sorted(bug.settings.items())))]
    print(f"settings {bug.settings}, check_{bug.check}")
    print(f"  correct code: {good}")
    print(f"  with the bug: {result}")
    assert not result.passed, f"{name} was not caught"
    assert bug.says in result.message, result.message  # the words its entry promises
    # with power to spare: far past the thresholds (p < 1e-3, 4 standard deviations)
    if bug.check == "lossless":
        assert result.p_value < 1e-6 and result.total_variation > 1.2 * result.reference_tv, result.message
    if bug.check == "speed":
        assert result.message.startswith("lossless, but slower: ") and min(result.acceptance_z, result.tokens_z) < -6
    caught[name] = result


# %% [markdown]
# ### 1. A greedy draft while the target samples
#
# Taking the draft's argmax makes it agree with the target more often (one project measured
# ~20% more speed this way, and later reverted it). But the draft then reports q, the softmax it
# did *not* sample from: the acceptance test min(1, p/q) and the residual assume tokens drawn from
# q, so the output drifts towards the draft's favourite tokens. (A deterministic draft *can* be
# lossless: report a point mass q(x) = 1, see `Drafter.propose`. It is the mismatch that breaks it.)

# %%
show("greedy draft")

# %% [markdown]
# ### 2. The drafter reports q before top-k/top-p while it sampled after them
#
# q is computed once, early; the filters are added later where the sampling happens. The
# reported q is then too small on the kept tokens and positive on removed ones, so draft tokens
# are accepted too often. The error grows with the filters' strength (one report measured a total
# variation up to ~0.3); here temperature 1.5, top-k 6, top-p 0.7.

# %%
show("q before top-k/top-p")

# %% [markdown]
# ### 3. Resampling from p instead of the residual norm(max(0, p - q))
#
# "After a rejection the target decides" sounds right. But the accepted tokens already carry
# min(p, q) of the mass; drawing the replacement from p counts that mass twice and biases the
# output towards tokens the draft likes.

# %%
show("resample from p")

# %% [markdown]
# ### 4. Top-k/top-p before the temperature, on one model only
#
# Two code paths build p and q; here the target's applies the filters first and the temperature
# last, so top-p keeps a different set of tokens. The output follows that wrong p: still a
# smooth, plausible distribution, just not the one asked for. (The same slip on the draft alone
# is harmless for the distribution, as long as the q reported is the one sampled from: it only
# lowers acceptance. Speculative sampling is lossless for *any* honest q.)

# %%
show("filters before temperature")

# %% [markdown]
# ### 5. A KV cache not rolled back after a rejection
#
# The rejected draft tokens stay in the draft's cache: later proposals attend to keys and values
# of tokens that are not in the sequence. The cache check compares, at the start of every round,
# what each cache holds with a fresh forward over the accepted tokens.

# %%
show("cache not rolled back")

# %% [markdown]
# ### 6. A bonus token past max_gen
#
# When all gamma draft tokens are accepted the target's last row gives a bonus token for free, so
# the last round is tempted to keep it even when that makes max_gen + 1 tokens. Here the last
# round drafts as if one more token were allowed.

# %%
show("bonus token past max_gen")

# %% [markdown]
# ### 7. Tokens kept after eos
#
# A round adds several tokens at once; taking the round whole and only then looking for eos
# keeps the tokens after it.

# %%
show("tokens after eos")

# %% [markdown]
# ### 8. Every draft token accepted
#
# transformers' first speculative sampling counted its matches wrongly and kept every candidate:
# the output then follows the draft's distribution, not the target's, and acceptance reads 100%.

# %%
show("every draft accepted")

# %% [markdown]
# ## The speed bugs: lossless, but slower
#
# The next three keep the output exactly the target's. The chi-square test passes on every one of
# them (tests/test_bug_zoo.py proves it); only the speed check sees them.
#
# ### 9. "Sampler match"
#
# Accept a draft token only when a fresh draw from p equals it, and output that draw otherwise:
# every output token is a draw from p, so it is exact. But two independent draws agree with
# probability sum(p q), while the rejection test accepts with sum(min(p, q)): for p == q that is
# sum(p^2) against 1. The mlxcel project found its "stochastic" path was this rule all along.

# %%
show("sampler match")

# %% [markdown]
# ### 10. The draft's KV cache rewound two entries too far
#
# Who fed which token is easy to miscount: the draft never feeds its own last proposal, the
# target feeds one token more. mlxcel trimmed the draft cache by `rejected + 1` where
# `rejected - 1` was right, and its drafter only feeds the newest token, so the two lost entries
# never came back: the drafter's context fell further behind with every rejecting round, and
# acceptance decayed. (This project's drafter feeds whatever its cache has not seen, which heals
# a cache that is too short; the planted drafter feeds only what it *believes* is new.)

# %%
show("draft cache rewound too far")

# %% [markdown]
# ### 11. A draft cut short by a confidence threshold
#
# llama.cpp's speculative example stopped drafting when the draft's best token had probability
# below `p_accept = 0.8`. A confident draft is rarely rejected, so acceptance read 100%, while
# most rounds drafted nothing. Acceptance alone flatters it; tokens per target call, against what
# the pair's acceptance predicts for gamma, does not.

# %%
show("draft cut by confidence")

# %% [markdown]
# The three side by side with the correct code: what each run measured (solid) against what the
# pair's own distributions predict for it (hatched).

# %%
speed_runs = {"correct code": correct[("speed", (("temperature", 1.0),))]}
speed_runs.update({name: caught[name] for name in ("sampler match", "draft cache rewound too far",
                                                   "draft cut by confidence")})
x = torch.arange(len(speed_runs)).numpy()
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
ax1.bar(x - 0.2, [r.rate for r in speed_runs.values()], 0.4, label="accepted / judged", color="tab:blue")
ax1.bar(x + 0.2, [r.expected_accepted / r.judged for r in speed_runs.values()], 0.4, hatch="//",
        label="predicted: mean sum(min(p, q))", color="white", edgecolor="tab:blue")
ax1.set_ylabel("acceptance")
ax2.bar(x - 0.2, [r.tokens_per_call for r in speed_runs.values()], 0.4, label="tokens per target call",
        color="tab:orange")
ax2.bar(x + 0.2, [r.predicted_tokens_per_call for r in speed_runs.values()], 0.4, hatch="//",
        label="predicted: (1 - a^(g+1)) / (1 - a)", color="white", edgecolor="tab:orange")
for ax in (ax1, ax2):
    ax.set_xticks(x, list(speed_runs), rotation=15)
    ax.legend()
fig.suptitle("Speed bugs: lossless, but slower (gamma 4, 8 seeded runs on the agreeing pair)")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Cache and indexing bugs that break greedy exactness
#
# ### 12. A cache reset where a rollback was meant
#
# aprender's self-speculative GPU path called `reset_kv_cache_gpu()` where
# `rollback_kv_cache_gpu(snapshot)` was meant, while the rest of the code still fed only the new
# tokens: every verification attended to an almost empty cache.

# %%
show("cache reset, not rolled back")

# %% [markdown]
# ### 13. A batch's rows rewound alike
#
# In a batch, rows accept different numbers of draft tokens. mlx-vlm advanced every row's cache
# offset by the whole draft block; rows that accepted fewer kept the rejected tokens' keys and
# values, and outputs fell into loops. Here every row is rewound by one shared count
# (`spec_decoding.algorithms.batched` keeps one length per row: notebook 09).

# %%
show("batch rows rewound alike")

# %% [markdown]
# ### 14. The wrong logit row judges each draft token
#
# The target's forward over [last token, d_1, ..., d_g] gives g + 1 rows; row i comes *before*
# draft token i + 1 and judges it. Slicing from row 1 ("row 0 belongs to the last token") judges
# each draft token by the row after it.

# %%
show("verification row off by one")

# %% [markdown]
# ## All the sampling bugs at a glance
#
# Left: total variation from the exact distribution, the correct code's and a perfect sampler's
# (the sampling noise at 1,000 samples) beside each bug's. Right: the chi-square p-value (log
# scale); below the dashed line (1e-3) the check fails.

# %%
sampling_bugs = [name for name in caught if BUGS[name].check == "lossless"]
labels, tvs, refs, good_tvs, p_values, good_p = [], [], [], [], [], []
for name in sampling_bugs:
    bug, result = BUGS[name], caught[name]
    good = correct[("lossless", tuple(sorted(bug.settings.items())))]
    labels.append(name)
    tvs.append(result.total_variation)
    refs.append(result.reference_tv)
    good_tvs.append(good.total_variation)
    p_values.append(max(result.p_value, 1e-300))
    good_p.append(good.p_value)

x = torch.arange(len(labels)).numpy()
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
ax1.bar(x - 0.25, refs, 0.25, label="perfect sampler (noise)", color="lightgray")
ax1.bar(x, good_tvs, 0.25, label="correct code", color="tab:green")
ax1.bar(x + 0.25, tvs, 0.25, label="with the bug", color="tab:red")
ax1.set_xticks(x, labels, rotation=20)
ax1.set_ylabel("total variation")
ax1.legend()
ax2.bar(x - 0.15, good_p, 0.3, label="correct code", color="tab:green")
ax2.bar(x + 0.15, p_values, 0.3, label="with the bug", color="tab:red")
ax2.axhline(1e-3, ls="--", color="k")
ax2.set_yscale("log")
ax2.set_xticks(x, labels, rotation=20)
ax2.set_ylabel("chi-square p-value")
ax2.legend()
fig.suptitle(f"Random 16-token pair (seeds 21/22), {SAMPLES} samples of 3 tokens per check")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Not a bug: greedy "mismatches" in half precision
#
# Verifying several tokens in one forward and decoding one at a time use different matrix shapes,
# so their logits differ in the last bits. In float32 that can flip the argmax only on an exact
# near-tie; in 16-bit formats it happens. Below, a float16 model (11 bits of mantissa; it runs on
# every CPU, on PyTorch's plain float16 path; bfloat16, with 8 bits, shows the same, but needs
# AVX-512 to run fast) with flat logits (vocabulary 2,000: many near-ties) decodes a few prompts
# greedily: speculative vs the target alone. In float32 they are identical. In float16 they can
# part ways; where they do, the two candidate
# tokens' float32 logits are within a hair of each other, far closer than the usual gap between the
# best and second-best token. The mismatch sits on the near-tie, not in the algorithm.

# %%
config = GPT2Config(n_layer=4, n_head=4, n_embd=256, n_positions=64, vocab_size=2000)
target_dir, draft_dir = save_agreeing_pair(folder / "flat-target", folder / "flat-draft", config,
                                           draft_n_layer=2, damping=0.1, seed=11, std=0.2,
                                           embedding_std=0.02)
target32, draft32 = (load_gpt2(d, dtype=torch.float32) for d in (target_dir, draft_dir))
target16, draft16 = (load_gpt2(d, dtype=torch.float16) for d in (target_dir, draft_dir))
all_gaps, mismatches = [], []
for seed in range(8):
    prompt = torch.randint(0, config.vocab_size, (6,), generator=torch.Generator().manual_seed(seed)).tolist()
    same32 = (speculative_sampling_greedy(target32, draft32, prompt, 40, 4).tokens
              == autoregressive_generate(target32, prompt, 40).tokens)
    alone = autoregressive_generate(target16, prompt, 40).tokens
    spec = speculative_sampling_greedy(target16, draft16, prompt, 40, 4).tokens
    with torch.inference_mode():
        logits = target32(torch.tensor([prompt + alone]))[0, len(prompt) - 1:-1]  # [40, V], float32
    top2 = logits.topk(2, dim=-1).values
    all_gaps += (top2[:, 0] - top2[:, 1]).tolist()
    i = next((i for i, (a, b) in enumerate(zip(alone, spec)) if a != b), None)
    if i is None:
        print(f"prompt {seed}: float32 identical: {same32}; float16 identical")
    else:
        gap = abs(logits[i, alone[i]] - logits[i, spec[i]]).item()
        mismatches.append(gap)
        print(f"prompt {seed}: float32 identical: {same32}; float16 differs at token {i}: "
              f"{alone[i]} vs {spec[i]}, float32 logit gap {gap:.5f}")
median_gap = sorted(all_gaps)[len(all_gaps) // 2]
print(f"median gap between the best and second-best token: {median_gap:.4f}")

plt.figure(figsize=(6, 3))
plt.hist(all_gaps, bins=40, color="lightgray", label="best - second best, every position")
for gap in mismatches:
    plt.axvline(gap, color="tab:red", label="where float16 differs" if gap == mismatches[0] else None)
plt.xlabel("float32 logit gap")
plt.legend()
plt.title("float16 mismatches sit on near-ties")
plt.show()
if mismatches:
    assert max(mismatches) < 0.01 < median_gap / 2

# %% [markdown]
# ## Use the checks on your own code
#
# ```python
# # from spec_decoding.checks import check_lossless, check_caches_after_every_round, check_stopping
#
# generate = partial(speculative_sampling, target, MyDrafter(...), gamma=4)
# print(check_lossless(generate, target, prompt=[1, 2, 3], n_tokens=3,
#                      settings=dict(temperature=1.0), samples=2000, seed=0))
# print(check_caches_after_every_round(generate, target, draft_model, prompt=[1, 2, 3],
#                                      settings=dict(temperature=1.0)))
# print(check_stopping(generate, prompt=[1, 2, 3], settings=dict(temperature=1.0)))
# ```
#
# `python -m assignments` turns these into an autograder for course exercises.
