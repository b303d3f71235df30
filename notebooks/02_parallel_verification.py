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
# # 2. Verifying gamma draft tokens in one forward pass
#
# One round of (greedy) speculative decoding:
#
# 1. the **draft** proposes gamma tokens, one cheap forward each;
# 2. the **target** scores the prefix + all gamma tokens in **one** forward pass;
# 3. draft tokens are kept while they equal the target's own choice; the target's token replaces
#    the first mismatch (or is a bonus token when all gamma match).
#
# This notebook follows the tensors through one round.

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
# ## Step 1: the draft proposes gamma tokens
#
# Greedy here (its argmax), one forward per token on the draft's own KV cache: the first forward
# feeds the prompt, each later one only the token just proposed.

# %%
GAMMA = 4
prompt_ids = encode_prompt(PROMPT, VOCAB)
L = len(prompt_ids)
print(f"prompt: {L} tokens")

draft_cache = draft.new_kv_cache(max_len=L + GAMMA + 1)
draft_tokens = []
x = torch.tensor([prompt_ids], device=DEVICE)  # first step: the whole prompt
with torch.inference_mode():
    for i in range(GAMMA):
        logits = draft(x, draft_cache, num_last_logits=1)  # [1, 1, V]: only the last row is needed
        token = int(logits[0, -1].argmax())
        draft_tokens.append(token)
        print(f"draft step {i}: input {tuple(x.shape)} -> logits {tuple(logits.shape)}, "
              f"proposes {label(token):>14}   (draft cache length {draft_cache.length})")
        x = torch.tensor([[token]], device=DEVICE)  # next step: just the new token

# %% [markdown]
# ## Step 2: the target scores them all at once
#
# As in `spec_decoding`, the target's cache holds the sequence *except its last token*, so the
# verification input is that last token followed by the gamma draft tokens: gamma + 1 tokens at
# positions L-1 .. L+gamma-1. With `num_last_logits=gamma+1` the output is `[1, gamma+1, V]`:
#
# * row i (i < gamma) is the target's prediction after prompt + `draft_tokens[:i]`: it **verifies
#   `draft_tokens[i]`**;
# * row gamma comes after all gamma draft tokens: it gives the **next token** if every draft token
#   is accepted (the bonus).
#
# The causal mask is what makes this one forward equal to gamma + 1 separate steps: each query sees
# the cached prefix and the verification tokens up to itself, never the ones after it.

# %%
target_cache = target.new_kv_cache(max_len=L + GAMMA + 1)
with torch.inference_mode():
    target(torch.tensor([prompt_ids[:-1]], device=DEVICE), target_cache)  # prefill: prompt minus its last token
    print("target cache after prefill:", target_cache.length)
    verify_in = torch.tensor([prompt_ids[-1:] + draft_tokens], device=DEVICE)  # [1, gamma + 1]
    verify_logits = target(verify_in, target_cache, num_last_logits=GAMMA + 1)  # [1, gamma + 1, V]
print("verification input ", tuple(verify_in.shape))
print("verification logits", tuple(verify_logits.shape))
print("target cache after verification:", target_cache.length)
target_choice = verify_logits[0].argmax(dim=-1).tolist()  # [gamma + 1]: the target's argmax per row

# The attention mask of this forward: queries = the gamma + 1 new positions, keys = all positions.
positions = torch.arange(L - 1, L + GAMMA)
keys = torch.arange(L + GAMMA)
mask = keys[None, :] <= positions[:, None]
fig, ax = plt.subplots(figsize=(8, 2.2))
ax.imshow(mask, cmap="Blues", aspect="auto")
ax.axvline(L - 1.5, color="red", lw=1)
ax.set_yticks(range(GAMMA + 1), [f"pos {p}" for p in positions.tolist()])
ax.set_xlabel(f"key position (left of the red line: the {L - 1} cached prefix positions)")
ax.set_title("Who attends to whom in the verification forward (blue = allowed)")
plt.show()

# %% [markdown]
# ## Step 3: accept the longest matching prefix
#
# Draft token i is accepted if it equals the target's argmax in row i, as long as all before it
# were. The round outputs the accepted tokens plus the target's token of the first row that was
# not matched (a correction), or of row gamma (a bonus).

# %%
n = 0
while n < GAMMA and draft_tokens[n] == target_choice[n]:
    n += 1
accepted = draft_tokens[:n] + [target_choice[n]]

W = 16  # column width
print(f"{'row':>3} {'position':>8}  {'fed to target':>{W}} {'draft token':>{W}} {'target argmax':>{W}}  verdict")
for i in range(GAMMA + 1):
    if i < GAMMA:
        draft_tok = label(draft_tokens[i])
        verdict = ("accepted" if i < n else
                   "rejected: the target's token replaces it" if i == n else
                   "discarded (after a rejection)")
    else:
        draft_tok = "-"
        verdict = "bonus token: all gamma accepted" if n == GAMMA else "unused"
    print(f"{i:>3} {L - 1 + i:>8}  {label(verify_in[0, i].item()):>{W}} {draft_tok:>{W}} "
          f"{label(target_choice[i]):>{W}}  {verdict}")
print(f"\n{n} of {GAMMA} draft tokens accepted; this round outputs {len(accepted)} token(s) "
      f"for one target forward: {[label(t) for t in accepted]}")

# Roll back what was rejected: keep the accepted sequence minus its last token (fed next round).
target_cache.truncate(L + len(accepted) - 1)
print("target cache rolled back to", target_cache.length)

# %% [markdown]
# ## Checks
#
# 1. The verification logits equal what the target gives one token at a time.
# 2. `spec_decoding.speculative_sampling_greedy` produces exactly these tokens in its first round.
# 3. They are exactly the target's own greedy tokens: greedy speculative decoding changes the speed,
#    never the output.

# %%
from spec_decoding import autoregressive_generate, Observers, speculative_sampling_greedy

# 1. One token at a time.
one_cache = target.new_kv_cache(max_len=L + GAMMA + 1)
with torch.inference_mode():
    rows = [target(torch.tensor([prompt_ids], device=DEVICE), one_cache)[0, -1]]
    for t in draft_tokens:
        rows.append(target(torch.tensor([[t]], device=DEVICE), one_cache)[0, -1])
one_at_a_time = torch.stack(rows)  # [gamma + 1, V]
print(f"max |verification - one at a time| = {(verify_logits[0] - one_at_a_time).abs().max().item():.2e}")
torch.testing.assert_close(verify_logits[0].float(), one_at_a_time.float(), rtol=1e-4, atol=1e-4)

# 2. The library's first round (on_tokens is called after each round).
rounds = []
result = speculative_sampling_greedy(target, draft, prompt_ids, max_gen=GAMMA + 1, gamma=GAMMA,
                                     observers=Observers(on_tokens=lambda tokens, sources: rounds.append((tokens, sources))))
first_tokens, first_sources = rounds[0]
print("library, round 1:", [label(t) for t in first_tokens], first_sources)
assert first_tokens == accepted

# 3. The target alone, greedy.
alone = autoregressive_generate(target, prompt_ids, max_gen=len(accepted))
print("target alone:    ", [label(t) for t in alone.tokens])
assert alone.tokens == accepted
print("all checks passed")

# %% [markdown]
# ## Why it pays: a forward of gamma + 1 tokens costs about as much as one
#
# Generating one token is limited by reading the weights, not by arithmetic, so feeding a few more
# tokens in the same forward is nearly free. Measured on this machine (tiny test checkpoints are
# dominated by Python overhead; on a GPU the curve is flatter still). A timing on a shared CPU is
# noisy, so: one thread for all (threads waiting for each other on a busy core would make the
# curve about the machine's load), the sizes take turns round after round (a busy moment slows them
# alike), and each point is a median. When the same call still varies too much, the cell says so
# instead of drawing a curve it cannot vouch for.

# %%
import statistics
import time

from gpt2.speed.device import synchronize
from gpt2.speed.machine_load import busy_note

sizes = range(1, 9)
times = {k: [] for k in sizes}
threads = torch.get_num_threads()
torch.set_num_threads(1)
with torch.inference_mode():
    cache = target.new_kv_cache(max_len=L + max(sizes))
    target(torch.tensor([prompt_ids], device=DEVICE), cache)
    for round_ in range(16):
        for k in sizes:
            chunk = torch.tensor([draft_tokens[:1] * k], device=DEVICE)
            synchronize(torch.device(DEVICE))
            t0 = time.perf_counter()
            target(chunk, cache, num_last_logits=k)
            synchronize(torch.device(DEVICE))
            if round_ > 0:  # round 0 warms up
                times[k].append(time.perf_counter() - t0)
            cache.truncate(L)  # roll back after each timing
torch.set_num_threads(threads)
ms = [1e3 * statistics.median(times[k]) for k in sizes]
q1, _, q3 = statistics.quantiles(times[1], n=4)
spread = (q3 - q1) / statistics.median(times[1])  # how much one call's time varies, relative
if spread > 0.25:
    print(f"This machine is too noisy to show the curve: one 1-token forward took between "
          f"{1e3 * q1:.1f} and {1e3 * q3:.1f} ms (middle half of {len(times[1])} runs). "
          f"{busy_note('torch.set_num_threads(1)') or 'Other programs are using the CPU.'} "
          f"Run this cell again when the machine is quieter.")
else:
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot(list(sizes), [m / ms[0] for m in ms], marker="o")
    ax.set_xlabel("tokens per target forward (gamma + 1)")
    ax.set_ylabel("time / time of 1 token")
    ax.set_title(f"Target forward cost ({ms[0]:.1f} ms for 1 token, 1 thread, medians)")
    plt.show()
