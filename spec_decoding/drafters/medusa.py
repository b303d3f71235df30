"""Medusa heads (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with
Multiple Decoding Heads"): K small heads on the target's own last feature guess the next K tokens.

The target's head reads its feature at position t and predicts token t + 1. Medusa head k reads
the same feature and predicts token t + 1 + k. At the start of a round the sequence's last token
was chosen by the target (from its feature one position back) and not fed yet, so heads 1..K on
that feature propose the K tokens after it, all at once: no autoregressive draft loop, one tiny
forward per round. The heads never see the token the target just chose, nor each other's guesses:
that is why their accuracy falls quickly with k, and what EAGLE (spec_decoding/drafters/eagle.py) fixes.

Each head, on the target's ln_f(feature) x [n_embd]:

    x + SiLU(W1 x + b1)      a residual block; W1 and b1 start at zero, so it starts as x
    W_out (...)              an output layer [V, n_embd], a copy of the target's wte

GPT-2 ties its output head to the token embedding (logits = x @ wte.T). By default each head gets
its own copy of wte, untied: trained, it learns to read the same x as a guess k tokens further
ahead, which one shared readout could not do for K different offsets at once. Starting from the
copy, an untrained head predicts what the target's head predicts (token t + 1), a sensible first
guess for t + 2. Medusa-1 makes the same choice. The copies are big (K x V x n_embd), and a round
reads all of them: at small widths the readout is most of a head's cost, and K matrices the size
of the target's head read in turn stay in no cache (docs/feature_drafters.md measures it).

shared_readout=True is the other choice (DeepSeek-V3's multi-token-prediction modules share the
main model's output head the same way): every head reads out through the target's own wte, and
only the residual blocks are trained. A head then costs one small block plus a matrix the target
reads anyway, and it trains faster; the block alone must move x to where the target's readout
finds token t + 1 + k.

Lossless sampling: head k's token is drawn from q_k = its softmax after the same temperature,
top-k and top-p as the target, independently of the other heads' draws, so q_k is exactly the
distribution it was drawn from given the tokens before it, and propose() returns it. (Medusa's
"typical acceptance" is not lossless; this project keeps exact rejection sampling.)

The target's features come from the generators (Drafter.observe_target_features): the heads cost
nothing of the target. In the first round the prompt has not been fed, no feature exists yet, and
the round is a plain target step.

Medusa's token tree (propose_tree, for spec_decoding.algorithms.tree.tree_speculative_sampling): head d's
candidates fill depth d of the tree, branching[d - 1] of them under every node of depth d - 1. The
heads read one feature only, so every node of a depth gets the same candidates (the tree is
the product of the heads' top-k): still one small forward per round, and the target checks all
the combinations in its one forward. branching_from_accuracies shapes the tree from the heads'
top-k accuracies the trainer measured (config.json's head_accuracies).
"""

import itertools

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2 import GPT2
from ..result import ROOT
from ..sampling import logits_to_probs, sample
from .drafter import FeatureDrafter
from .token_tree import TokenTree, tree_size


def branching_from_accuracies(head_accuracies, max_nodes: int) -> tuple[int, ...]:
    """A tree shape for at most max_nodes draft nodes, from measured head accuracies.

    head_accuracies[k][b - 1]: how often head k + 1's top-b holds the true token (the trainer
    measures b = 1..4 on held-out text). Taking heads to be right independently, a tree with b_d
    children per node at depth d reaches depth d with probability prod_{j <= d} acc[j][b_j - 1]
    (greedy: the target's token is among the children at every depth so far), so its expected
    accepted depth is the sum of those products over d. Returns the branching with the largest
    expectation among all with at most max_nodes nodes (ties: the fewer nodes). A budget is needed:
    without one, wider is always better on paper, and every node costs target compute. The
    accuracies are greedy hit rates: the model fits greedy decoding, and under sampling (where
    acceptance is far higher than a top-k hit rate) it undervalues depth.
    """
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1:
        raise ValueError(f"max_nodes must be an int >= 1 (the tree's draft nodes), got {max_nodes!r}")
    best, best_key = None, None
    for depth in range(1, len(head_accuracies) + 1):
        choices = [range(1, len(row) + 1) for row in head_accuracies[:depth]]
        for branching in itertools.product(*choices):
            if tree_size(branching) > max_nodes:
                continue
            expected, reach = 0.0, 1.0
            for row, b in zip(head_accuracies, branching):
                reach *= row[b - 1]
                expected += reach
            key = (expected, -tree_size(branching))
            if best_key is None or key > best_key:
                best, best_key = branching, key
    return best


class MedusaHead(nn.Module):
    """x [..., n_embd] -> logits [..., V]: x + SiLU(W1 x + b1), then the head's own output layer
    (or, without one, the target's wte: shared_readout)."""

    def __init__(self, n_embd: int, vocab_size: int, own_readout: bool = True):
        super().__init__()
        self.w1 = nn.Linear(n_embd, n_embd)
        self.out = nn.Linear(n_embd, vocab_size, bias=False) if own_readout else None
        nn.init.zeros_(self.w1.weight)  # starts as the identity: the block adds nothing yet
        nn.init.zeros_(self.w1.bias)

    def forward(self, x: torch.Tensor, target_head) -> torch.Tensor:
        """x [..., n_embd] -> logits [..., V]. target_head: the target's output head (x -> x @ wte.T),
        the readout of a head without its own."""
        h = x + F.silu(self.w1(x))
        return self.out(h) if self.out is not None else target_head(h)


class MedusaHeads(nn.Module):
    """K Medusa heads for one target. forward(features [..., n_embd], target) -> logits [K, ..., V]:
    head k - 1 (0-based) guesses the token k + 1 places after each feature's position.

    shared_readout: False (Medusa-1) gives each head an untied copy of the target's wte as its
    output layer; True reads every head out through the target's own wte (only the blocks train)."""

    def __init__(self, target: GPT2, num_heads: int, shared_readout: bool = False):
        super().__init__()
        if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
            raise ValueError(f"num_heads must be an int >= 1 (tokens guessed per round), got {num_heads!r}")
        c = target.config
        self.num_heads = num_heads
        self.heads = nn.ModuleList(MedusaHead(c.n_embd, c.vocab_size, own_readout=not shared_readout)
                                   for _ in range(num_heads))
        with torch.no_grad():
            for head in self.heads:
                if head.out is not None:
                    head.out.weight.copy_(target.wte.weight)  # a copy: untied from the target
        self.to(device=target.wpe.weight.device, dtype=target.wpe.weight.dtype)

    @property
    def shared_readout(self) -> bool:
        return self.heads[0].out is None

    def forward(self, features: torch.Tensor, target: GPT2, num_heads: int | None = None) -> torch.Tensor:
        """features: the target's features (before ln_f), read through the target's ln_f (and,
        with shared_readout, its wte). num_heads: run only the first n heads. Returns logits
        [n, ..., V]."""
        x = target.ln_f(features)
        return torch.stack([head(x, target.head) for head in self.heads[:num_heads]])


class MedusaDrafter(FeatureDrafter):
    """Proposes up to K tokens per round, head k's guess for the k-th token after the sequence.

    target: the GPT2 being decoded (only its ln_f is used, and its features through the generators).
    heads: MedusaHeads trained for it (offline/train_drafter.py), or fresh ones.
    """

    def __init__(self, target: GPT2, heads: MedusaHeads):
        super().__init__(target)
        if not isinstance(heads, MedusaHeads):
            raise TypeError(f"heads must be MedusaHeads, got {type(heads).__name__}")
        head = heads.heads[0]
        vocab = head.out.weight.shape[0] if head.out is not None else target.config.vocab_size
        if (vocab, head.w1.weight.shape[1]) != (target.config.vocab_size, target.config.n_embd):
            raise ValueError(f"these Medusa heads output {vocab} tokens from width {head.w1.weight.shape[1]}, "
                             f"the target has {target.config.vocab_size} tokens and width "
                             f"{target.config.n_embd}: they were trained for another target")
        self.heads = heads

    @torch.inference_mode()
    def head_logits(self, tokens: list[int], num_tokens: int) -> torch.Tensor | None:
        """The heads' logits [n, V] for the n <= num_tokens tokens after `tokens`, or None when the
        target has no feature for the position before the last token yet (the first round)."""
        feature = self.last_feature(tokens)
        if feature is None or num_tokens == 0:
            return None
        self.forward_calls += 1  # all heads at once: one small forward
        return self.heads(feature, self.target, min(num_tokens, self.heads.num_heads)).float()

    def propose(self, tokens, num_tokens, temperature=0.0, top_k=None, top_p=None, generator=None):
        logits = self.head_logits(tokens, num_tokens)
        if logits is None:
            return [], None
        if temperature == 0:
            return logits.argmax(dim=-1).tolist(), None
        q = logits_to_probs(logits, temperature, top_k, top_p)  # [n, V], as the target's p
        return sample(q, generator).tolist(), q

    def propose_tree(self, tokens, branching, temperature=0.0, top_k=None, top_p=None, generator=None):
        """The round's token tree: depth d's nodes come from head d, the head propose() uses for
        draft position d (the d-th token after `tokens`). branching[d - 1] children per node of
        depth d - 1; at most K depths (one per head), none in the first round (an empty tree).

        Greedy: a node's children are head d's top-b tokens (distinct), the same under every node.
        Sampling: each node's children are b independent draws from q_d (head d's softmax after
        the target's temperature/top-k/top-p), kept in tree.draft_probs[node]: given the path to
        the node, that is exactly what they were drawn from, as SpecInfer's multi-draft rejection
        sampling (spec_decoding.algorithms.rejection) needs for an exact output. q_d does not depend on the
        path, because the heads never see the tokens drafted before theirs.
        """
        tree = TokenTree(root=tokens[-1])
        logits = self.head_logits(tokens, len(branching))  # [n, V]
        if logits is None:
            return tree
        parents = [ROOT]
        for head_logits, b in zip(logits, branching):
            q = None if temperature == 0 else logits_to_probs(head_logits, temperature, top_k, top_p)
            first_new = len(tree)
            for parent in parents:
                if q is None:
                    children = head_logits.topk(b).indices.tolist()
                else:
                    tree.draft_probs[parent] = q
                    children = sample(q.expand(b, -1), generator).tolist()
                for token in children:
                    tree.add(token, parent)
            parents = list(range(first_new, len(tree)))
        return tree
