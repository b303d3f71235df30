"""Feature drafters (Medusa heads, an EAGLE-style drafter) keep speculative decoding exact: greedy
output identical to the target's own, sampled output distributed as the target's (exact
enumeration + chi-square, with the power to catch a bonus token taken by argmax), the target's
cache and the drafter's features equal to a fresh forward after every round. Random, untrained
drafters are enough for all of it: exactness must not depend on how good the drafter is."""

from functools import partial

import pytest
import torch
from conftest import TINY_VOCAB
from test_lossless import SETTINGS

import spec_decoding.algorithms.speculative
import spec_decoding.algorithms.tree as tree_module
from gpt2 import load_gpt2
from spec_decoding import (GREEDY, autoregressive_generate, Observers, SamplingParams, speculative_sampling,
                           speculative_sampling_greedy, tree_speculative_sampling)
from spec_decoding.checks import (cache_difference, check_caches_after_every_round, check_greedy_matches_target,
                                  check_lossless, check_stopping)
from gpt2 import KVCache
from spec_decoding.drafters.eagle import EagleDrafter, EagleNet
from spec_decoding.drafters.medusa import MedusaDrafter, MedusaHeads, branching_from_accuracies
from spec_decoding.calibration import calibrate_costs

PROMPT = [5, 17, 42, 8, 99, 3]
LOSSLESS_PROMPT = [1, 2, 3]
# Per chi-square test: as many as catch both planted bugs below (a bonus token by argmax, a tree
# claiming q = p) at p < 1e-6, which they are, by many orders of magnitude.
SAMPLES = 600


def randomize(module: torch.nn.Module, seed: int, std: float = 0.2) -> torch.nn.Module:
    """Every weight perturbed by seeded noise: an 'untrained' drafter that still disagrees with
    the target in many different ways (a zero-init residual block would change nothing)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(std * torch.randn(p.shape, generator=g))
    return module


def medusa(target, num_heads=4, seed=0, shared_readout=False):
    return MedusaDrafter(target, randomize(MedusaHeads(target, num_heads, shared_readout), seed))


def eagle(target, seed=0, vocab_share=None):
    V = target.config.vocab_size
    draft_vocab = None if vocab_share is None else torch.randperm(
        V, generator=torch.Generator().manual_seed(seed))[:int(vocab_share * V)]
    return EagleDrafter(target, randomize(EagleNet(target), seed, std=0.1), draft_vocab)


DRAFTERS = {
    "medusa": medusa,
    "medusa-shared-readout": partial(medusa, shared_readout=True),  # only the blocks are its own
    "eagle": eagle,
    "eagle-reduced-vocab": partial(eagle, vocab_share=0.75),  # q is 0 on a quarter of the tokens
}


class FeatureChecking:
    """Wraps a feature drafter: at every propose(), its features of the positions it keeps must
    equal those of a fresh target forward over the accepted tokens."""

    def __init__(self, drafter):
        self.drafter = drafter
        self.checked = 0
        real_propose = drafter.propose

        def propose(tokens, *args, **kwargs):
            n = drafter.n_features
            assert n <= len(tokens) - 1  # never a position the sequence does not have yet
            if n:
                with torch.inference_mode():
                    _, fresh = drafter.target(torch.tensor([tokens[:n]]), return_features=True)
                torch.testing.assert_close(drafter.features[:n], fresh[0], atol=1e-5, rtol=0)
                self.checked += 1
            if isinstance(drafter, EagleDrafter) and drafter.cache.length:
                check_eagle_cache(drafter, tokens)
            return real_propose(tokens, *args, **kwargs)

        drafter.propose = propose


def check_eagle_cache(drafter, tokens):
    """EAGLE's cache entry i must be what a fresh run over [wte(t_{i+1}) ; f_i] gives, with the
    target's real features: nothing left from a round's own predicted features."""
    n = drafter.cache.length
    assert n <= drafter.n_features and n <= len(tokens) - 1
    c = drafter.target.config
    fresh = KVCache(1, 1, c.n_head, n, c.head_dim)
    with torch.inference_mode():
        drafter.net(drafter.target.wte(torch.tensor([tokens[1:n + 1]])), drafter.features[None, :n], fresh)
    for got, want in ((drafter.cache.keys[0], fresh.keys[0]), (drafter.cache.values[0], fresh.values[0])):
        torch.testing.assert_close(got[:, :, :n], want, atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------ the features

def test_features_through_ln_f_and_the_head_are_the_logits(target):
    idx = torch.tensor([PROMPT])
    with torch.inference_mode():
        logits, features = target(idx, return_features=True)
        assert features.shape == (1, len(PROMPT), target.config.n_embd)
        torch.testing.assert_close(logits, target(idx))
        torch.testing.assert_close(target.ln_f(features) @ target.wte.weight.T, logits)
        last, all_features = target(idx, num_last_logits=1, return_features=True)
        torch.testing.assert_close(last, logits[:, -1:])
        torch.testing.assert_close(all_features, features)  # num_last_logits does not cut them


@pytest.mark.parametrize("shared_readout", [False, True])
def test_untrained_medusa_heads_are_the_targets_head(target, shared_readout):
    """W1 = 0 and a copy of wte (or, shared, the target's wte itself): before training each head
    predicts what the target's head does. The copy is untied (training a head does not touch the
    target); a shared readout has no weights of its own to save."""
    heads = MedusaHeads(target, 3, shared_readout=shared_readout)
    features = torch.randn(5, target.config.n_embd)
    with torch.inference_mode():
        want = target.ln_f(features) @ target.wte.weight.T
        got = heads(features, target)
    for k in range(3):
        torch.testing.assert_close(got[k], want)
    if shared_readout:
        assert all(head.out is None for head in heads.heads)
        assert set(heads.state_dict()) == {f"heads.{k}.w1.{p}" for k in range(3) for p in ("weight", "bias")}
    else:
        assert heads.heads[0].out.weight.data_ptr() != target.wte.weight.data_ptr()


# ------------------------------------------------------------------------------ greedy

@pytest.fixture(scope="module")
def baseline(target):
    return autoregressive_generate(target, PROMPT, 40).tokens


@pytest.mark.parametrize("gamma", [1, 2, 4])
@pytest.mark.parametrize("name", list(DRAFTERS))
def test_greedy_equals_target_greedy(target, baseline, name, gamma):
    drafter = DRAFTERS[name](target)
    checking = FeatureChecking(drafter)
    result = speculative_sampling_greedy(target, drafter, PROMPT, 40, gamma)
    assert result.tokens == baseline
    s = result.stats
    assert s.tokens_drafted > 0 and s.rejections > 0
    assert checking.checked == s.target_calls - 1  # every round after the first
    assert s.gamma_by_round[0] == 0  # the first round: no feature yet, a plain target step


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_greedy_at_the_context_window_edge(target, name):
    n_pos = target.config.n_positions
    prompt = (PROMPT * 20)[:n_pos - 7]
    result = check_greedy_matches_target(partial(speculative_sampling_greedy, target, DRAFTERS[name](target),
                                                 gamma=4), target, prompt, max_gen=30)
    assert result.passed, result.message
    assert len(result.tokens) == 7  # stopped at the full window


@pytest.mark.parametrize("settings", [None, dict(temperature=1.0)])
@pytest.mark.parametrize("name", list(DRAFTERS))
def test_exact_max_gen_and_eos(target, name, settings):
    generate = partial(speculative_sampling if settings else speculative_sampling_greedy, target,
                       DRAFTERS[name](target), gamma=3)
    result = check_stopping(generate, PROMPT, max_gens=range(1, 8), settings=settings, seeds=range(2))
    assert result.passed, result.message


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_caches_and_features_equal_a_fresh_forward_after_every_round(target, name):
    drafter = DRAFTERS[name](target)
    checking = FeatureChecking(drafter)
    result = check_caches_after_every_round(partial(speculative_sampling, target, drafter, gamma=3),
                                            target, None, PROMPT, 30, dict(temperature=1.0))
    assert result.passed, result.message
    assert max(s.round for s in result.snapshots) > 4 and checking.checked > 4


# ------------------------------------------------------------------------------ lossless

@pytest.fixture(scope="module")
def tiny_target(make_checkpoint):
    return load_gpt2(make_checkpoint(TINY_VOCAB, seed=21, std=0.2, embedding_std=0.3))


def lossless_check(target, drafter, settings, gamma, samples, seed=0):
    drafted = []

    def generate(prompt, max_gen, **kwargs):
        result = speculative_sampling(target, drafter, prompt, max_gen, gamma, **kwargs)
        drafted.append((result.stats.tokens_drafted, result.stats.tokens_accepted))
        return result

    result = check_lossless(generate, target, LOSSLESS_PROMPT, 3, settings, samples=samples, seed=seed)
    return result, [sum(column) for column in zip(*drafted)]


# Each EAGLE variant once (they differ only in their readout's rows), both settings for each kind:
# the suite's time is short.
LOSSLESS_CASES = [("medusa", "temperature 1"), ("medusa", "temperature 0.7, top-k 6, top-p 0.9"),
                  ("medusa-shared-readout", "temperature 1"),
                  ("eagle", "temperature 1"), ("eagle-reduced-vocab", "temperature 0.7, top-k 6, top-p 0.9")]


@pytest.mark.parametrize("name, setting", LOSSLESS_CASES)
def test_sampling_is_lossless(tiny_target, name, setting):
    settings = SETTINGS[setting][0]
    result, (drafted, accepted) = lossless_check(tiny_target, DRAFTERS[name](tiny_target), settings, 2, SAMPLES)
    # The first round is the prompt's plain target step (no feature yet), so of 3 tokens the second
    # round drafts one: accepted or not, then a bonus or a correction, all exercised.
    assert drafted == SAMPLES and 50 < accepted < drafted - 50
    assert result.passed and result.p_value > 1e-3, f"{name}: {result.message}"


def bonus_by_argmax(real):
    """The planted bug: when every draft token is accepted, take the bonus token as p's argmax
    instead of drawing it from p."""

    def verify(target_probs, draft_probs, draft_tokens, generator=None):
        verdict = real(target_probs, draft_probs, draft_tokens, generator)
        if draft_tokens and verdict.n_accepted == len(draft_tokens):
            verdict.next_token = int(target_probs[len(draft_tokens)].argmax())
        return verdict

    return verify


def test_a_bonus_token_taken_by_argmax_is_caught(tiny_target, monkeypatch):
    """The planted bug sits in the generator, not the drafter: one drafter shows the test's power."""
    monkeypatch.setattr(spec_decoding.algorithms.speculative, "modified_rejection_sampling",
                        bonus_by_argmax(spec_decoding.algorithms.speculative.modified_rejection_sampling))
    result, _ = lossless_check(tiny_target, medusa(tiny_target), dict(temperature=1.0), 2, SAMPLES)
    assert not result.passed and result.p_value < 1e-6, result.message


# ------------------------------------------------------------------------------ Medusa's token tree

TREE_BRANCHINGS = [(2, 2, 1), (3,), (1, 1, 1, 1), (2, 3)]


@pytest.mark.parametrize("branching", TREE_BRANCHINGS)
def test_medusa_tree_greedy_equals_target_greedy(target, baseline, branching):
    drafter = medusa(target)
    checking = FeatureChecking(drafter)  # the tree generator hands it the accepted path's features
    drafter.propose_tree = checked_propose_tree(drafter, checking)
    result = tree_speculative_sampling(target, drafter, PROMPT, 40, branching, sampling=GREEDY)
    assert result.tokens == baseline
    s = result.stats
    assert s.gamma_by_round[0] == 0 and s.tokens_drafted > 0 and s.rejections > 0
    assert checking.checked == s.rounds  # every round that drafted a tree
    assert s.nodes_verified > s.tokens_drafted or branching == (1, 1, 1, 1)


def checked_propose_tree(drafter, checking):
    """propose_tree through FeatureChecking's check of the drafter's features."""
    real = drafter.propose_tree

    def propose_tree(tokens, *args):
        checking.drafter.propose(tokens, 0)  # runs the check; 0 tokens: proposes nothing
        return real(tokens, *args)

    return propose_tree


def test_medusa_tree_layout(target):
    """Depth d holds head d's top-b (the head propose() uses for draft position d), the same under
    every parent; sampling keeps each parent's q, head d's distribution."""
    drafter = medusa(target, num_heads=3)
    drafter.start(PROMPT, 10)
    tokens = PROMPT + [7]
    assert len(drafter.propose_tree(tokens, (2,))) == 0  # no feature yet: no tree
    with torch.inference_mode():
        _, features = target(torch.tensor([PROMPT]), return_features=True)
    drafter.observe_target_features(0, features[0])
    heads = drafter.head_logits(tokens, 3)
    tree = drafter.propose_tree(tokens, (2, 2, 1))
    assert tree.depths == [1] * 2 + [2] * 4 + [3] * 4 and tree.root == 7
    for node, parent in enumerate(tree.parents):
        d = tree.depths[node]
        siblings = [tree.tokens[c] for c in tree.children(parent)]
        assert siblings == heads[d - 1].topk(len(siblings)).indices.tolist()
    assert drafter.propose(tokens, 3)[0] == [tree.tokens[0], tree.tokens[2], tree.tokens[6]]  # the chain
    assert len(drafter.propose_tree(tokens, (2, 2, 2, 2, 2))) == 2 + 4 + 8  # 3 heads: 3 depths
    tree = drafter.propose_tree(tokens, (2, 2), 0.7, 6, None, torch.Generator().manual_seed(0))
    for parent in [-1, 0, 1]:
        d = 1 if parent == -1 else 2
        torch.testing.assert_close(tree.draft_probs[parent],
                                   spec_decoding.drafters.medusa.logits_to_probs(heads[d - 1], 0.7, 6, None))


def test_branching_from_accuracies():
    """Expected accepted depth, worked by hand: acc = [[.5, .9], [.5, .9]]. At most 2 nodes:
    (2,) .9 beats (1, 1) .5 + .25. At most 6: (2, 2) .9 + .81 = 1.71 beats (2, 1) 1.35 (4 nodes)."""
    acc = [[0.5, 0.9], [0.5, 0.9]]
    assert branching_from_accuracies(acc, 1) == (1,)
    assert branching_from_accuracies(acc, 2) == (2,)
    assert branching_from_accuracies(acc, 6) == (2, 2)
    assert branching_from_accuracies([[0.95, 0.97]] * 4, 4) == (1, 1, 1, 1)  # sure heads: a chain
    assert branching_from_accuracies([[0.9, 0.9], [0.0, 0.0]], 10) == (1,)  # ties: fewer nodes
    with pytest.raises(ValueError, match="max_nodes"):
        branching_from_accuracies(acc, 0)


@pytest.mark.parametrize("branching", [(2, 2, 1), (3,)])
def test_medusa_tree_at_the_context_window_edge(target, branching):
    prompt = (PROMPT * 20)[:target.config.n_positions - 7]
    result = check_greedy_matches_target(partial(tree_speculative_sampling, target, medusa(target),
                                                 branching=branching, sampling=GREEDY), target, prompt, max_gen=30)
    assert result.passed, result.message
    assert len(result.tokens) == 7


@pytest.mark.parametrize("settings", [None, dict(temperature=1.0)])
def test_medusa_tree_exact_max_gen_and_eos(target, settings):
    generate = partial(tree_speculative_sampling, target, medusa(target), branching=(2, 2, 1),
                       **({} if settings else dict(sampling=GREEDY)))
    result = check_stopping(generate, PROMPT, max_gens=range(1, 8), settings=settings, seeds=range(2))
    assert result.passed, result.message


@pytest.mark.parametrize("branching, temperature", [((2, 2, 1), 0.0), ((2, 2), 1.0)])
def test_medusa_tree_caches_and_features_equal_a_fresh_forward(monkeypatch, target, branching, temperature):
    """After every round the target's cache holds a fresh forward's keys/values of the accepted
    sequence but its last token (tree slots moved down by KVCache.keep), and the drafter's
    features (checked at its next propose_tree) a fresh forward's features."""
    real_keep = tree_module.keep_accepted_path
    sequence, checked_rounds = list(PROMPT), []

    def keep_and_check(target_cache, draft_cache, seq_len, path):
        real_keep(target_cache, draft_cache, seq_len, path)
        assert draft_cache is None and target_cache.length == len(sequence) - 1
        with torch.inference_mode():
            assert cache_difference(target, target_cache, sequence) <= 1e-5
        checked_rounds.append(len(path))

    monkeypatch.setattr(tree_module, "keep_accepted_path", keep_and_check)
    drafter = medusa(target)
    checking = FeatureChecking(drafter)
    drafter.propose_tree = checked_propose_tree(drafter, checking)
    tree_speculative_sampling(target, drafter, PROMPT, 30, branching,
                              sampling=SamplingParams(temperature=temperature, generator=torch.Generator().manual_seed(0)),
                              observers=Observers(on_tokens=lambda tokens, sources: sequence.extend(tokens)))
    assert len(checked_rounds) > 4 and checking.checked > 4
    assert max(checked_rounds) > 0  # paths were accepted and moved


def medusa_tree_lossless(target, drafter, settings, branching, samples):
    """Generate 4 tokens and keep the first 3: the first round is a plain target step (no feature
    yet), the second drafts a tree of depth 2, so the 3 tokens come through depths 1 and 2."""
    depths = []

    def generate(prompt, n_tokens, **kwargs):
        result = tree_speculative_sampling(target, drafter, prompt, n_tokens + 1, branching, **kwargs)
        depths.extend(result.stats.accepted_depths)
        return result.tokens[:n_tokens]

    return check_lossless(generate, target, LOSSLESS_PROMPT, 3, settings, samples=samples), depths


@pytest.mark.parametrize("setting", ["temperature 1", "temperature 0.7, top-k 6, top-p 0.9"])
def test_medusa_tree_sampling_is_lossless(tiny_target, setting):
    result, depths = medusa_tree_lossless(tiny_target, medusa(tiny_target), SETTINGS[setting][0], (2, 2), SAMPLES)
    assert {0, 1, 2} <= set(depths)  # rejected at the root, at depth 2, and the whole path accepted
    assert result.passed and result.p_value > 1e-3, result.message


def test_a_medusa_tree_claiming_q_equals_p_is_caught(tiny_target, monkeypatch):
    """The planted bug: the tree's nodes claim the target's p as their q (as if drafted from the
    target), while they were drawn from the heads' q."""
    real_score_tree = tree_module.score_tree

    def score_tree_and_claim_q_is_p(model, cache, tree, sequence, first=0, return_features=False):
        logits, features = real_score_tree(model, cache, tree, sequence, first, return_features)
        for parent in tree.draft_probs:
            tree.draft_probs[parent] = torch.softmax(logits[parent + 1].float(), -1)
        return logits, features

    monkeypatch.setattr(tree_module, "score_tree", score_tree_and_claim_q_is_p)
    result, _ = medusa_tree_lossless(tiny_target, medusa(tiny_target), dict(temperature=1.0), (2, 2), SAMPLES)
    assert not result.passed and result.p_value < 1e-6, result.message


# ------------------------------------------------------------------------------ bad input

def test_medusa_heads_for_another_target_are_refused(target, tiny_target):
    with pytest.raises(ValueError, match="trained for another target"):
        MedusaDrafter(target, MedusaHeads(tiny_target, 2))
    with pytest.raises(ValueError, match="num_heads must be an int >= 1"):
        MedusaHeads(target, 0)


# ------------------------------------------------------------------------------ training

TRAIN = dict(steps=15, batch_size=2, learning_rate=3e-3, warmup_steps=5, seed=0)


def train_tiny(target_dir, kind, out, **kwargs):
    from conftest import stdlib_texts

    from offline.train_pair import TrainSettings
    from offline.train_drafter import train_drafter

    settings = TrainSettings(**{**TRAIN, **kwargs.pop("settings", {})})
    kwargs.setdefault("eval_windows", 8)  # held-out windows: 8 tell 15 steps' progress, in a quarter of the time
    return train_drafter(target_dir, kind, out, stdlib_texts()[:3], settings, log=lambda *a: None, **kwargs)


@pytest.mark.parametrize("passes", [1, 3])
def test_training_time_test_predicts_what_the_drafting_steps_predict(target, passes):
    """EAGLE's training-time test (offline.train_drafter --unroll) computes, for every position of a
    window at once, what drafting step k + 1 of a round predicts there: the same numbers as
    running the drafter step by step on a KV cache, reading its own predicted features."""
    from offline.train_drafter import eagle_unrolled_predictions

    c = target.config
    net = randomize(EagleNet(target), 0, std=0.1).eval()
    ids = torch.tensor([(PROMPT * 3)[:12]])
    with torch.no_grad():
        features = target(ids, return_features=True)[1][:, :-1]  # f_i, i = 0 .. T - 1
        embeddings = target.wte(ids[:, 1:])  # wte(t_{i+1})
        unrolled = eagle_unrolled_predictions(net, embeddings, features, passes)  # [passes, 1, T, C]
        T = features.shape[1]
        for k in range(passes):
            for i in range(k, T):  # pass k at i: step k + 1 of a round whose first step is at i - k
                cache = KVCache(1, 1, c.n_head, T, c.head_dim, features.device, features.dtype)
                predicted = net(embeddings[:, :i - k + 1], features[:, :i - k + 1], cache)[:, -1:]
                for position in range(i - k + 1, i + 1):  # its own prediction of f_position
                    predicted = net(embeddings[:, position:position + 1], predicted, cache)
                torch.testing.assert_close(unrolled[k, :, i], predicted[:, 0], rtol=1e-5, atol=1e-5)


def test_held_out_windows_sample_the_whole_held_out_text():
    """The held-out loss and head accuracies read windows from all over the held-out text, not
    its first file: the first windows of one file are no sample of the rest."""
    from offline.train_drafter import held_out_windows

    held = torch.arange(10_000)
    windows = held_out_windows(held, 128, 8)
    starts = [int(w[0, 0]) for w in windows]
    assert len(windows) == 8 and all(w.shape == (1, 129) for w in windows)
    assert starts[0] == 0 and starts[-1] > 9_000 - 129  # the first and the last part of the text
    assert all(b - a >= 129 for a, b in zip(starts, starts[1:]))  # non-overlapping
    assert [w.shape[1] for w in held_out_windows(torch.arange(50), 128, 8)] == [50]  # shorter than a window


@pytest.mark.parametrize("kind, options", [("medusa", dict(num_heads=1)), ("medusa", dict(num_heads=1, shared_readout=True)),
                                           ("eagle", dict(draft_vocab=3000)), ("eagle", dict(unroll=2))])
def test_training_lowers_the_loss_and_the_saved_drafter_reloads_the_same(trained_pair_dirs, tmp_path, kind,
                                                                          options, monkeypatch):
    from spec_decoding.drafters.feature_files import load_feature_drafter

    monkeypatch.setenv("TRAIN_PAIR_PROGRESS", "0")
    target_dir = trained_pair_dirs[0]
    module, info = train_tiny(target_dir, kind, tmp_path / kind, **options)
    assert len(info["losses"]) == TRAIN["steps"]
    # Same held-out windows. At least 1% lower: no update leaves it equal (once, on another CPU and
    # torch, 15 steps of one setting lowered it 1.7%).
    assert info["held_out_loss"]["after"] < 0.99 * info["held_out_loss"]["before"]
    assert {p.name for p in (tmp_path / kind).iterdir()} == {"config.json", "model.safetensors", "README.md"}
    if kind == "medusa":
        accuracies = info["head_accuracies"]
        assert len(accuracies) == 1 and all(0 <= a <= b <= 1 for row in accuracies for a, b in zip(row, row[1:]))
        assert "top-1" in (tmp_path / kind / "README.md").read_text()

    target = load_gpt2(target_dir, dtype="float32")
    reloaded = load_feature_drafter(tmp_path / kind, target, kind)
    if kind == "medusa":
        assert reloaded.heads.shared_readout == options.get("shared_readout", False)
    fresh = (MedusaDrafter(target, module) if kind == "medusa"
             else EagleDrafter(target, module, reloaded.draft_vocab))
    prompt = [464, 1332, 318, 257, 220]
    for drafter in (reloaded, fresh):
        drafter.result = speculative_sampling(target, drafter, prompt, 30, 3,
                                              sampling=SamplingParams(temperature=1.0, generator=torch.Generator().manual_seed(0)))
    assert reloaded.result.tokens == fresh.result.tokens
    assert reloaded.result.stats.token_sources == fresh.result.stats.token_sources
    assert reloaded.result.stats.tokens_accepted > 0  # trained a little: it drafts something useful

    if "unroll" in options:
        import json
        assert json.loads((tmp_path / kind / "config.json").read_text())["unroll"] == options["unroll"]
        assert "training-time test" in (tmp_path / kind / "README.md").read_text()
    if "draft_vocab" in options:  # seedable: the same seed gives the same weights (the cheaper kind shows it)
        again, _ = train_tiny(target_dir, kind, tmp_path / "again", **options, settings=dict(steps=1))
        once_more, _ = train_tiny(target_dir, kind, tmp_path / "once-more", **options, settings=dict(steps=1))
        for a, b in zip(again.state_dict().values(), once_more.state_dict().values()):
            assert torch.equal(a, b)

    other = load_gpt2(trained_pair_dirs[1])  # the draft model: another network, another target
    with pytest.raises(ValueError, match="trained for another target"):
        load_feature_drafter(tmp_path / kind, other)


def test_an_interrupted_run_leaves_nothing_half_written(trained_pair_dirs, tmp_path, monkeypatch):
    import offline.train_drafter

    def interrupted(folder, info):
        assert (folder / "model.safetensors").is_file()  # the weights are already written, unnamed
        raise KeyboardInterrupt

    monkeypatch.setenv("TRAIN_PAIR_PROGRESS", "0")
    monkeypatch.setattr(offline.train_drafter, "write_readme", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_tiny(trained_pair_dirs[0], "medusa", tmp_path / "out", num_heads=1, settings=dict(steps=1))
    assert list(tmp_path.iterdir()) == []


def test_training_has_default_steps_and_a_minutes_cap_that_says_it_cut_the_run(trained_pair_dirs, tmp_path,
                                                                                monkeypatch):
    from offline.train_drafter import DEFAULT_STEPS

    monkeypatch.setenv("TRAIN_PAIR_PROGRESS", "0")
    # No --steps: the kind's default number, so a busy machine trains the same drafter; a cap of
    # a few milliseconds cuts it after one step and the README says so.
    _, info = train_tiny(trained_pair_dirs[0], "eagle", tmp_path / "capped",
                         settings=dict(steps=None, minutes=1e-5))
    assert info["planned_steps"] == DEFAULT_STEPS["eagle"] and info["steps"] == 1 and info["cut_short"]
    assert f"1 step (cut short by --minutes 1e-05: {DEFAULT_STEPS['eagle']} planned)" in \
        (tmp_path / "capped" / "README.md").read_text()


def test_training_errors_say_what_to_do(trained_pair_dirs, tmp_path):
    from offline.train_drafter import TrainDrafterError, main

    with pytest.raises(TrainDrafterError, match="no GPT-2 folder there"):
        train_tiny(tmp_path / "nothing", "medusa", tmp_path / "out")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    from offline.train_drafter import train_drafter
    with pytest.raises(TrainDrafterError, match="corpus is empty or too small"):
        train_drafter(trained_pair_dirs[0], "medusa", tmp_path / "out", [str(empty)], log=lambda *a: None)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("mine")
    with pytest.raises(TrainDrafterError, match="already holds files"):
        train_tiny(trained_pair_dirs[0], "eagle", tmp_path / "full")
    assert (tmp_path / "full" / "mine.txt").read_text() == "mine"  # never overwritten
    assert main(["--target", str(tmp_path / "nothing"), "--kind", "eagle", "--out", str(tmp_path / "o")]) == 2
    with pytest.raises(TrainDrafterError, match="--shared-readout is for --kind medusa only"):
        train_tiny(trained_pair_dirs[0], "eagle", tmp_path / "o", shared_readout=True)
    with pytest.raises(TrainDrafterError, match="--unroll is for --kind eagle only"):
        train_tiny(trained_pair_dirs[0], "medusa", tmp_path / "o", unroll=2)
    with pytest.raises(TrainDrafterError, match="--unroll must be a whole number >= 1"):
        train_tiny(trained_pair_dirs[0], "eagle", tmp_path / "o", unroll=0)
    with pytest.raises(TrainDrafterError, match="--eval-windows must be a whole number >= 1, got 0"):
        train_tiny(trained_pair_dirs[0], "medusa", tmp_path / "o", eval_windows=0)


# ------------------------------------------------------------------------------ command lines

@pytest.fixture(scope="module")
def saved_drafters(text_pair, tmp_path_factory):
    """Untrained Medusa heads and EAGLE drafter for the text pair's target, saved as the trainer does."""
    from spec_decoding.drafters.feature_files import save_feature_drafter

    target = text_pair[0]
    root = tmp_path_factory.mktemp("feature-drafters")
    for kind, module in (("medusa", randomize(MedusaHeads(target, 3), 0, std=0.02)),
                         ("eagle", randomize(EagleNet(target), 0, std=0.02))):
        (root / kind).mkdir()
        save_feature_drafter(root / kind, kind, module, target, {"num_heads": 3} if kind == "medusa" else {})
    return root


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_generate_script_drafts_with_a_saved_feature_drafter(text_pair_dirs, text_pair, saved_drafters, kind,
                                                            tmp_path, capsys):
    import json

    import spec_decoding_generate as script
    from gpt2 import encode

    html = tmp_path / "trace.html"
    args = ["--target", str(text_pair_dirs[0]), "--drafter", f"{kind}:{saved_drafters / kind}", "--prompt",
            "The capital of France is", "--max-gen", "12", "--gamma", "3", "--dtype", "float32", "--json",
            "--html", str(html)]
    assert script.main(args) == 0
    out = json.loads(capsys.readouterr().out)
    want = autoregressive_generate(text_pair[0], encode("The capital of France is"), 12).tokens
    assert out["tokens"] == want
    assert out["stats"]["tokens_drafted"] > 0
    assert html.is_file() and "round" in html.read_text().lower()


def test_generate_script_drafts_a_medusa_tree(text_pair_dirs, text_pair, saved_drafters, capsys):
    import json

    import spec_decoding_generate as script
    from gpt2 import encode

    args = ["--target", str(text_pair_dirs[0]), "--drafter", f"medusa:{saved_drafters / 'medusa'}", "--prompt",
            "The capital of France is", "--max-gen", "12", "--tree", "2,2,1", "--dtype", "float32", "--json"]
    assert script.main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"] == autoregressive_generate(text_pair[0], encode("The capital of France is"), 12).tokens
    assert out["settings"]["tree"] == [2, 2, 1] and out["stats"]["nodes_per_target_call"] > 1
    # a drafter that builds no trees is a usage error naming those that do
    with pytest.raises(SystemExit) as exit_info:
        script.main(args[:2] + ["--drafter", "ngram"] + args[4:])
    assert exit_info.value.code == 2 and "medusa:DIR" in capsys.readouterr().err


def test_a_feature_drafter_for_another_target_is_a_clear_error(text_pair_dirs, saved_drafters, capsys):
    import benchmark
    import spec_decoding_generate as script

    args = ["--target", str(text_pair_dirs[1]), "--drafter", f"medusa:{saved_drafters / 'medusa'}", "--max-gen", "4"]
    assert script.main(args) == 2
    assert "was trained for another target" in capsys.readouterr().err
    assert script.main(["--target", str(text_pair_dirs[0]), "--drafter", f"eagle:{saved_drafters / 'medusa'}",
                        "--max-gen", "4"]) == 2
    assert "holds a medusa drafter, not eagle" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.parse_args(["--drafter", "medusa"])
    assert "'medusa' needs a folder: medusa:DIR" in capsys.readouterr().err
    assert benchmark.parse_args(["--drafters", f"eagle:{saved_drafters}"]).drafters == [f"eagle:{saved_drafters}"]
    with pytest.raises(SystemExit, match="trained for another target"):
        benchmark.make_drafters([f"eagle:{saved_drafters / 'eagle'}"], load_gpt2(text_pair_dirs[1]), None)


@pytest.mark.parametrize("name", ["medusa", "eagle"])
def test_the_cost_model_times_a_real_feature_drafter_step(target, name):
    """calibrate_costs hands the drafter the context's features, as the generators do: without
    them a feature drafter proposes nothing and its 'step' would time an empty call."""

    drafter = DRAFTERS[name](target)
    cost = calibrate_costs(target, drafter, gamma_max=2, context_len=16, budget_s=0.1, min_rounds=2)
    assert drafter.forward_calls >= 3 and cost.draft_step_s > 0


def test_a_token_map_added_after_training(text_pair_dirs, text_pair, saved_drafters, tmp_path):
    from conftest import stdlib_texts

    from offline.add_token_map import add_token_map, main
    from spec_decoding.drafters.feature_files import load_feature_drafter

    coverage = add_token_map(saved_drafters / "eagle", tmp_path / "mapped", 500, stdlib_texts()[:2])
    assert 0.5 < coverage < 1
    drafter = load_feature_drafter(tmp_path / "mapped", text_pair[0], "eagle")
    assert len(drafter.draft_vocab) == 500
    prompt = [464, 3139, 286, 4881, 318]
    result = speculative_sampling_greedy(text_pair[0], drafter, prompt, 12, 3)
    assert result.tokens == autoregressive_generate(text_pair[0], prompt, 12).tokens
    assert main(["--drafter", str(saved_drafters / "medusa"), "--out", str(tmp_path / "x"), "--size", "5"]) == 2
    assert main(["--drafter", str(saved_drafters / "eagle"), "--out", str(tmp_path / "mapped"), "--size", "5"]) == 2
    assert not (tmp_path / "x").exists()
