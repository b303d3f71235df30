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
# # 5. Token trees: several draft continuations in one target forward
#
# A chain of gamma draft tokens dies at its first rejection: if the draft's first choice at step 2
# is wrong, everything it drafted after it is wasted. A **token tree** keeps several candidates per
# step, and the target checks *every node* in one forward pass. This is how SpecInfer (Miao et al.
# 2023), Medusa and EAGLE get their speed-ups. The code is `spec_decoding/algorithms/tree.py`.
#
# One round, for `branching = (2, 2, 1)`: the root is the sequence's last token; it gets 2 children,
# each of those 2, each of those 1: 2 + 4 + 4 = 10 draft nodes.
#
# 1. the **draft** builds the tree level by level, one forward per depth (all nodes of a depth at once);
# 2. the **target** scores the root and all 10 nodes in **one** forward. Two tricks make this exact:
#    each node sits at position `root + depth`, and a **tree attention mask** lets it attend only to
#    the sequence and its own ancestors, never to its cousins;
# 3. walking down from the root, the target accepts the longest path it agrees with, then adds one
#    token of its own;
# 4. both KV caches keep only the accepted path (`KVCache.keep`).

# %% [markdown]
# ## Which models? One switch
#
# The first code cell reads a few environment variables. Set them before starting Jupyter, e.g.
# `GPT2_TARGET=gpt2-xl GPT2_DRAFT=gpt2 jupyter lab`:
#
# | variable | default | meaning |
# |---|---|---|
# | `GPT2_TARGET` | `gpt2-large` | the **target**: the big model whose output we want |
# | `GPT2_DRAFT` | `gpt2` | the **draft**: the small model that proposes tokens |
# | `DEVICE` | `cuda` if available, else `cpu` | where the models run |
#
# Offline, point both at local files. The project's tests run these notebooks on tiny
# random-weight checkpoints, so the text they print is gibberish; the shapes, the checks and the
# logic are the same as with the real GPT-2.
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


prompt = encode_prompt(PROMPT, VOCAB)
print(f"prompt: {len(prompt)} tokens; the root of the tree is its last token, {label(prompt[-1])}")

# %% [markdown]
# ## Step 1: the draft builds the tree, one forward per depth
#
# Greedy here: a node's children are the draft's **top-b** tokens after the path to it. The first
# draft forward reads the prompt (the root last); each later one feeds *all* nodes of one depth at
# once, under the same tree mask the target will use. Nodes are numbered level by level.

# %%
from spec_decoding.algorithms.tree import (build_draft_tree, keep_accepted_path, score_tree, tree_attention_mask,
                                           verify_tree_greedy)
from spec_decoding.drafters.token_tree import tree_size

BRANCHING = (2, 2, 1)
print(f"branching {BRANCHING}: {tree_size(BRANCHING)} nodes")

draft_cache = draft.new_kv_cache(extra_slots=tree_size(BRANCHING))
with torch.inference_mode():
    tree = build_draft_tree(draft, draft_cache, prompt, BRANCHING)

print(f"{'node':>4} {'parent':>6} {'depth':>5}  token")
for i, (token, parent, depth) in enumerate(zip(tree.tokens, tree.parents, tree.depths)):
    print(f"{i:>4} {('root' if parent < 0 else parent):>6} {depth:>5}  {label(token)}")
print(f"\nthe draft's cache holds {draft_cache.length} entries: the prompt and the "
      f"{draft_cache.length - len(prompt)} nodes above the deepest level (it never reads the leaves)")

# %% [markdown]
# ## Step 2: the tree attention mask
#
# Row = a token being scored, column = a token it may attend to (besides the whole sequence before
# the root, which every node sees). A node sees itself and its ancestors: the mask of a chain would
# be the usual lower triangle; a tree's is that triangle with the cousins cut out.

# %%
mask = tree_attention_mask(tree.parents)  # [N + 1, N + 1]; slot 0 is the root
names = ["root"] + [f"{i}:{label(t)}" for i, t in enumerate(tree.tokens)]
fig, ax = plt.subplots(figsize=(6.5, 5.5))
ax.imshow(mask, cmap="Greens")
ax.set_xticks(range(len(names)), names, rotation=90, fontsize=8)
ax.set_yticks(range(len(names)), names, fontsize=8)
ax.set_title(f"tree attention mask, branching {BRANCHING} (green: may attend)")
plt.tight_layout()
plt.show()
print("positions:", [len(prompt) - 1 + d for d in [0] + tree.depths], "(siblings share one)")

# %% [markdown]
# ## Step 3: the target scores every node in one forward
#
# `score_tree` feeds the root and all nodes with explicit positions and that mask
# (`GPT2.forward(..., positions=, attn_mask=)`). Row 0 of the logits is the target's next-token
# prediction after the root, row 1 + i after node i. Each row must equal what a plain forward over
# that node's path gives: let us check every one.

# %%
target_cache = target.new_kv_cache(extra_slots=tree_size(BRANCHING))
with torch.inference_mode():
    target.forward(torch.tensor([prompt[:-1]], device=DEVICE), target_cache)  # the sequence before the root
    target_logits = score_tree(target, target_cache, tree, prompt)  # [N + 1, V], one forward
print("one target forward:", tuple(target_logits.shape))


def path_to(node: int) -> list[int]:
    path = []
    while node >= 0:
        path.insert(0, node)
        node = tree.parents[node]
    return path


with torch.inference_mode():
    worst = 0.0
    for node in range(-1, len(tree)):
        sequence = prompt + tree.path_tokens(path_to(node))
        plain = target(torch.tensor([sequence], device=DEVICE))[0, -1]
        worst = max(worst, (plain - target_logits[node + 1]).abs().max().item())
print(f"largest difference to a plain forward over each path: {worst:.2e}")
assert worst < 1e-3

# %% [markdown]
# ## Step 4: which path does the target accept?
#
# From the root down: is one of the children the target's own argmax there? Then move to it. The
# first node where none is ends the path, and the target's argmax there is the round's last token.
# Exactly the tokens the target alone would have produced, greedily.

# %%
verdict = verify_tree_greedy(tree, target_logits)
path, next_token = verdict.path, verdict.next_token
print("accepted path:", [f"{i}:{label(tree.tokens[i])}" for i in path], "then the target's", label(next_token))


def draw_tree(ax, tree, path):
    """Nodes by depth (x) and leaf order (y); the accepted path in green."""
    y = {}
    leaves = [i for i in range(len(tree)) if not tree.children(i)]
    for k, leaf in enumerate(leaves):
        y[leaf] = -k
    for i in reversed(range(len(tree))):  # a parent sits at the mean height of its children
        if i not in y:
            y[i] = sum(y[c] for c in tree.children(i)) / len(tree.children(i))
    y[-1] = sum(y[c] for c in tree.children(-1)) / len(tree.children(-1))
    on_path = set(path) | {-1}
    for i, parent in enumerate(tree.parents):
        x0 = 0 if parent < 0 else tree.depths[parent]
        colour = "tab:green" if i in on_path and parent in on_path else "lightgray"
        ax.plot([x0, tree.depths[i]], [y[parent], y[i]], color=colour, lw=3 if colour != "lightgray" else 1)
    ax.text(0, y[-1], label(tree.root), ha="center", va="center", bbox=dict(fc="white", ec="black"))
    for i, token in enumerate(tree.tokens):
        ec = "tab:green" if i in on_path else "gray"
        ax.text(tree.depths[i], y[i], f"{i}: {label(token)}", ha="center", va="center", fontsize=9,
                bbox=dict(fc="honeydew" if i in on_path else "white", ec=ec))
    last = path[-1] if path else -1
    x_last = tree.depths[last] if path else 0
    ax.annotate(f"target: {label(next_token)}", (x_last, y[last]), (x_last + 0.6, y[last] - 0.4),
                arrowprops=dict(arrowstyle="->", color="tab:orange"), color="tab:orange")
    ax.set_xlim(-0.5, len(BRANCHING) + 1.2)
    ax.set_xlabel("depth")
    ax.set_yticks([])


fig, ax = plt.subplots(figsize=(8, 4.5))
draw_tree(ax, tree, path)
ax.set_title(f"one tree round: {len(path)} draft tokens accepted + 1 from the target, one target forward")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Step 5: keep only the accepted path in the caches
#
# The caches hold the sequence and then every node, in tree order. `KVCache.keep` moves the
# accepted nodes' keys and values down to follow the root, so the caches hold exactly the accepted
# sequence, as if it had been fed as a chain. A fresh forward over that sequence must give the
# same keys.

# %%
seq_len = len(prompt)
keep_accepted_path(target_cache, draft_cache, seq_len, path)
accepted = prompt + tree.path_tokens(path)
fresh = target.new_kv_cache()
with torch.inference_mode():
    target(torch.tensor([accepted], device=DEVICE), fresh)
diff = max((target_cache.keys[l][:, :, :len(accepted)] - fresh.keys[l][:, :, :len(accepted)]).abs().max().item()
           for l in range(target.config.n_layer))
print(f"target cache: {target_cache.length} entries (= {len(accepted)} accepted tokens); "
      f"largest difference to a fresh forward: {diff:.1e}")
assert target_cache.length == len(accepted) and diff < 1e-4

# %% [markdown]
# ## A whole generation: trees against chains
#
# `tree_speculative_sampling` repeats these rounds. Greedy, its output is the target's own. At the
# same depth, a tree keeps more tokens per target call than a chain, for more verification width.
# Whether that pays in wall time depends on how much more the wider target forward costs: see the
# token-tree benchmark in docs/performance.md.

# %%
from spec_decoding import (GREEDY, autoregressive_generate, Observers, SamplingParams,
                           speculative_sampling_greedy, tree_speculative_sampling)

N = 40
reference = autoregressive_generate(target, prompt, N).tokens
runs = {"chain, gamma 3": speculative_sampling_greedy(target, draft, prompt, N, 3)}
for branching in [(1, 1, 1), (2, 1, 1), (2, 2, 1), (4, 2, 1)]:
    runs[f"tree {branching}"] = tree_speculative_sampling(target, draft, prompt, N, branching, sampling=GREEDY)
print(f"{'':16} {'same as target':>14} {'tokens/call':>11} {'nodes/call':>10}")
for name, result in runs.items():
    s = result.stats
    assert result.tokens == reference
    print(f"{name:16} {'yes':>14} {s.tokens_per_target_call:11.2f} {s.nodes_per_target_call:10.1f}")

# %% [markdown]
# ## Sampling: SpecInfer's multi-draft rejection sampling
#
# With temperature > 0 a node's children are independent draws from q. The target tries them one
# after the other: child x is accepted with probability min(1, r(x)/q(x)), starting from r = p;
# after each rejection, **r becomes norm(max(0, r - q))**. If all are rejected the token is drawn
# from the final r. Each try is one step of ordinary speculative sampling with target r, which
# outputs exactly r (Leviathan et al.'s theorem) as long as what follows a rejection outputs
# norm(max(0, r - q)), and by the same argument the remaining tries do. So the node outputs
# exactly p. Testing every child against the unchanged p instead gives a token the draft likes b
# chances: too many acceptances. Below, both rules on one small p and q, 6000 times each.

# %%
from spec_decoding.sampling import sample
from spec_decoding.algorithms.rejection import MultiDraftVerdict, multi_draft_rejection_sampling, residual_distribution

g = torch.Generator().manual_seed(0)
p = torch.tensor([0.45, 0.25, 0.15, 0.10, 0.05])
q = torch.tensor([0.10, 0.50, 0.20, 0.05, 0.15])


def naive(p, q, children, generator):  # the bug: every child against the unchanged p
    for i, x in enumerate(children):
        if torch.rand((), generator=generator) * q[x] < p[x]:
            return MultiDraftVerdict(i, None, [], [], p)
    return MultiDraftVerdict(None, int(sample(residual_distribution(p, q), generator)), [], [], p)


counts = {}
for name, rule in (("SpecInfer", multi_draft_rejection_sampling), ("naive", naive)):
    out = []
    for _ in range(6000):
        children = sample(q.expand(3, -1), g).tolist()
        verdict = rule(p, q, children, g)
        out.append(children[verdict.accepted] if verdict.accepted is not None else verdict.next_token)
    counts[name] = torch.bincount(torch.tensor(out), minlength=5) / 6000

fig, ax = plt.subplots(figsize=(7, 3.5))
x = torch.arange(5)
for k, (name, values) in enumerate([("p (target)", p), ("q (draft)", q), ("SpecInfer, 3 children", counts["SpecInfer"]),
                                    ("naive, 3 children", counts["naive"])]):
    ax.bar(x + 0.2 * k - 0.3, values, width=0.2, label=name)
ax.set_xticks(x, [f"token {i}" for i in range(5)])
ax.legend()
ax.set_title("output of one node: SpecInfer's rule follows p, the naive one drifts towards q")
plt.tight_layout()
plt.show()
print("SpecInfer - p:", (counts["SpecInfer"] - p).abs().max().item(), " naive - p:", (counts["naive"] - p).abs().max().item())

# %% [markdown]
# ## Every round of a tree run, on one page
#
# `Observers(trace=True)` records each round's tree: every node with p(x) and q(x) at its parent, the
# target it was tested against after its elder siblings were rejected (p'), min(1, p'/q), the
# uniform draw and the verdict, then the accepted path and the target's own token. The page draws
# each tree left to right (accepted green, rejected struck through, never judged grey); hover or
# click a node for its numbers. `python spec_decoding_generate.py --tree 2,2,1 --html runs/trace.html`
# writes the same page.

# %%
from IPython.display import HTML, display

from spec_decoding.result import FROM_DRAFT_BRANCH
from spec_decoding.presentation.trace_page import iframe_html

result = tree_speculative_sampling(target, draft, prompt, 24, (2, 2, 1),
                                   sampling=SamplingParams(temperature=1.0, generator=torch.Generator().manual_seed(0)),
                                   observers=Observers(trace=True))
side = result.stats.token_sources.count(FROM_DRAFT_BRANCH)
print(f"{len(result.trace.rounds)} rounds, {result.stats.nodes_verified} nodes verified, "
      f"{side} tokens accepted from a side branch")
display(HTML(iframe_html(result.trace, height=650, pair=f"target {TARGET}, draft {DRAFT}")))
