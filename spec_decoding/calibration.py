"""Measuring what a round of speculative decoding costs on this machine: the CostModel of the gamma
policies (spec_decoding.policies.costs) and the batch's BatchCostModel, timed on warm KV caches.

calibrate_costs times the calls a round makes (a draft step, the target scoring k tokens, a token
tree, a sampled round) round after round, so a busy machine slows them alike; the policies then
decide from the CostModel handed to them and measure nothing themselves.
"""

import statistics
import time

import torch

from gpt2 import GPT2
from .algorithms.batched import BatchedKVCache, forward_rows
from .algorithms.decoding import check_drafter, target_forward
from .algorithms.rejection import modified_rejection_sampling
from .algorithms.tree import score_tree
from .contracts import check_positive_int
from .drafters import ModelDrafter
from .drafters.token_tree import TokenTree, tree_size
from .policies.costs import BatchCostModel, CostModel, describe_model
from .result import ROOT
from .sampling import logits_to_probs, sample


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that a timer measures the work and not just its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


# Row counts at which calibrate times a draft model's catch-up (CostModel.draft_catch_up_s).
CATCH_UP_ROWS = (16, 64)


# Draws calibrate times together for CostModel.sample_s: one is short beside the clock's own cost.
SAMPLE_DRAWS = 16


@torch.inference_mode()
def calibrate_costs(target: GPT2, draft, gamma_max: int = 8, context_len: int = 128,
                    budget_s: float = 3.0, min_rounds: int = 3, max_rounds: int = 30, trees=()) -> CostModel:
    """Time, on warm KV caches holding context_len tokens: one draft step, and the target
    scoring k = 1 .. gamma_max + 1 new tokens. Every call is rolled back afterwards, so all
    see the same context; the calls take turns round after round, so a busy machine slows
    them alike; each cost is the median over the rounds after the first (warm-up).
    Runs at least min_rounds + 1 rounds and stops after budget_s seconds (or max_rounds).

    draft: a GPT2, or any drafter with start/propose/roll_back (spec_decoding.drafters).
    trees: token-tree shapes, e.g. [(2, 2, 1)], whose verification (the target scoring the
    tree's root and every node under its tree mask, spec_decoding.tree.score_tree) is timed
    in the same rounds.
    """
    if isinstance(gamma_max, bool) or not isinstance(gamma_max, int) or gamma_max < 1:
        raise ValueError(f"gamma_max must be an int >= 1, got {gamma_max!r}")
    device = target.wpe.weight.device
    context_len = max(1, min(context_len, target.config.n_positions - gamma_max - 2))
    g = torch.Generator().manual_seed(0)
    vocab = target.config.vocab_size
    if isinstance(draft, GPT2):
        vocab = min(vocab, draft.config.vocab_size)
        context_len = min(context_len, draft.config.n_positions - 2)
    else:
        check_drafter(target, draft)  # a mismatched pair: the generators' clear error, not torch's
        vocab = min(vocab, draft.vocab_size or vocab)
        context_len = min(context_len, (draft.n_positions or context_len + 2) - 2)
    context = torch.randint(vocab, (context_len,), generator=g).tolist()

    target_cache = target.new_kv_cache(max_len=context_len + gamma_max + 1,
                                       extra_slots=max([tree_size(b) for b in trees], default=0))
    _, features = target(torch.tensor([context], device=device), target_cache, num_last_logits=1,
                         return_features=True)
    draft_step = _draft_stepper(draft, context, device, features[0])

    def target_score(k):
        new = torch.randint(vocab, (1, k), generator=g).to(device)
        target(new, target_cache, num_last_logits=k)
        target_cache.truncate(context_len)

    def tree_score(branching):  # the root (the context's last token) and the nodes, in one forward
        target_cache.truncate(context_len - 1)
        score_tree(target, target_cache, random_tree(branching, vocab, g), context)
        target_cache.truncate(context_len)

    # Each call is timed after what precedes it in decoding: a plain step after a plain step
    # (untimed), a verification after a draft step.
    def draft_once():
        draft_step(int(torch.randint(vocab, (), generator=g)))

    calls = [("plain before", lambda: target_score(1)), (1, lambda: target_score(1))]
    for k in range(2, gamma_max + 2):
        calls += [("draft", draft_once), (k, lambda k=k: target_score(k))]
    calls += [(tuple(b), lambda b=b: tree_score(b)) for b in trees]
    catch_up = _draft_catch_up(draft, context, device)
    n_positions = draft.config.n_positions if isinstance(draft, GPT2) else draft.n_positions
    catch_up_rows = [n for n in CATCH_UP_ROWS
                     if catch_up is not None and context_len + n + 1 <= (n_positions or context_len + n + 1)]
    calls += [(f"catch-up {n}", lambda n=n: catch_up(torch.randint(vocab, (n,), generator=g).tolist()))
              for n in catch_up_rows]
    logits_row = torch.randn(target.config.vocab_size, generator=g).to(device)
    g_sample = torch.Generator(device=device).manual_seed(0)
    calls += [("sample", lambda: [sample(logits_to_probs(logits_row, 1.0), g_sample)
                                  for _ in range(SAMPLE_DRAWS)])]
    if isinstance(draft, GPT2):
        calls += [("sampled round", _sampled_round(target, target_cache, draft, context, g_sample))]
    times = {name: [] for name, _ in calls}
    start, rounds = time.perf_counter(), 0
    while rounds <= min_rounds or (time.perf_counter() - start < budget_s and rounds <= max_rounds):
        for name, call in calls:
            synchronize(device)
            t0 = time.perf_counter()
            call()
            synchronize(device)
            if rounds > 0:  # round 0 warms up
                times[name].append(time.perf_counter() - t0)
        rounds += 1
    median = {name: statistics.median(t) for name, t in times.items()}
    sample_s = median["sample"] / SAMPLE_DRAWS
    # what a sampled round of g = 1 took beyond its forwards and its three distributions
    round_extra = median["sampled round"] - (median["draft"] + median[2] + 3 * sample_s) \
        if "sampled round" in median else 0.0
    return CostModel(target=describe_model(target), draft=describe_model(draft),
               draft_step_s=median["draft"],
               target_score_s=[median[k] for k in range(1, gamma_max + 2)],
               context_len=context_len, rounds=rounds - 1,
               notes={"threads": torch.get_num_threads(), "device": str(device)},
               tree_score_s={",".join(map(str, b)): median[tuple(b)] for b in trees},
               draft_catch_up_s={str(n): median[f"catch-up {n}"] for n in catch_up_rows},
               sample_s=sample_s, sampled_round_extra_s=max(0.0, round_extra))


def random_tree(branching, vocab_size: int, generator) -> TokenTree:
    """A tree of the given shape with random tokens (the verification cost does not depend on them)."""
    tree, parents = TokenTree(root=0), [ROOT]
    for b in branching:
        parents = [tree.add(int(torch.randint(vocab_size, (), generator=generator)), parent)
                   for parent in parents for _ in range(b)]
    return tree


def _sampled_round(target: GPT2, target_cache, draft: GPT2, context: list[int], generator):
    """A function that runs one sampled round of g = 1 as speculative_sampling runs it (the draft
    proposes a token with its q, the target scores it, the rows become p, the verdict), then rolls
    both caches back to `context`. The target's cache holds `context` already."""
    drafter = ModelDrafter(draft)
    drafter.start(context, 4)

    def one_round():
        tokens = context + [int(torch.randint(draft.config.vocab_size, (), generator=generator,
                                              device=generator.device))]  # a GPU's generator draws there
        draft_tokens, draft_probs = drafter.propose(tokens, 1, 1.0, None, None, generator)
        target_probs = logits_to_probs(target_forward(target, target_cache, tokens, draft_tokens), 1.0)
        modified_rejection_sampling(target_probs, draft_probs, draft_tokens, generator)
        target_cache.truncate(len(context))
        drafter.roll_back(len(context))
    return one_round


def _draft_stepper(draft, context: list[int], device, target_features=None):
    """A function that makes the draft propose one token after context + [token], then forgets it:
    one draft step at a fixed context. target_features [len(context), C]: the target's features of
    the context, handed to the drafter as the generators do (a feature drafter drafts from them)."""
    if isinstance(draft, GPT2):
        cache = draft.new_kv_cache(max_len=len(context) + 2)
        draft(torch.tensor([context], device=device), cache, num_last_logits=1)

        def step(token):
            draft(torch.tensor([[token]], device=device), cache, num_last_logits=1)
            cache.truncate(len(context))
        return step
    draft.start(context, 2)
    if target_features is not None:
        draft.observe_target_features(0, target_features)
    draft.propose(context, 1)

    def step(token):
        draft.propose(context + [token], 1)
        draft.roll_back(len(context))
    return step


def _draft_catch_up(draft, context: list[int], device):
    """For a draft model (a GPT2, or a drafter running one: ModelDrafter, LayerSkipDrafter), a
    function that makes it propose one token after context + tokens, all of `tokens` unseen (one
    forward over them), then forgets them: a probe's catch-up. None for other drafters (a
    model-free one has nothing to catch up)."""
    if isinstance(draft, GPT2):
        draft = ModelDrafter(draft)
    elif not isinstance(draft, ModelDrafter):
        return None
    draft.start(context, max(CATCH_UP_ROWS) + 2)
    draft.propose(context, 1)

    def catch_up(tokens):
        draft.propose(context + tokens, 1)
        draft.roll_back(len(context))
    return catch_up


@torch.inference_mode()
def calibrate_batch_costs(target: GPT2, draft: GPT2, max_rows: int, context_len: int = 128,
                          repeats: int = 3) -> BatchCostModel:
    """Time one forward of n rows (n sequences, one new token each, context_len tokens in each
    one's cache) in the target and in the draft, for n = 1, 2, 4, ... up to max_rows. Round after
    round every n takes its turn in both models, so a busy machine slows them alike; each cost is
    the median over `repeats` rounds after two warm-up rounds. A forward over B sequences of
    gamma + 1 new tokens each costs about what one over B * (gamma + 1) rows costs (the same
    weights, as many rows of arithmetic)."""
    check_positive_int("max_rows", max_rows)
    rows = sorted({min(1 << i, max_rows) for i in range(max_rows.bit_length() + 1)})
    device = target.wpe.weight.device
    context_len = max(1, min(context_len, target.config.n_positions - 2, draft.config.n_positions - 2))
    g = torch.Generator().manual_seed(0)
    vocab = min(target.config.vocab_size, draft.config.vocab_size)
    context = torch.randint(vocab, (1, context_len), generator=g).to(device)
    models = {"target": target, "draft": draft}
    caches = {}
    for role, model in models.items():
        # One sequence's cache copied to max_rows rows (timing does not depend on the values);
        # n rows use the first n of them.
        one = model.new_kv_cache(max_len=context_len)
        model(context, one, num_last_logits=1)
        full = model.new_kv_cache(max_rows, max_len=context_len + 1)
        for dst, src in zip(full.keys + full.values, one.keys + one.values):
            dst[:, :, :context_len] = src
        for n in rows:
            cache = BatchedKVCache(full)
            cache.keys, cache.values = [k[:n] for k in full.keys], [v[:n] for v in full.values]
            cache.lengths = torch.full((n,), context_len, dtype=torch.long, device=device)
            caches[role, n] = cache
    times = {key: [] for key in caches}
    for i in range(repeats + 2):
        for n in rows:
            for role, model in models.items():
                cache = caches[role, n]
                tokens = torch.randint(vocab, (n, 1), generator=g).tolist()
                synchronize(device)
                t0 = time.perf_counter()
                forward_rows(model, cache, tokens)
                synchronize(device)
                if i > 1:  # the first rounds set up each shape's kernels
                    times[role, n].append(time.perf_counter() - t0)
                cache.lengths.fill_(context_len)
    median = {key: statistics.median(t) for key, t in times.items()}
    return BatchCostModel(describe_model(target), describe_model(draft), rows,
                          [median["target", n] for n in rows], [median["draft", n] for n in rows],
                          context_len, notes={"threads": torch.get_num_threads(), "device": str(device),
                                              "repeats": repeats})
