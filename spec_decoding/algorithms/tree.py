"""Token trees: the target verifies several draft continuations in one forward pass.

A chain of gamma draft tokens dies at its first rejection. A tree keeps several candidates per
step and the target checks every node at once, so more tokens survive per target call for the
same verification width. This is how SpecInfer (Miao et al. 2023, "SpecInfer: Accelerating Large
Language Model Serving with Tree-based Speculative Inference and Verification", arXiv:2305.09781),
Medusa and EAGLE get their speed-ups. A round, for branching (2, 2, 1):

           root (the sequence's last token)              2 + 4 + 4 = 10 draft nodes
          /                    \\                         depth 1: 2 children of the root
        a                        b                       depth 2: 2 children each
      /   \\                    /   \\                    depth 3: 1 child each
     c     d                  e     f
     |     |                  |     |
     g     h                  i     j

1. The draft builds the tree level by level: one forward per depth feeds all nodes of that depth
   at once (build_draft_tree).
2. The target scores the root and every node in ONE forward (score_tree). Each node attends to
   the sequence before the root and to its own ancestors only (tree_attention_mask), and sits at
   position root + depth, so row i of the target's logits is exactly what the target would give
   after the path root -> ... -> node i, as if that path had been fed as a chain.
3. Walk down from the root, choosing at each node which child (if any) the target accepts
   (verify_tree_greedy, verify_tree_sampling). The accepted path plus one token of the target's
   own is the round's output.
4. Both KV caches keep only the accepted path (KVCache.keep), and the next round starts.

Node i goes into KV-cache slot (root's slot) + 1 + i; siblings share a position but not a slot,
which is why the caches get extra_slots beyond the context window.
"""

import time
from dataclasses import dataclass, field

import torch

from gpt2 import GPT2
from ..caches import forward_new_tokens
from ..contracts import Observers, SamplingParams, check_observers, check_sampling
from ..drafters import Drafter, ModelDrafter
from ..drafters.token_tree import TokenTree, check_branching, tree_size
from ..result import (FROM_BONUS, FROM_CORRECTION, FROM_DRAFT, FROM_DRAFT_BRANCH, FROM_TARGET, ROOT,
                      GenerationResult, RoundReport)
from ..sampling import logits_to_probs, sample
from .decoding import (record_round, round_gamma, round_observers, start_generation,
                       take_tokens)
from .rejection import multi_draft_rejection_sampling


def tree_attention_mask(parents: list[int]) -> torch.Tensor:
    """[N + 1, N + 1] bool over the tree's slots (slot 0: the root, slot 1 + i: node i): True
    where the row's token may attend to the column's, i.e. the column is the row itself or one
    of its ancestors. Built top-down: a node sees what its parent sees, plus itself."""
    n = len(parents)
    mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    mask[0, 0] = True
    for i, parent in enumerate(parents):
        mask[i + 1] = mask[parent + 1]
        mask[i + 1, i + 1] = True
    return mask


def score_tree(model: GPT2, cache, tree: TokenTree, sequence: list[int], first: int = 0,
               return_features: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Feed tree slots first..len(tree) (slot 0: the root, slot 1 + i: node i) in one forward.

    sequence: the tokens so far (its last token is the root, in cache slot root_slot =
    len(sequence) - 1). With first = 0 the forward also feeds, before the root, whatever of the
    sequence the cache has not seen (the prompt, in the first round). With first > 0 the cache
    must hold root_slot + first entries: the sequence and the tree slots fed before.
    Each tree token attends to the sequence before the root and to its ancestors in the tree, at
    position root_slot + depth. Returns logits [len(tree) + 1 - first, V]: row j is the model's
    next-token logits after the path to slot first + j. return_features=True also returns the
    model's features [T, n_embd] of every token fed (GPT2.forward): the pending sequence tokens,
    then the tree slots.
    """
    device = model.wpe.weight.device
    root_slot = len(sequence) - 1
    pending = sequence[cache.length:root_slot] if first == 0 else []
    if first and cache.length != root_slot + first:
        raise ValueError(f"score_tree: the cache holds {cache.length} entries, expected {root_slot + first}")
    slot_tokens, slot_depths = [tree.root] + tree.tokens, [0] + tree.depths
    n_tree = len(tree) + 1 - first  # tree slots fed now
    T = len(pending) + n_tree
    # Causal by slot (right for the pending sequence tokens), then the tree's own mask over the
    # tree's slots: a node sees the sequence, its ancestors and itself, not its cousins.
    query_slots = torch.arange(cache.length, cache.length + T)
    attn_mask = torch.arange(cache.length + T)[None, :] <= query_slots[:, None]
    attn_mask[len(pending):, root_slot:] = tree_attention_mask(tree.parents)[first:]
    positions = query_slots[:len(pending)].tolist() + [root_slot + d for d in slot_depths[first:]]
    idx = torch.tensor([pending + slot_tokens[first:]], device=device)
    if T == 1 and attn_mask.all():
        attn_mask = None  # one token that sees everything: the model's plain path
    else:
        attn_mask = attn_mask.to(device)
    out = model(idx, cache, num_last_logits=n_tree, positions=torch.tensor(positions, device=device),
                attn_mask=attn_mask, return_features=return_features)
    return (out[0][0], out[1][0]) if return_features else out[0]


def build_draft_tree(draft: GPT2, draft_cache, tokens: list[int], branching, temperature: float = 0.0,
                     top_k=None, top_p=None, generator=None) -> TokenTree:
    """The draft's tree for the next round, one draft forward per depth.

    tokens: the sequence so far (its last token is the root). Greedy (temperature 0): a node's
    children are the draft's top-b tokens after it (distinct). Sampling: b independent draws from
    q after it (repeats possible), and q is kept in tree.draft_probs for the verification.
    Afterwards the draft's cache holds the sequence and every node but the deepest ones.
    """
    tree = TokenTree(root=tokens[-1])
    # Depth 0: the draft reads the tokens it has not seen yet, the root last.
    logits = forward_new_tokens(draft, draft_cache, tokens)  # [1, V]: after the root
    parents = [ROOT]
    for depth, b in enumerate(branching, start=1):
        first_new = len(tree)
        for parent, parent_logits in zip(parents, logits):
            if temperature == 0:
                children = parent_logits.topk(b).indices.tolist()
            else:
                q = logits_to_probs(parent_logits, temperature, top_k, top_p)
                tree.draft_probs[parent] = q
                children = sample(q.expand(b, -1), generator).tolist()
            for token in children:
                tree.add(token, parent)
        if depth == len(branching):
            break  # the deepest nodes' children are never drafted: the draft need not read them
        parents = list(range(first_new, len(tree)))
        logits = score_tree(draft, draft_cache, tree, tokens, first=first_new + 1)
    return tree


@dataclass
class TreeVerdict:
    """What the walk down a round's tree decided (and what a trace shows of it)."""

    path: list[int]  # the accepted nodes, from the root down
    next_token: int  # the target's own token after the path: a correction or a bonus
    draws: dict = field(default_factory=dict)  # sampling: node -> the uniform draw it was tested with
    adjusted_p: dict = field(default_factory=dict)  # sampling: node -> p'(x), the target it faced
    next_distribution: torch.Tensor | None = None  # sampling: [V] what next_token was drawn from


def verify_tree_greedy(tree: TokenTree, target_logits: torch.Tensor) -> TreeVerdict:
    """target_logits [N + 1, V]: row 0 after the root, row 1 + i after node i.

    Walk down from the root while one of the children is the target's own argmax there (the
    children are distinct, so at most one is). The verdict's path and next_token are exactly what
    the target's greedy decoding would have produced, token by token."""
    choice = target_logits.argmax(dim=-1).tolist()
    path, node = [], ROOT
    while True:
        match = [c for c in tree.children(node) if tree.tokens[c] == choice[node + 1]]
        if not match:
            return TreeVerdict(path, choice[node + 1])
        node = match[0]
        path.append(node)


def verify_tree_sampling(tree: TokenTree, target_probs: torch.Tensor, generator=None) -> TreeVerdict:
    """target_probs [N + 1, V]: p after the root (row 0) and after each node (row 1 + i).

    From the root down: run multi-draft rejection sampling over the node's children; move to the
    accepted child, or stop with the token drawn from the residual. At a leaf, the bonus token is
    drawn from p there. Each output token follows p given the tokens before it, so the round's
    output follows the target's distribution (the tree below a rejected child is never used).
    The verdict also keeps, for every node judged, its draw and the target p'(x) it faced.
    """
    verdict = TreeVerdict([], -1)
    node = ROOT
    while True:
        children = tree.children(node)
        p = target_probs[node + 1]
        if not children:  # a leaf: the bonus token, from p there
            verdict.next_token, verdict.next_distribution = int(sample(p, generator)), p
            return verdict
        step = multi_draft_rejection_sampling(p, tree.draft_probs[node], tree.path_tokens(children), generator)
        verdict.draws.update(zip(children, step.uniforms))  # the children tried, in order: a prefix
        verdict.adjusted_p.update(zip(children, step.adjusted_p))
        if step.accepted is None:
            verdict.next_token, verdict.next_distribution = step.next_token, step.residual
            return verdict
        node = children[step.accepted]
        verdict.path.append(node)


def keep_accepted_path(target_cache, draft_cache, seq_len: int, path: list[int]) -> None:
    """After a round both caches hold the sequence before the round (seq_len tokens, the root
    last; the draft may hold fewer) and then tree nodes. Keep only the accepted nodes, moved down
    to follow the root: the caches then hold the accepted sequence minus its last token, as a
    chain's would. Node i sits in slot seq_len + i. The draft never read the deepest nodes, so
    it keeps those of the path it has. draft_cache None: a drafter without one (propose_tree)."""
    target_cache.keep(seq_len, [seq_len + i for i in path])
    if draft_cache is not None and draft_cache.length >= seq_len:  # the draft drafted this round
        draft_cache.keep(seq_len, [seq_len + i for i in path if seq_len + i < draft_cache.length])


def output_sources(tree: TokenTree, path: list[int], depth: int) -> list[str]:
    """FROM_DRAFT for an accepted node that was its parent's first child (what a chain would have
    drafted), FROM_DRAFT_BRANCH for one from a side branch (where a chain would have stopped);
    then the source of the target's own token."""
    sources = [FROM_DRAFT if tree.children(tree.parents[i])[0] == i else FROM_DRAFT_BRANCH for i in path]
    if depth == 0:
        return sources + [FROM_TARGET]  # nothing drafted: a plain target step
    return sources + [FROM_BONUS if len(path) == depth else FROM_CORRECTION]


def draft_model(draft) -> GPT2:
    """Token trees need a drafter that builds its own trees (one with a propose_tree method, like
    MedusaDrafter) or a draft model to score a tree level by level with full forwards: a GPT2,
    or the model of a ModelDrafter that drafts with that whole model (other Drafters propose
    chains only). A LayerSkipDrafter's model is the whole target: drafting a tree with it would
    silently draft with the target itself, so it is refused like any drafter that computes its
    logits another way (one that overrides next_logits)."""
    if isinstance(draft, ModelDrafter) and type(draft).next_logits is ModelDrafter.next_logits:
        return draft.model
    if isinstance(draft, GPT2):
        return draft
    raise TypeError(f"tree_speculative_sampling needs the draft as a GPT2 model (or a ModelDrafter of "
                    f"one) or a drafter with a propose_tree method, got {type(draft).__name__}: it scores "
                    f"the tree with the draft model's full forward, which this drafter does not draft "
                    f"with, and it builds no trees itself. Use it with speculative_sampling (a chain), "
                    f"or pass a separate draft model.")


@torch.inference_mode()
def tree_speculative_sampling(target: GPT2, draft: GPT2 | ModelDrafter | Drafter, prefix, max_gen: int,
                              branching, sampling: SamplingParams = SamplingParams(),
                              eos_id: int | None = None, observers: Observers | None = None) -> GenerationResult:
    """Speculative decoding with a token tree: each round the draft builds a tree with
    branching[d] children per node at depth d + 1 (one draft forward per depth), the target
    scores all its nodes in one forward, and the longest acceptable path plus one target token
    is the output.

    sampling: SamplingParams(temperature, top_k, top_p, generator). temperature 0: children are
    the draft's top-b; the output is identical to the target's greedy
    decoding. temperature > 0: children are independent draws from q, verified by SpecInfer's
    multi-draft rejection sampling; the output follows the target's distribution exactly.
    branching (1,) * gamma is the chain of speculative_sampling, with the same random draws.

    draft: a draft model (GPT2 or ModelDrafter), drafted with build_draft_tree; or a Drafter with
    its own propose_tree(tokens, branching, temperature, top_k, top_p, generator) -> TokenTree
    (spec_decoding/drafters/medusa.py), whose tree may be shallower than asked (even empty). Either way the
    drafter is handed the target's features of the accepted path (observe_target_features).

    prefix: list of ints or 1-D LongTensor. Stops at eos_id (kept), exactly max_gen new tokens,
    or a full context window (no model is fed a position >= its n_positions: near the end the
    tree is cut to fewer depths).
    Stats: as the chains, counting depths as positions (tokens_drafted: depths drafted,
    acceptance_by_position: per depth), plus nodes_verified and accepted_depths per round.
    observers: Observers(on_tokens, on_round, trace): on_tokens(tokens, sources) after each round;
    on_round(report) gets every round as a RoundReport (spec_decoding.result), with the tree and its
    TreeVerdict; trace=True records every round's tree in result.trace
    (spec_decoding.presentation.trace: each node's p, q, draw and verdict, the accepted path, the
    target's token).
    """
    sampling = check_sampling(sampling)
    observers = check_observers(observers)
    temperature, top_k, top_p = sampling.filters
    generator = sampling.generator
    branching = check_branching(branching, target.config.vocab_size)
    n_nodes = tree_size(branching)
    if hasattr(draft, "propose_tree"):
        drafter, draft = draft, None  # it builds its own trees
    else:
        # A ModelDrafter for its checks, limits and cache (with a slot per node): the tree then
        # drives the draft model itself.
        draft = draft_model(draft)
        drafter = ModelDrafter(draft, extra_slots=n_nodes)
    tokens, target_cache, stats = start_generation(target, drafter, prefix, max_gen, len(branching),
                                                   extra_slots=n_nodes)
    draft_cache = drafter.cache if draft is not None else None  # a propose_tree drafter keeps its own state
    notify, round_trace = round_observers(observers, tokens, len(branching), sampling, branching)
    out = []
    start = time.perf_counter()
    stop = None
    while not stop:
        seq_len = len(tokens)
        depth = round_gamma(len(branching), len(out), max_gen, seq_len, target, drafter)

        # 1. The draft builds the tree, one forward per depth (none: a plain target step).
        tree = TokenTree(root=tokens[-1])
        if depth and draft is None:
            tree = drafter.propose_tree(tokens, branching[:depth], temperature, top_k, top_p, generator)
            depth = max(tree.depths, default=0)
        elif depth:
            tree = build_draft_tree(draft, draft_cache, tokens, branching[:depth], temperature,
                                    top_k, top_p, generator)

        # 2. The target scores the root and every node in one forward: logits [N + 1, V].
        fed_from = target_cache.length
        target_logits, features = score_tree(target, target_cache, tree, tokens, return_features=True)

        # 3. The accepted path and the target's own next token.
        target_probs = None
        if temperature == 0:
            verdict = verify_tree_greedy(tree, target_logits)
        else:
            target_probs = logits_to_probs(target_logits, temperature, top_k, top_p)
            verdict = verify_tree_sampling(tree, target_probs, generator)
        path = verdict.path
        # The drafter sees the target's features of the sequence fed before the root, the root,
        # and the accepted path: the positions that stay the sequence.
        n_before = seq_len - fed_from  # the pending sequence tokens and the root
        drafter.observe_target_features(fed_from, torch.cat([features[:n_before], features[n_before:][path]]))
        draft_calls = drafter.forward_calls if draft is None else stats.draft_calls + depth
        record_round(stats, depth, len(path), draft_calls, n_nodes=len(tree))
        stop = take_tokens(tokens, out, stats, tree.path_tokens(path) + [verdict.next_token],
                           output_sources(tree, path, depth), eos_id, max_gen,
                           target.config.n_positions, observers.on_tokens)
        if notify:
            notify(RoundReport(tree.tokens, target_logits, len(path), verdict.next_token, len(out),
                               temperature, target_probs, None, verdict, tree))

        # 4. Both caches keep the accepted path only (and the drafter the sequence but its last token).
        keep_accepted_path(target_cache, draft_cache, seq_len, path)
        drafter.roll_back(len(tokens) - 1)
    stats.stop_reason = stop
    stats.seconds = time.perf_counter() - start
    return GenerationResult(out, stats, round_trace)
