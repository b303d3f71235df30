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
# # 8. Drafters that read the target's mind: Medusa heads and EAGLE
#
# Every drafter needs *knowledge* of what the target will say next. Where does it come from?
#
# | drafter | its knowledge | cost of a draft token |
# |---|---|---|
# | `ModelDrafter` | a second, smaller model trained on the same kind of text | one forward of the small model |
# | `NGramDrafter` | the prompt itself: what followed these tokens before | nothing |
# | `LayerSkipDrafter` | the target's own first layers | a fraction of a target step |
# | `MedusaDrafter` | the target's **last feature**, read by K small trained heads | one tiny head |
# | `EagleDrafter` | the target's **features**, extrapolated by one trained block | one block + the head |
#
# The last two read the residual stream the target already computed while verifying the previous
# round (`GPT2.forward(..., return_features=True)`): the generators hand it to the drafter
# (`Drafter.observe_target_features`) at no extra target cost. Medusa head k guesses token t+1+k
# straight from the feature at t; EAGLE predicts the *next feature* from [token embedding ;
# feature] and reads it out through the target's own `ln_f` and head, running on its own
# predictions within a round.
#
# Both are trained offline on the frozen target's features (`python -m offline.train_drafter`).
# Here we train each for a few seconds (the docs page, `docs/feature_drafters.md`, has longer
# runs and the benchmark), then compare acceptance by position with the other drafters. Exactness
# never depends on the training: `tests/test_feature_drafters.py` proves it with untrained ones.

# %%
# Finds the project, reads the switch (GPT2_TARGET, GPT2_DRAFT, DEVICE): see notebook_setup.py.
from notebook_setup import DEVICE, DRAFT, TARGET, encode_prompt, load_pair

import os
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch
# %matplotlib inline

from offline.train_pair import TrainSettings
from offline.train_drafter import train_drafter
from spec_decoding import SamplingParams, speculative_sampling
from spec_decoding.drafters import LayerSkipDrafter, ModelDrafter, NGramDrafter
from spec_decoding.drafters.feature_files import load_feature_drafter

torch.manual_seed(0)
target, draft = load_pair()

# %% [markdown]
# ## Train the two feature drafters (seconds)
#
# `MEDUSA_DIR` / `EAGLE_DIR` point at drafters trained for this target (longer runs); otherwise a
# few training steps here, on a few standard-library modules (the trainer's default corpus is all
# of them, which takes longer to read than these steps take). Medusa's loss is
# sum_k 0.8^k CE_k; EAGLE's SmoothL1(feature) + 0.1 CE. The held-out loss before and after is
# measured on 8 windows of held-out text here (the trainer's default is 32: a few steps barely
# move it, and measuring over more would take longer than training).

# %%
import sysconfig

STEPS = int(os.environ.get("DRAFTER_STEPS", "5"))
stdlib = Path(sysconfig.get_paths()["stdlib"])
texts = [str(stdlib / name) for name in ("argparse.py", "textwrap.py", "string.py", "shlex.py", "difflib.py")]
workdir = Path(tempfile.mkdtemp(prefix="feature-drafters-"))
folders = {}
for kind, variable, options in (("medusa", "MEDUSA_DIR", dict(num_heads=3)), ("eagle", "EAGLE_DIR", {})):
    if os.environ.get(variable):
        folders[kind] = Path(os.environ[variable])
        continue
    settings = TrainSettings(steps=STEPS, batch_size=2, learning_rate=3e-3, warmup_steps=3, seed=0)
    os.environ["TRAIN_PAIR_PROGRESS"] = "0"
    _, info = train_drafter(TARGET, kind, workdir / kind, texts, settings, log=lambda *a: None, eval_windows=8,
                            **options)
    print(f"{kind}: {info['steps']} steps in {info['seconds']:.0f} s, held-out loss "
          f"{info['held_out_loss']['before']:.3f} -> {info['held_out_loss']['after']:.3f}")
    folders[kind] = workdir / kind
    if kind == "medusa":
        print("  head top-1 accuracy:", ", ".join(f"t+{k + 2}: {a[0]:.0%}" for k, a in enumerate(info["head_accuracies"])))

# %% [markdown]
# ## Acceptance by position, side by side
#
# Each drafter drafts up to gamma = 3 tokens per round at temperature 1 on the same code prompts;
# position i's acceptance is how often the i-th draft token was accepted when it was drafted.
# Medusa has 3 heads, so it never drafts more than 3.

# %%
GAMMA = 3
drafters = {
    "model (1 x 32 draft)": ModelDrafter(draft),
    "ngram:3": NGramDrafter(3),
    "layerskip:1": LayerSkipDrafter(target, 1),
    "medusa": load_feature_drafter(folders["medusa"], target, "medusa"),
    "eagle": load_feature_drafter(folders["eagle"], target, "eagle"),
}
prompts = [encode_prompt(text, target.config.vocab_size) for text in
           ("import os\n\n\ndef ", "class Parser:\n    def __init__(self, text):\n        self.")]
by_position, per_call = {}, {}
for name, drafter in drafters.items():
    drafted, accepted, tokens, calls = [0] * GAMMA, [0] * GAMMA, 0, 0
    for i, prompt in enumerate(prompts):
        result = speculative_sampling(target, drafter, prompt, 24, GAMMA,
                                      sampling=SamplingParams(temperature=1.0, generator=torch.Generator().manual_seed(i)))
        s = result.stats
        for k in range(min(GAMMA, len(s.drafted_by_position))):
            drafted[k] += s.drafted_by_position[k]
            accepted[k] += s.accepted_by_position[k]
        tokens, calls = tokens + len(result.tokens), calls + s.target_calls
    by_position[name] = [a / d if d else float("nan") for a, d in zip(accepted, drafted)]
    per_call[name] = tokens / calls
    print(f"{name:22} acceptance by position {[round(x, 2) for x in by_position[name]]}, "
          f"{per_call[name]:.2f} tokens per target call")

# %%
fig, ax = plt.subplots(figsize=(7, 4))
for name, values in by_position.items():
    ax.plot(range(1, GAMMA + 1), values, marker="o", label=f"{name} ({per_call[name]:.2f} tok/call)")
ax.set_xlabel("draft position in the round")
ax.set_ylabel("acceptance (temperature 1)")
ax.set_xticks(range(1, GAMMA + 1))
ax.set_ylim(0, 1)
ax.set_title("Where the drafter's knowledge comes from shows in its acceptance")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# What to read in it (on a pair trained for seconds, as in the tests, the numbers move a lot):
#
# * Medusa's heads never see the token the target just sampled, nor each other's guesses: their
#   acceptance falls fast with the position. That is the gap EAGLE closes by reading the sampled
#   token's embedding next to the feature and running on its own predicted features.
# * The first round of a feature drafter is always a plain target step: no feature exists before
#   the target has read the prompt.
# * Whatever the acceptance, the output is exactly the target's distribution: the drafters return
#   the q they really drew from, and the modified rejection sampling does the rest.

# %% [markdown]
# ## Two design choices to try
#
# **Medusa's readout.** Each head has its own copy of `wte` as its output layer by default
# (Medusa-1). `MedusaHeads(target, K, shared_readout=True)` (`--shared-readout` in the trainer)
# reads every head out through the target's own `wte` instead, as DeepSeek-V3's
# multi-token-prediction modules share the main model's head: only the small blocks train. On a
# small target the readout is most of a head's cost, and K private copies read in turn stay in no
# cache, so sharing it makes a round of drafts much cheaper.
#
# **EAGLE's training-time test.** During a round EAGLE reads its own predicted features. The
# trainer's `--unroll K` trains drafting steps 1..K at every position of a window at once: step
# k + 1 at position i reads step k's prediction at i - 1 and attends to what a round would have in
# its cache. Below, the mask for a window of 5 positions and 3 steps (rows: queries, pass by pass;
# columns: keys, pass by pass; 1 = may attend). A test checks that it predicts exactly what the
# drafter predicts step by step on its KV cache.
#
# Both, measured on the default trained pair, are in docs/feature_drafters.md.

# %%
from offline.train_drafter import training_time_test_mask

print(training_time_test_mask(5, 3).int())
