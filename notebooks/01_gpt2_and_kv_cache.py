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
# # 1. GPT-2 and its KV cache
#
# Speculative decoding rests on two properties of a decoder-only transformer:
#
# 1. one forward pass over T tokens gives the next-token logits after *every* prefix (T rows),
# 2. with a **KV cache**, a forward pass only has to process the new tokens, and the cache can be
#    **rolled back** cheaply when some of those tokens turn out to be wrong.
#
# This notebook checks both on the hand-written GPT-2 in `gpt2/`.

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

# %% [markdown]
# ## Load GPT-2
#
# All GPT-2 sizes share one architecture, so this notebook needs only one model: the draft
# (`GPT2_DRAFT`, GPT-2 small with 124M parameters by default).
#
# `load_gpt2` returns the model exactly as `gpt2/model.py` is written: step into `model(idx)` and
# you are in `GPT2.forward`, every linear layer an `nn.Linear`, float32 weights. Speed is a separate,
# visible step (`gpt2.speed.accelerate(model)`, which the scripts take and name in their load
# lines); this notebook is about the model, so it leaves it plain.

# %%
from gpt2 import load_gpt2

model = load_gpt2(DRAFT, device=DEVICE)
cfg = model.config
print(cfg)
print(f"{model.num_parameters() / 1e6:.1f}M parameters, head_dim = {cfg.head_dim}")

from gpt2 import decode
from notebook_setup import encode_prompt, token_label

VOCAB = model.config.vocab_size
GPT2_VOCAB = VOCAB == 50257


def label(token: int) -> str:  # its text (GPT-2's vocabulary) or #id (a test model's)
    return token_label(token, VOCAB)


# %% [markdown]
# ## One forward pass: token ids in, logits out
#
# `model(idx)` takes token ids of shape `[B, T]` (batch, positions) and returns logits
# `[B, T, V]`: row t scores every vocabulary entry as the token at position t + 1. Generation
# needs only the last row; speculative decoding will use several.

# %%
ids = encode_prompt("The quick brown fox jumps over the", VOCAB)
idx = torch.tensor([ids], device=DEVICE)  # [B, T]
with torch.inference_mode():
    logits = model(idx)  # [B, T, V]
print("idx   ", tuple(idx.shape), "= [batch, positions]")
print("logits", tuple(logits.shape), "= [batch, positions, vocabulary]")

probs = torch.softmax(logits[0, -1], dim=-1)  # the next-token distribution after the prompt
top = probs.topk(10)
fig, ax = plt.subplots(figsize=(8, 3))
ax.bar([label(t) for t in top.indices.tolist()], top.values.cpu())
ax.set_ylabel("probability")
ax.set_title("Next token after the prompt (last row of the logits)")
ax.tick_params(axis="x", rotation=45)
plt.show()

# %% [markdown]
# ## The KV cache
#
# In attention, the token at position t needs the keys and values of positions 0..t. Those of
# earlier positions never change, so we keep them: `model.new_kv_cache()` allocates, per layer,
# a key and a value buffer of shape `[B, n_head, max_len, head_dim]`. A forward pass with the cache
# writes the new tokens' keys and values at positions `[length, length + T)` and moves `length`
# forward by T.

# %%
cache = model.new_kv_cache(max_len=64)
print(cache)
with torch.inference_mode():
    prefill_logits = model(idx, cache)  # the whole prompt in one forward
print(f"after the prompt: cache.length = {cache.length}")
for layer in range(min(3, cfg.n_layer)):
    k = cache.keys[layer][:, :, :cache.length]
    v = cache.values[layer][:, :, :cache.length]
    print(f"layer {layer}: keys {tuple(k.shape)}, values {tuple(v.shape)}   [B, n_head, positions, head_dim]")
print(f"... {cfg.n_layer} layers in all")
mib = sum(t.numel() * t.element_size() for t in cache.keys + cache.values) / 2**20
print(f"memory for max_len={cache.max_len}: {mib:.2f} MiB")

# %% [markdown]
# ### Cached decoding gives the same logits as recomputing everything
#
# Decode greedily, one token per forward (input `[1, 1]`), reading only the cache for the past.
# Then run the whole sequence again *without* a cache and compare the logits at the same positions.
# In float32 they agree to about 1e-5.

# %%
N_NEW = 16
seq = list(ids)
cached_rows = [prefill_logits[0, -1]]  # logits after the prompt
with torch.inference_mode():
    for _ in range(N_NEW):
        seq.append(int(cached_rows[-1].argmax()))  # greedy
        step = model(torch.tensor([[seq[-1]]], device=DEVICE), cache)  # ONE token in: [1, 1] -> [1, 1, V]
        cached_rows.append(step[0, -1])
    full = model(torch.tensor([seq], device=DEVICE))[0]  # no cache: every position again, [T, V]

cached = torch.stack(cached_rows)  # [N_NEW + 1, V]: after the prompt, then after each new token
uncached = full[len(ids) - 1:]  # the same positions
print("cached", tuple(cached.shape), " uncached", tuple(uncached.shape), " cache.length", cache.length)
print(f"max |cached - uncached| = {(cached - uncached).abs().max().item():.2e}")
torch.testing.assert_close(cached.float(), uncached.float(), rtol=1e-4, atol=1e-4)
print("generated:", decode(seq[len(ids):]) if GPT2_VOCAB else seq[len(ids):])

# %% [markdown]
# ### What the cache saves
#
# Without a cache, decoding the next token reprocesses all t positions; with it, one. Time both at
# a few sequence lengths: the gap grows with the length. Two things keep the timing honest on a
# laptop doing other work: one PyTorch thread (two threads wait on each other whenever another
# program holds a core, which swamps everything else), and the fastest of a few repeats of each
# measurement (other programs only ever add time). With tiny test checkpoints both lines are mostly
# Python overhead.

# %%
import time


def fastest_ms(run, repeats: int = 5) -> float:
    """The fastest of `repeats` calls of run(), in milliseconds."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return 1e3 * best


LENGTHS = [n for n in (8, 32, 128, 256, 512, 1024) if n <= model.config.n_positions]
threads = torch.get_num_threads()
torch.set_num_threads(1)
times = {"no cache": [], "KV cache": []}
with torch.inference_mode():
    for n in LENGTHS:
        seq = torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(n)).to(DEVICE)
        cache = model.new_kv_cache(max_len=n)
        model(seq[:, :-1], cache)  # the cache holds all but the last token
        times["no cache"].append(fastest_ms(lambda: model(seq)))  # all n positions again

        def one_step():  # the last token only, then back: the cache holds n - 1 again
            model(seq[:, -1:], cache)
            cache.truncate(n - 1)
        times["KV cache"].append(fastest_ms(one_step))
torch.set_num_threads(threads)

fig, ax = plt.subplots(figsize=(6, 3))
for name, ms in times.items():
    ax.plot(LENGTHS, ms, marker=".", label=name)
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("sequence length (positions)")
ax.set_ylabel("ms for the next token")
ax.set_title("one thread, fastest of 5")
ax.legend()
plt.show()

# %% [markdown]
# ## Rolling back: `cache.truncate()`
#
# Speculative decoding feeds the target tokens that may be rejected. Afterwards the cache must
# forget them. `cache.truncate(n)` just moves `length` back to n (O(1): nothing is copied; the
# stale entries are overwritten by the next forward). Check: feed tokens A, roll back, feed
# different tokens B, and compare with a fresh forward over prompt + B.

# %%
A = encode_prompt(" lazy dog and ran", VOCAB)[:4] if GPT2_VOCAB else [20, 21, 22, 23]
B = encode_prompt(" sleeping cat", VOCAB)[:3] if GPT2_VOCAB else [30, 31, 32]

cache = model.new_kv_cache(max_len=64)
with torch.inference_mode():
    model(idx, cache)
    L = cache.length
    model(torch.tensor([A], device=DEVICE), cache)
    print(f"prompt: length {L}; after feeding A: {cache.length}")
    cache.truncate(L)
    print(f"after cache.truncate({L}): {cache.length}")
    rolled_back = model(torch.tensor([B], device=DEVICE), cache)[0]  # [len(B), V]
    fresh = model(torch.tensor([ids + B], device=DEVICE))[0, -len(B):]  # no cache, never saw A
    # For contrast: what B's logits look like if A is *not* forgotten.
    stale = model(torch.tensor([ids + A + B], device=DEVICE))[0, -len(B):]

print(f"max |rolled back - fresh|    = {(rolled_back - fresh).abs().max().item():.2e}")
print(f"max |with A kept - fresh|    = {(stale - fresh).abs().max().item():.2e}  (A would leak in)")
torch.testing.assert_close(rolled_back.float(), fresh.float(), rtol=1e-4, atol=1e-4)

# %% [markdown]
# Both properties hold. The next notebook uses them: the draft proposes a few tokens, and the
# target checks all of them in **one** forward on its cache, then rolls back what it rejects.
