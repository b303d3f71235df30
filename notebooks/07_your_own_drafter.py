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
# # 7. Write your own drafter
#
# Speculative decoding does not care where the draft tokens come from. The generators take any
# `Drafter` (`spec_decoding/drafters/drafter.py`): an object with three methods,
#
# * `start(prompt, max_gen)`: a generation begins (allocate caches, reset state);
# * `propose(tokens, num_tokens, temperature, top_k, top_p, generator)`: up to `num_tokens` tokens
#   to follow `tokens`, **and the q each was drawn from** (or `None` for a deterministic proposal);
# * `roll_back(length)`: only the first `length` tokens are still the sequence.
#
# The project ships three: `ModelDrafter` (a second GPT-2), `NGramDrafter` (prompt lookup) and
# `LayerSkipDrafter` (the target's own first blocks). Here we write a fourth in a few lines, run
# it through both generators, and check that the output is still exactly the target's. This is
# the template for an assignment: change `propose`, keep the checks.

# %%
# Finds the project, reads the switch (GPT2_TARGET, DEVICE): see notebook_setup.py.
from notebook_setup import DEVICE, TARGET

import matplotlib.pyplot as plt
import torch
# %matplotlib inline

from gpt2 import load_gpt2
from spec_decoding import speculative_sampling, speculative_sampling_greedy
from spec_decoding.drafters import Drafter

torch.manual_seed(0)
target = load_gpt2(TARGET, device=DEVICE)  # no draft model needed
print(f"target: {TARGET}, {target.num_parameters() / 1e6:.1f}M parameters, device {DEVICE}")

# %% [markdown]
# ## A drafter in a few lines: "what came after this token last time"
#
# Propose the token that followed the most recent earlier occurrence of the last token, then
# the token that followed *that* one, and so on. No model, no state: `start` and `roll_back` can
# stay as the base class has them (they do nothing).
#
# The proposal is deterministic, so we return `None` for q. The generator then treats each token
# as drawn from a point mass, q(x) = 1: greedy keeps it if it equals the target's argmax; sampling
# accepts it with probability min(1, p(x)/1) = p(x) and, after a rejection, draws from
# norm(max(0, p - q)), which is p with x removed. That is what keeps the output exact.

# %%
class FollowerDrafter(Drafter):
    """Propose what followed the last token the last time it occurred (and chain)."""

    def propose(self, tokens, num_tokens, temperature=0.0, top_k=None, top_p=None, generator=None):
        sequence, draft_tokens = list(tokens), []
        for _ in range(num_tokens):
            last = sequence[-1]
            earlier = [i for i in range(len(sequence) - 1) if sequence[i] == last]
            if not earlier:
                break  # nothing to copy: fewer tokens this round (none is fine too)
            draft_tokens.append(sequence[earlier[-1] + 1])
            sequence.append(draft_tokens[-1])
        return draft_tokens, None  # None: deterministic, a point mass on each token


print(FollowerDrafter().propose([7, 8, 9, 7, 8], 3))  # 8 was followed by 9, then 9 by 7: [9, 7, 8]

# %% [markdown]
# ## Greedy: the output equals the target's own greedy output
#
# `spec_decoding.checks` holds the checks the tests use. Greedy speculative decoding must give
# exactly the tokens the target gives alone, whatever the drafter proposes.

# %%
from functools import partial

from spec_decoding.checks import check_greedy_matches_target

prompt = [464, 3290, 318, 257, 3290, 13, 383, 3290, 318]  # token ids with repeats to copy from
for gamma in (1, 2, 4):
    check = check_greedy_matches_target(
        partial(speculative_sampling_greedy, target, FollowerDrafter(), gamma=gamma), target, prompt, max_gen=40)
    assert check.passed, check.message
    stats = speculative_sampling_greedy(target, FollowerDrafter(), prompt, 40, gamma).stats
    print(f"gamma {gamma}: {check}; drafted {stats.tokens_drafted}, accepted {stats.tokens_accepted}, "
          f"{stats.tokens_per_target_call:.2f} tokens per target call")

# %% [markdown]
# ## Sampling: the output is distributed exactly as the target's
#
# To check a distribution exactly we enumerate it, which needs a tiny vocabulary: a random 16-token
# GPT-2 stands in for the target here (16^3 = 4,096 outcomes for 3 tokens). `check_lossless`
# draws a few thousand speculative samples and compares them with the exact distribution by a
# chi-square test, at temperature 1 and at temperature 0.7 with top-k and top-p.

# %%
from gpt2 import GPT2, GPT2Config
from spec_decoding.checks import check_lossless

torch.set_num_threads(1)  # a model this small runs fastest on one thread
torch.manual_seed(1)
tiny = GPT2(GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=32, vocab_size=16)).eval()
tiny_prompt = [1, 2, 3, 1, 2]  # repeats, so the drafter has something to propose
results = {}


def check_follower(settings):
    check = check_lossless(partial(speculative_sampling, tiny, FollowerDrafter(), gamma=2), tiny,
                           tiny_prompt, n_tokens=3, settings=settings, samples=1000, seed=0)
    assert check.passed, check.message
    results[f"honest, T={settings['temperature']}"] = check
    print(settings, check)


check_follower(dict(temperature=1.0))

# %%
check_follower(dict(temperature=0.7, top_k=6, top_p=0.9))

# %% [markdown]
# ## The mistake the check catches
#
# A deterministic proposal is *not* drawn from whatever distribution you like to report. Say a
# drafter claims each token came from the uniform distribution (q(x) = 1/V): then x is accepted
# with probability min(1, V p(x)), far too often, and the output drifts towards the copied tokens.
# Nothing crashes; only the distribution is wrong. The same check tells it apart.

# %%
class UniformClaimDrafter(FollowerDrafter):
    """The bug: reports q = uniform for tokens it did not sample from the uniform distribution."""

    def propose(self, tokens, num_tokens, temperature=0.0, top_k=None, top_p=None, generator=None):
        draft_tokens, _ = super().propose(tokens, num_tokens)
        V = tiny.config.vocab_size
        return draft_tokens, torch.full((len(draft_tokens), V), 1.0 / V) if draft_tokens else None


wrong = check_lossless(partial(speculative_sampling, tiny, UniformClaimDrafter(), gamma=2), tiny,
                       tiny_prompt, n_tokens=3, settings=dict(temperature=1.0), samples=1000, seed=0)
print(wrong)
assert not wrong.passed
results["lying about q, T=1.0"] = wrong

# %%
names = list(results)
fig, ax = plt.subplots(figsize=(7, 3.2))
ax.bar(names, [results[n].total_variation for n in names], color=["tab:green"] * (len(names) - 1) + ["tab:red"],
       label="speculative samples")
ax.plot(names, [results[n].reference_tv for n in names], "k_", ms=30, mew=2,
        label="a perfect sampler, same number of samples")
ax.set_ylabel("total variation from the target")
ax.set_title("FollowerDrafter: exact when honest about q, biased when not")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Your turn
#
# Change `propose` (a longer n-gram, a lookup table built from the prompt, a small model of your
# own), keep returning the q each token was really drawn from (or `None` if nothing was sampled),
# and rerun the checks. If greedy output ever differs from the target's, or `check_lossless`
# fails, the drafter breaks the guarantee; if both pass, only the speed changes:
# `python benchmark.py --drafters ...` measures it for the built-in drafters.
