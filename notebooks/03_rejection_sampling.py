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
# # 3. Speculative *sampling*: modified rejection sampling
#
# With sampling (temperature > 0) a draft token x, drawn from q, is accepted with probability
# min(1, p(x) / q(x)). If it is rejected, the replacement is drawn from the **residual**
# norm(max(0, p - q)). The token that comes out is then distributed exactly as p:
#
# * P(x drawn and accepted) = q(x) min(1, p(x)/q(x)) = **min(p(x), q(x))**
# * P(rejection) = 1 - sum min(p, q) = sum max(0, p - q), so
#   P(rejected, then x) = **max(0, p(x) - q(x))**
# * total: min(p, q) + max(0, p - q) = **p**.
#
# The acceptance probability alpha = sum min(p, q) only sets the speed, never the distribution.

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

# %%
# Finds the project, reads the switch (GPT2_TARGET, GPT2_DRAFT, DEVICE): see notebook_setup.py.
from notebook_setup import DEVICE, DRAFT, PROMPT, ROOT, TARGET

import torch
import matplotlib.pyplot as plt
# %matplotlib inline

torch.manual_seed(0)
print(f"target: {TARGET}\ndraft:  {DRAFT}\ndevice: {DEVICE}")

# %%
from notebook_setup import encode_prompt, load_pair, token_label

target, draft = load_pair()  # prints their sizes; checks that they share one vocabulary
VOCAB = target.config.vocab_size


def label(token: int) -> str:  # its text (GPT-2's vocabulary) or #id (a test model's)
    return token_label(token, VOCAB)


# %% [markdown]
# ## p and q after one prompt
#
# Both distributions go through the same `logits_to_probs` (temperature, then top-k), as
# `spec_decoding.speculative_sampling` does. `TOP_K = 50` is GPT-2's classic setting; it also keeps
# the 20,000 draws below quick (set it to `None` for the full vocabulary: the draws get slower and
# fewer).

# %%
from spec_decoding import (logits_to_probs, modified_rejection_sampling, Observers, residual_distribution,
                           SamplingParams)

TEMPERATURE, TOP_K = 1.0, 50
prompt_ids = encode_prompt(PROMPT, VOCAB)
with torch.inference_mode():
    x = torch.tensor([prompt_ids], device=DEVICE)
    p = logits_to_probs(target(x, num_last_logits=1)[0, -1], TEMPERATURE, TOP_K).cpu()  # [V]
    q = logits_to_probs(draft(x, num_last_logits=1)[0, -1], TEMPERATURE, TOP_K).cpu()  # [V]
overlap = torch.minimum(p, q)
residual = residual_distribution(p, q)
alpha = overlap.sum().item()
print(f"p, q: {tuple(p.shape)}; alpha = sum min(p, q) = {alpha:.3f}; TV(p, q) = {1 - alpha:.3f}")

shown = torch.maximum(p, q).topk(20).indices  # the 20 tokens most likely under p or q
shown = shown[p[shown].argsort(descending=True)]
names = [label(t) for t in shown.tolist()]
pos = torch.arange(len(shown))
fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
ax1.bar(pos - 0.2, p[shown], 0.4, label="p (target)")
ax1.bar(pos + 0.2, q[shown], 0.4, label="q (draft)")
ax1.step(pos, overlap[shown], where="mid", color="k", lw=1, label="min(p, q): accepted mass")
ax1.set_ylabel("probability")
ax1.legend()
ax2.bar(pos, residual[shown], 0.6, color="tab:red")
ax2.set_ylabel("norm(max(0, p - q))")
ax2.set_title("residual: where a rejected draft token is replaced")
ax2.set_xticks(pos, names, rotation=60)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## One round, drawn
#
# gamma = 1: the draft samples x from q; `modified_rejection_sampling` accepts it with probability
# min(1, p(x)/q(x)) or resamples from the residual, and returns its `Verdict` (`n_accepted`, `next_token`, the draws). Its `target_probs` has gamma + 1 = 2 rows (row
# 1 would give the bonus token after x; here we only look at the first token, so p is repeated).

# %%
gen = torch.Generator().manual_seed(0)
target_probs = torch.stack([p, p])  # [gamma + 1, V]
for _ in range(8):
    x_tok = int(torch.multinomial(q, 1, generator=gen))
    verdict = modified_rejection_sampling(target_probs, q[None], [x_tok], gen)
    next_tok = verdict.next_token
    outcome = "accepted" if verdict.n_accepted == 1 else f"rejected -> resampled {label(next_tok)} from the residual"
    print(f"draft drew {label(x_tok):>14}: q = {q[x_tok]:.3f}, p = {p[x_tok]:.3f}, "
          f"accept with prob {min(1.0, (p[x_tok] / q[x_tok]).item()):.3f}: {outcome}")

# %% [markdown]
# ## Does the output follow p? Many rounds
#
# Draw N rounds and histogram the first output token (x if accepted, the resampled token if not).
# Tokens with p = q = 0 can never be drawn, so the rounds run on the *support* of p and q only:
# the same computation, much faster.
#
# How close must the histogram be? For N draws from p, the total-variation distance
# TV = 1/2 sum |empirical - p| has mean at most 1/2 sum sqrt(p(1-p)/N), and (McDiarmid's
# inequality) exceeds its mean by more than sqrt(ln(10^6) / 2N) with probability below 10^-6.
# That sum is the bound we assert.

# %%
import math
import time

support = ((p > 0) | (q > 0)).nonzero().squeeze(1)
ps, qs = p[support], q[support]
N = 20_000 if len(support) <= 1_000 else 2_000
gen = torch.Generator().manual_seed(1)
proposals = torch.multinomial(qs, N, replacement=True, generator=gen).tolist()
ps2 = torch.stack([ps, ps])
counts = torch.zeros(len(support))
n_accepted = 0
t0 = time.perf_counter()
for x_tok in proposals:
    verdict = modified_rejection_sampling(ps2, qs[None], [x_tok], gen)
    counts[x_tok if verdict.n_accepted == 1 else verdict.next_token] += 1
    n_accepted += verdict.n_accepted
print(f"{N} rounds on {len(support)} support tokens in {time.perf_counter() - t0:.1f} s")

empirical = counts / N
tv = 0.5 * (empirical - ps).abs().sum().item()
bound = 0.5 * (ps * (1 - ps) / N).sqrt().sum().item() + math.sqrt(math.log(1e6) / (2 * N))
print(f"TV(output, p)  = {tv:.4f}   (bound {bound:.4f})")
print(f"TV(q, p)       = {0.5 * (qs - ps).abs().sum().item():.4f}   (what always accepting the draft would give)")
acc = n_accepted / N
acc_sd = math.sqrt(max(alpha * (1 - alpha), 1e-12) / N)
print(f"acceptance rate = {acc:.4f}, alpha = {alpha:.4f} (+- {acc_sd:.4f})")
assert tv < bound, "the output distribution is not p"
assert abs(acc - alpha) < 6 * acc_sd + 1e-6, "the acceptance rate is not sum min(p, q)"

# %%
top = ps.argsort(descending=True)[:20]
pos = torch.arange(len(top))
fig, ax = plt.subplots(figsize=(10, 3.5))
ax.bar(pos - 0.2, ps[top], 0.4, label="p (target)")
ax.bar(pos + 0.2, empirical[top], 0.4, label=f"speculative sampling, {N} draws")
ax.plot(pos, qs[top], "k_", ms=14, mew=2, label="q (draft)")
ax.set_xticks(pos, [label(t) for t in support[top].tolist()], rotation=60)
ax.set_ylabel("probability")
ax.set_title(f"Output distribution vs p: TV = {tv:.4f}")
ax.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# The histogram follows p, not q, whatever the draft is: a poor draft only lowers alpha, the
# fraction of draft tokens accepted, and with it the speed-up. Notebook 4 turns alpha into a
# predicted speed-up.

# %% [markdown]
# ## A whole generation, round by round
#
# `observers=Observers(trace=True)` records every round: the drafted tokens with p(x), q(x), the acceptance probability
# min(1, p/q) and the uniform draw r it was tested with, the verdict, and the token the target
# added (from the residual after a rejection, from p as a bonus). The same page as
# `python spec_decoding_generate.py --html runs/trace.html`: hover (or click) a token for its numbers.
# With a real pair (GPT-2, or the trained pair offline) you see rejections and residual draws; with
# random-weight stand-ins nearly everything would be accepted.

# %%
from IPython.display import HTML, display

from spec_decoding import speculative_sampling
from spec_decoding.presentation.trace_page import iframe_html

result = speculative_sampling(target, draft, prompt_ids, max_gen=40, gamma=4,
                              sampling=SamplingParams(temperature=1.0, generator=torch.Generator().manual_seed(0)),
                              observers=Observers(trace=True))
trace = result.trace
print(f"{len(trace.rounds)} rounds; alpha = {trace.alpha:.3f}; "
      f"{sum(r.next_source == 'correction' for r in trace.rounds)} rounds ended in a rejection")
display(HTML(iframe_html(trace, height=650, pair=f"target {TARGET}, draft {DRAFT}")))
