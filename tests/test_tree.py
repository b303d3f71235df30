"""Token trees (spec_decoding/algorithms/tree.py): greedy output identical to the target's own, sampled output
distributed exactly as the target's (exact enumeration + chi-square, with the power to reject the
naive multi-draft variant), caches equal to a fresh forward after every round, eos, max_gen and
the context-window edge, and the chain as the special case branching (1, ..., 1)."""

from functools import partial

import pytest
import torch
from conftest import AGREEING_TARGET, TINY, TINY_VOCAB

import spec_decoding.algorithms.tree as tree_module
from gpt2 import GPT2, load_gpt2
from offline.random_weights import save_random_checkpoint
from spec_decoding import (GREEDY, autoregressive_generate, logits_to_probs, Observers,
                           residual_distribution, SamplingParams, speculative_sampling,
                           speculative_sampling_greedy, tree_speculative_sampling)
from spec_decoding.result import FROM_BONUS, FROM_CORRECTION, FROM_DRAFT, FROM_DRAFT_BRANCH
from spec_decoding.drafters import LayerSkipDrafter, ModelDrafter
from spec_decoding.checks import (cache_difference, check_stopping, chi_square_p_value, counts_of,
                                  exact_distribution)
from spec_decoding.sampling import sample
from spec_decoding.algorithms.rejection import MultiDraftVerdict, multi_draft_rejection_sampling
from spec_decoding.algorithms.tree import tree_attention_mask, verify_tree_sampling
from spec_decoding.drafters.token_tree import TokenTree, tree_size

TARGET_CFG = AGREEING_TARGET  # pair_dirs, target, draft: conftest.py
PROMPT = [5, 17, 42, 8, 99, 3]
BRANCHINGS = [(1,), (3,), (2, 2, 1), (1, 1, 1, 1), (4, 2)]


class ConstantDraft(GPT2):
    """A draft whose every top choice is the same token (the target never agrees with it)."""

    token = 0

    def forward(self, idx, cache=None, num_last_logits=None, **tree_args):
        logits = super().forward(idx, cache, num_last_logits, **tree_args)
        return torch.full_like(logits, -1e4).index_fill_(-1, torch.tensor([self.token]), 1e4)


@pytest.fixture(scope="module")
def baseline(target):
    return autoregressive_generate(target, PROMPT, 40).tokens


# ---------------------------------------------------------------- the tree itself

def test_tree_size_and_mask():
    assert [tree_size(b) for b in [(1,), (3,), (2, 2, 1), (1, 1, 1, 1), (3, 1, 1)]] == [1, 3, 10, 4, 9]
    # (2, 1): nodes a, b under the root, then a' under a and b' under b
    mask = tree_attention_mask([-1, -1, 0, 1]).int()
    assert mask.tolist() == [[1, 0, 0, 0, 0],  # root
                             [1, 1, 0, 0, 0],  # a sees root, itself
                             [1, 0, 1, 0, 0],  # b: not a
                             [1, 1, 0, 1, 0],  # a': root, a, itself
                             [1, 0, 1, 0, 1]]  # b'
    # a chain's tree mask is the causal mask
    assert torch.equal(tree_attention_mask([-1, 0, 1]), torch.ones(4, 4, dtype=torch.bool).tril())


def test_draft_tree_layout(draft):
    """The tree has the requested shape, and greedy children are the draft's own top-b after the
    path to their parent (checked against a plain forward over each path)."""
    cache = draft.new_kv_cache(extra_slots=10)
    with torch.inference_mode():
        tree = tree_module.build_draft_tree(draft, cache, PROMPT, (2, 2, 1))
        assert len(tree) == 10 and tree.depths == [1, 1, 2, 2, 2, 2, 3, 3, 3, 3]
        assert tree.parents == [-1, -1, 0, 0, 1, 1, 2, 3, 4, 5]
        assert cache.length == len(PROMPT) + 6  # the depth-3 leaves were never fed
        for node in range(-1, 6):
            path, n = [], node
            while n != -1:
                path.insert(0, tree.tokens[n])
                n = tree.parents[n]
            logits = draft(torch.tensor([PROMPT + path]))[0, -1]
            b = 2 if node < 2 else 1
            assert tree.path_tokens(tree.children(node)) == logits.topk(b).indices.tolist()


# ---------------------------------------------------------------- greedy: identical to the target

@pytest.mark.parametrize("branching", BRANCHINGS)
def test_greedy_tree_equals_target_greedy(target, draft, baseline, branching):
    result = tree_speculative_sampling(target, draft, PROMPT, 40, branching, sampling=GREEDY)
    assert result.tokens == baseline
    s = result.stats
    assert s.stop_reason == "max_gen" and s.tokens_generated == 40
    accepted = s.token_sources.count(FROM_DRAFT) + s.token_sources.count(FROM_DRAFT_BRANCH)
    assert accepted == s.tokens_accepted == sum(s.accepted_depths)
    # every target call gives exactly one token of its own
    assert s.tokens_generated - accepted == s.target_calls
    assert s.draft_calls == s.tokens_drafted  # one draft forward per depth
    # rounds that drafted depth d + 1, times the nodes at that depth
    widths = [torch.tensor(branching[:d + 1]).prod().item() for d in range(len(branching))]
    assert s.nodes_verified == sum(r * w for r, w in zip(s.drafted_by_position, widths))
    assert max(s.accepted_depths) <= len(branching)
    assert s.rejections == s.token_sources.count(FROM_CORRECTION)
    if branching[0] > 1:  # side branches saved rounds a chain would have lost
        assert s.token_sources.count(FROM_DRAFT_BRANCH) > 0
    else:
        assert s.token_sources.count(FROM_DRAFT_BRANCH) == 0


def test_greedy_tree_verifies_more_tokens_per_call_than_the_chain(target, draft):
    """At the same depth a wider tree keeps more tokens per target call than a chain; nodes
    verified per call are the tree's size (the last, shortened rounds aside)."""
    chain = tree_speculative_sampling(target, draft, PROMPT, 40, (1, 1), sampling=GREEDY).stats
    tree = tree_speculative_sampling(target, draft, PROMPT, 40, (4, 4), sampling=GREEDY).stats
    assert tree.tokens_per_target_call > chain.tokens_per_target_call
    assert tree.nodes_per_target_call > 10 and chain.nodes_per_target_call <= 2


@pytest.mark.parametrize("branching", [(2,), (2, 2, 1), (1, 1, 1)])
def test_greedy_when_draft_is_target_accepts_everything(target, baseline, branching):
    result = tree_speculative_sampling(target, target, PROMPT, 40, branching, sampling=GREEDY)
    assert result.tokens == baseline
    depth = len(branching)
    assert result.stats.target_calls == -(-40 // (depth + 1))
    assert result.stats.token_sources.count(FROM_BONUS) >= 40 // (depth + 1) - 1


def test_greedy_when_draft_never_agrees(pair_dirs, target, baseline):
    never = load_gpt2(pair_dirs[1])
    never.__class__ = ConstantDraft
    never.token = next(t for t in range(TINY.vocab_size) if t not in baseline)
    result = tree_speculative_sampling(target, never, PROMPT, 40, (3, 2), sampling=GREEDY)
    assert result.tokens == baseline
    assert result.stats.tokens_accepted == 0 and result.stats.target_calls == 40


@pytest.mark.parametrize("branching", [(2,), (2, 2, 1), (1, 1, 1, 1)])
def test_eos_stops_and_is_kept(target, draft, baseline, branching):
    eos = baseline[7]
    first = baseline.index(eos)
    result = tree_speculative_sampling(target, draft, PROMPT, 40, branching, sampling=GREEDY, eos_id=eos)
    assert result.tokens == baseline[:first + 1] and result.stats.stop_reason == "eos"
    for seed in range(3):
        free = tree_speculative_sampling(target, draft, PROMPT, 30, branching,
                                         sampling=SamplingParams(generator=torch.Generator().manual_seed(seed)))
        eos = free.tokens[10]
        stopped = tree_speculative_sampling(target, draft, PROMPT, 30, branching,
                                            sampling=SamplingParams(generator=torch.Generator().manual_seed(seed)),
                                            eos_id=eos)
        assert stopped.tokens == free.tokens[:free.tokens.index(eos) + 1]
        assert stopped.stats.stop_reason == "eos"


@pytest.mark.parametrize("branching", [(3,), (2, 2, 1), (1, 1, 1, 1)])
def test_exact_max_gen(target, draft, baseline, branching):
    for max_gen in range(1, 10):
        result = tree_speculative_sampling(target, draft, PROMPT, max_gen, branching, sampling=GREEDY)
        assert result.tokens == baseline[:max_gen], max_gen
        # nothing made past max_gen and thrown away
        assert result.stats.tokens_accepted + result.stats.target_calls == max_gen
    # Sampled: exactly max_gen tokens, nothing thrown away, and a clean stop at eos.
    generate = partial(tree_speculative_sampling, target, draft, branching=branching)
    stopping = check_stopping(generate, PROMPT, max_gens=range(1, 10), settings=dict(temperature=1.0))
    assert stopping.passed, stopping.problems


def test_context_window_edge(target, draft, make_checkpoint, monkeypatch):
    """A tree never feeds a position >= n_positions (the model would raise; here every position
    fed is also recorded) and stops with a full window like the target alone."""
    fed = []
    real_score_tree = tree_module.score_tree

    def score_tree_and_record(model, cache, tree, sequence, first=0, return_features=False):
        fed.append((model.config.n_positions, len(sequence) - 1 + max([0] + tree.depths)))
        return real_score_tree(model, cache, tree, sequence, first, return_features)

    monkeypatch.setattr(tree_module, "score_tree", score_tree_and_record)
    n_pos = TARGET_CFG.n_positions  # 64
    for prompt_len in (n_pos - 1, n_pos - 2, n_pos - 6):
        prompt = [(7 * i) % TINY.vocab_size for i in range(prompt_len)]
        expected = autoregressive_generate(target, prompt, 20)
        assert expected.stats.stop_reason == "context_full"
        for branching in [(2,), (2, 2, 1), (1, 1, 1, 1)]:
            result = tree_speculative_sampling(target, draft, prompt, 20, branching, sampling=GREEDY)
            assert result.tokens == expected.tokens and result.stats.stop_reason == "context_full"
            sampled = tree_speculative_sampling(target, draft, prompt, 20, branching,
                                                sampling=SamplingParams(generator=torch.Generator().manual_seed(0)))
            assert len(sampled.tokens) == n_pos - prompt_len
    assert fed and all(position < n_positions for n_positions, position in fed)
    # the edge was reached: the token at position 63 is output but never fed
    assert max(position for _, position in fed) == n_pos - 2
    # a draft with a shorter window: it stops drafting, the target goes on
    short_draft = load_gpt2(make_checkpoint(TINY.with_(n_positions=40), seed=9, std=0.1))
    prompt = list(range(30))
    expected = autoregressive_generate(target, prompt, 30)
    result = tree_speculative_sampling(target, short_draft, prompt, 30, (2, 2), sampling=GREEDY)
    assert result.tokens == expected.tokens and len(result.tokens) == 30


# ---------------------------------------------------------------- caches after every round

@pytest.mark.parametrize("branching, temperature", [((2, 2, 1), 0.0), ((3,), 1.0), ((2, 2), 1.0)])
def test_caches_equal_a_fresh_forward_after_every_round(monkeypatch, target, draft, branching, temperature):
    real_keep = tree_module.keep_accepted_path
    lags = []
    for seed in range(3):
        sequence = list(PROMPT)

        def keep_and_check(target_cache, draft_cache, seq_len, path):
            real_keep(target_cache, draft_cache, seq_len, path)
            assert target_cache.length == len(sequence) - 1  # all but the last token, fed next
            assert draft_cache.length <= len(sequence) - 1
            with torch.inference_mode():
                assert cache_difference(target, target_cache, sequence) <= 1e-5
                assert cache_difference(draft, draft_cache, sequence) <= 1e-5
            lags.append(len(sequence) - draft_cache.length)

        monkeypatch.setattr(tree_module, "keep_accepted_path", keep_and_check)
        tree_speculative_sampling(target, draft, PROMPT, 30, branching,
                                  sampling=SamplingParams(temperature=temperature, generator=torch.Generator().manual_seed(seed)),
                                  observers=Observers(on_tokens=lambda tokens, sources: sequence.extend(tokens)))
    # the draft is one behind after a round that accepted a whole path (it never read the
    # leaves), level with the target otherwise: both happened, and paths were moved
    assert {1, 2} <= set(lags)


# ---------------------------------------------------------------- the chain as a special case

@pytest.mark.parametrize("gamma", [1, 4])
def test_chain_branching_is_the_chain(target, draft, gamma):
    """branching (1,) * gamma draws the same random numbers in the same order as the chain
    functions: the same tokens, seed for seed, and the same statistics."""
    chain_branching = (1,) * gamma
    greedy = speculative_sampling_greedy(target, draft, PROMPT, 30, gamma)
    tree = tree_speculative_sampling(target, draft, PROMPT, 30, chain_branching, sampling=GREEDY)
    assert tree.tokens == greedy.tokens and tree.stats.target_calls == greedy.stats.target_calls
    for seed in range(4):
        settings = dict(temperature=0.9, top_k=30, top_p=0.95)
        chain = speculative_sampling(target, draft, PROMPT, 30, gamma,
                                     SamplingParams(**settings, generator=torch.Generator().manual_seed(seed)))
        tree = tree_speculative_sampling(target, draft, PROMPT, 30, chain_branching,
                                         SamplingParams(**settings, generator=torch.Generator().manual_seed(seed)))
        assert tree.tokens == chain.tokens
        assert tree.stats.token_sources == chain.stats.token_sources
        for key in ("target_calls", "draft_calls", "tokens_drafted", "tokens_accepted", "rejections",
                    "accepted_by_position", "nodes_verified", "accepted_depths"):
            assert getattr(tree.stats, key) == getattr(chain.stats, key), key


# ---------------------------------------------------------------- lossless: one node, exactly

def random_distributions(rows, seed, vocab=6, sharpness=2.0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(sharpness * torch.randn(rows, vocab, generator=g, dtype=torch.float64), -1).float()


def naive_multi_draft(target_probs, draft_probs, draft_tokens, generator=None):
    """The bug to catch: every child is tested against the unchanged p (a token the draft likes
    gets b chances), and only after all are rejected is the residual norm(max(0, p - q)) used."""
    uniforms = []
    for i, x in enumerate(draft_tokens):
        r = torch.rand((), generator=generator)
        uniforms.append(float(r))
        if r * draft_probs[x] < target_probs[x]:
            return MultiDraftVerdict(i, None, uniforms, [float(target_probs[t]) for t in draft_tokens[:i + 1]],
                                     target_probs)
    residual = residual_distribution(target_probs, draft_probs)
    return MultiDraftVerdict(None, int(sample(residual, generator)), uniforms,
                             [float(target_probs[x]) for x in draft_tokens], residual)


def one_node_tokens(rule, p, q, b, n, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        children = sample(q.expand(b, -1), g).tolist()
        verdict = rule(p, q, children, g)
        out.append(children[verdict.accepted] if verdict.accepted is not None else verdict.next_token)
    return torch.bincount(torch.tensor(out), minlength=len(p))


@pytest.mark.parametrize("b", [2, 3])
def test_multi_draft_rejection_sampling_outputs_p(b):
    p, q = random_distributions(2, seed=b)
    counts = one_node_tokens(multi_draft_rejection_sampling, p, q, b, 6000, seed=0)
    assert chi_square_p_value(counts, p) > 1e-3
    # and the test can fail: q's samples, and the naive rule's
    assert chi_square_p_value(one_node_tokens(naive_multi_draft, p, q, b, 6000, seed=0), p) < 1e-6
    assert chi_square_p_value(torch.bincount(sample(q.expand(6000, -1)), minlength=6), p) < 1e-6


def test_two_levels_of_a_synthetic_tree():
    """verify_tree_sampling on a (2, 2) tree with p depending on the path: the first two tokens
    follow p_root(x1) p_x1(x2) (when the round gives two tokens: paths of one node or more)."""
    V = 5
    p_root, q_root = random_distributions(2, seed=7, vocab=V)
    p_next, q_next = random_distributions(V, seed=8, vocab=V), random_distributions(V, seed=9, vocab=V)
    g = torch.Generator().manual_seed(0)
    pairs = torch.zeros(V, V)
    first = torch.zeros(V)
    for _ in range(6000):
        tree = TokenTree(root=0)
        tree.draft_probs[-1] = q_root
        for token in sample(q_root.expand(2, -1), g).tolist():
            tree.add(token, -1)
        for parent in (0, 1):
            tree.draft_probs[parent] = q_next[tree.tokens[parent]]
            for token in sample(q_next[tree.tokens[parent]].expand(2, -1), g).tolist():
                tree.add(token, parent)
        rows = [p_root] + [p_next[t] for t in tree.tokens[:2]] + [torch.full((V,), 1.0 / V)] * 4
        verdict = verify_tree_sampling(tree, torch.stack(rows), g)
        out = tree.path_tokens(verdict.path) + [verdict.next_token]
        first[out[0]] += 1
        if len(out) >= 2:
            pairs[out[0], out[1]] += 1
    assert chi_square_p_value(first, p_root) > 1e-3
    # given x1, x2 ~ p_next[x1] (for rounds that went past depth 1)
    for x1 in range(V):
        if pairs[x1].sum() > 100:
            assert chi_square_p_value(pairs[x1], p_next[x1]) > 1e-4


# ---------------------------------------------------------------- lossless: end to end

LOSSLESS_PROMPT = [1, 2, 3]
# Samples: as many as reject the naive multi-draft rule (test_the_naive_multi_draft_variant_is_caught)
# at p < 1e-6 in the trees (3,) and (2, 2), at either setting (docs/testing.md).
LOSSLESS_CASES = {  # name: (settings, branching, tokens generated, samples)
    "(2,) T=1": (dict(temperature=1.0), (2,), 2, 1000),
    "(3,) T=1": (dict(temperature=1.0), (3,), 2, 1000),
    "(2, 2) T=1": (dict(temperature=1.0), (2, 2), 3, 1000),
    "(2,) T=0.7 top-k 6 top-p 0.9": (dict(temperature=0.7, top_k=6, top_p=0.9), (2,), 2, 1000),
    "(3,) T=0.7 top-k 6 top-p 0.9": (dict(temperature=0.7, top_k=6, top_p=0.9), (3,), 2, 1000),
    "(2, 2) T=0.7 top-k 6 top-p 0.9": (dict(temperature=0.7, top_k=6, top_p=0.9), (2, 2), 3, 1000),
}


def tree_counts(target, draft, settings, branching, n_tokens, n, seed):
    g = torch.Generator().manual_seed(seed)
    samples = [tree_speculative_sampling(target, draft, LOSSLESS_PROMPT, n_tokens, branching,
                                         SamplingParams(**settings, generator=g)).tokens for _ in range(n)]
    return counts_of(samples, TINY_VOCAB.vocab_size, n_tokens)


def exact(target, settings, n_tokens):
    with torch.inference_mode():
        return exact_distribution(target, LOSSLESS_PROMPT, n_tokens, settings)


@pytest.mark.parametrize("name", list(LOSSLESS_CASES))
def test_tree_samples_follow_the_target_distribution(unrelated_pair, name):
    target, draft = unrelated_pair
    settings, branching, n_tokens, n = LOSSLESS_CASES[name]
    probs = exact(target, settings, n_tokens)
    assert probs.sum().item() == pytest.approx(1.0)
    counts = tree_counts(target, draft, settings, branching, n_tokens, n, seed=0)
    p_value = chi_square_p_value(counts, probs)
    assert p_value > 1e-3, f"tree samples differ from the target (p = {p_value:.2g})"


@pytest.mark.parametrize("name", ["(3,) T=1"])
def test_the_naive_multi_draft_variant_is_caught(unrelated_pair, monkeypatch, name):
    """The same test rejects the tree whose children are each verified against the unchanged p."""
    target, draft = unrelated_pair
    settings, branching, n_tokens, n = LOSSLESS_CASES[name]
    monkeypatch.setattr(tree_module, "multi_draft_rejection_sampling", naive_multi_draft)
    counts = tree_counts(target, draft, settings, branching, n_tokens, n, seed=0)
    assert chi_square_p_value(counts, exact(target, settings, n_tokens)) < 1e-6


# ---------------------------------------------------------------- bad input

def test_a_layer_skip_drafter_is_refused_not_the_whole_target(target):
    """A LayerSkipDrafter is a ModelDrafter whose .model is the whole target: a tree drafted with
    that model would silently be drafted by the target itself. It is a clear error instead."""
    with pytest.raises(TypeError, match="got LayerSkipDrafter: it scores the tree with the draft model's full"):
        tree_speculative_sampling(target, LayerSkipDrafter(target, 2), PROMPT, 8, (2, 1))
    # a plain ModelDrafter (and its subclasses that draft with their whole model) still works
    assert len(tree_speculative_sampling(target, ModelDrafter(target), PROMPT, 8, (2, 1)).tokens) == 8


@pytest.mark.parametrize("branching, message", [
    ((), "non-empty tuple"), (2, "non-empty tuple"), ((2, 0), "an int between 1 and the vocabulary"),
    ((2, 1.5), "an int between 1"), ((101,), "vocabulary size 100"),
])
def test_bad_branching_is_a_clear_error(target, draft, branching, message):
    with pytest.raises(ValueError, match=message):
        tree_speculative_sampling(target, draft, PROMPT, 10, branching)


def test_other_bad_inputs(target, draft, tmp_path):
    with pytest.raises(ValueError, match="max_gen must be an int >= 1"):
        tree_speculative_sampling(target, draft, PROMPT, 0, (2,))
    for temperature in (-1, float("inf")):
        with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
            tree_speculative_sampling(target, draft, PROMPT, 5, (2,),
                                      sampling=SamplingParams(temperature=temperature))
    other = load_gpt2(save_random_checkpoint(tmp_path, TINY.with_(vocab_size=50)))
    with pytest.raises(ValueError, match="vocabulary .* differs"):
        tree_speculative_sampling(target, other, PROMPT, 5, (2,))


def test_draft_as_a_model_drafter(target, draft, baseline):
    from spec_decoding.drafters import Drafter, ModelDrafter

    result = tree_speculative_sampling(target, ModelDrafter(draft), PROMPT, 40, (2, 2, 1), sampling=GREEDY)
    assert result.tokens == baseline
    with pytest.raises(TypeError, match="needs the draft as a GPT2 model"):
        tree_speculative_sampling(target, Drafter(), PROMPT, 10, (2,))


def test_tree_theory_reduces_to_the_chain():
    from spec_decoding.policies.theory import (expected_tokens_per_round, expected_tokens_per_tree_round,
                                      predicted_speedup, predicted_tree_speedup)

    for alpha in (0.3, 0.75, 0.95):
        for gamma in (1, 3, 8):
            chain = expected_tokens_per_tree_round((1,) * gamma, lambda b: alpha)
            assert chain == pytest.approx(expected_tokens_per_round(alpha, gamma))
            assert predicted_tree_speedup(chain, gamma, 0.2, 1.3) == pytest.approx(predicted_speedup(alpha, gamma, 0.2, 1.3))
    # a wider first level helps exactly by its hit rate: (3, 1) = 1 + h3 + h3 * h1
    assert expected_tokens_per_tree_round((3, 1), {1: 0.5, 3: 0.8}.get) == pytest.approx(1 + 0.8 + 0.4)


def test_tree_speedup_by_hand():
    """tokens per round / (depth * c + verify cost): 2.6 tokens, depth 3, c = 0.1, verify 1.5
    -> 2.6 / (0.3 + 1.5) = 13 / 9."""
    from spec_decoding.policies.theory import predicted_tree_speedup

    assert predicted_tree_speedup(2.6, 3, 0.1, 1.5) == pytest.approx(13 / 9)
    assert predicted_tree_speedup(3.0, 2, 0.0, 1.2) == pytest.approx(2.5)  # a free draft: verify only


def test_both_tree_drafters_spend_one_draft_step_per_depth(monkeypatch, target, draft):
    """What predicted_tree_speedup's depth * c assumes: per round, a draft model runs one forward
    per depth drafted (its draft step), and Medusa runs one head per depth (its draft step, as
    CostModel.calibrate times it, is a propose of one token: one head)."""
    from spec_decoding.drafters.medusa import MedusaDrafter, MedusaHead, MedusaHeads

    forwards = []
    real_forward = draft.forward
    monkeypatch.setattr(draft, "forward", lambda *a, **k: forwards.append(1) or real_forward(*a, **k))
    result = tree_speculative_sampling(target, draft, PROMPT, 20, (2, 2, 1), sampling=GREEDY)
    assert len(forwards) == result.stats.tokens_drafted > 0  # tokens_drafted: the depths drafted

    heads_run = []
    real_head = MedusaHead.forward
    monkeypatch.setattr(MedusaHead, "forward", lambda *args: heads_run.append(1) or real_head(*args))
    medusa = MedusaDrafter(target, MedusaHeads(target, 3))
    result = tree_speculative_sampling(target, medusa, PROMPT, 20, (2, 2, 1), sampling=GREEDY)
    assert len(heads_run) == result.stats.tokens_drafted > 0
    assert medusa.forward_calls == sum(g > 0 for g in result.stats.gamma_by_round)  # one small forward a round
    heads_run.clear()
    assert len(medusa.propose(PROMPT + result.tokens, 1)[0]) == 1 and len(heads_run) == 1
