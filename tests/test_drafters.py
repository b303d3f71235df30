"""Every drafter keeps speculative decoding exact: greedy output identical to the target's own,
sampled output distributed as the target's (the chi-square test of test_lossless, which must also
catch a drafter that lies about its q), caches equal to a fresh forward after every round, and a
clear error for every bad input."""

from functools import partial

import pytest
import torch
from conftest import TINY, hf_gpt2
from test_lossless import SETTINGS

import spec_decoding.algorithms.greedy
import spec_decoding.algorithms.speculative
from gpt2 import load_gpt2
from offline.random_weights import save_agreeing_pair, save_random_checkpoint
from spec_decoding import (autoregressive_generate, Observers, SamplingParams, speculative_sampling,
                           speculative_sampling_greedy)
from spec_decoding.checks.bug_zoo import DrafterReportingUnfilteredQ  # samples after top-k, reports q before
from spec_decoding.checks import (check_caches_after_every_round, check_lossless,
                                  chi_square_p_value)
from spec_decoding.drafters import (Drafter, LayerSkipDrafter, ModelDrafter, NGramDrafter,
                                    as_drafter)
from spec_decoding.result import FROM_DRAFT
from spec_decoding.algorithms.rejection import modified_rejection_sampling, point_masses

TARGET_CFG = TINY.with_(n_layer=4)
PROMPT = [5, 17, 42, 8, 99, 3]  # no token repeats: the n-gram drafter's first round finds nothing


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A 4-block target and a draft that is exactly its first 2 blocks (save_agreeing_pair)."""
    root = tmp_path_factory.mktemp("drafters")
    dirs = save_agreeing_pair(root / "target", root / "draft", TARGET_CFG, draft_n_layer=2,
                              damping=0.1, seed=11, std=0.2, embedding_std=0.3)
    return tuple(load_gpt2(d) for d in dirs)


@pytest.fixture(scope="module")
def baseline(pair):
    return autoregressive_generate(pair[0], PROMPT, 40).tokens


class Recording(Drafter):
    """Wraps a drafter and records, per round, how many tokens were asked for and proposed."""

    def __init__(self, inner: Drafter):
        self.inner = inner
        self.vocab_size, self.n_positions, self.device = inner.vocab_size, inner.n_positions, inner.device
        self.rounds = []

    @property
    def forward_calls(self):
        return self.inner.forward_calls

    def start(self, prompt, max_gen):
        self.inner.start(prompt, max_gen)

    def propose(self, tokens, num_tokens, *args, **kwargs):
        draft_tokens, draft_probs = self.inner.propose(tokens, num_tokens, *args, **kwargs)
        self.rounds.append((num_tokens, len(draft_tokens)))
        return draft_tokens, draft_probs

    def roll_back(self, length):
        self.inner.roll_back(length)


DRAFTERS = {
    "model": lambda target, draft: ModelDrafter(draft),
    "ngram": lambda target, draft: NGramDrafter(max_ngram=3),
    "ngram-1": lambda target, draft: NGramDrafter(max_ngram=1, num_tokens=2),
    "layerskip": lambda target, draft: LayerSkipDrafter(target, 2),
    "layerskip-1": lambda target, draft: LayerSkipDrafter(target, 1),
}


# ------------------------------------------------------------------------------ greedy

@pytest.mark.parametrize("gamma", [1, 2, 4, 8])
@pytest.mark.parametrize("name", list(DRAFTERS))
def test_greedy_equals_target_greedy(pair, baseline, name, gamma):
    target, draft = pair
    drafter = Recording(DRAFTERS[name](target, draft))
    result = speculative_sampling_greedy(target, drafter, PROMPT, 40, gamma)
    assert result.tokens == baseline
    s = result.stats
    assert s.tokens_accepted > 0 and s.rejections > 0  # both paths ran
    assert s.token_sources.count(FROM_DRAFT) == s.tokens_accepted
    assert len(s.token_sources) - s.tokens_accepted == s.target_calls
    assert sum(proposed for _, proposed in drafter.rounds) == s.tokens_drafted
    if name.startswith("ngram"):
        assert s.draft_calls == 0
        # rounds where the lookup found nothing (the first one: the prompt has no repeats)
        assert drafter.rounds[0] == (gamma, 0)
    else:
        assert s.draft_calls == s.tokens_drafted  # one forward per draft token


def test_ngram_no_match_rounds_are_plain_target_steps(pair):
    """Rounds where the lookup finds nothing happen, and each is one target call."""
    target, _ = pair
    drafter = Recording(NGramDrafter(3))
    result = speculative_sampling_greedy(target, drafter, PROMPT, 30, 4)
    no_match = sum(1 for asked, proposed in drafter.rounds if asked and not proposed)
    assert no_match >= 1
    assert result.stats.target_calls == result.stats.rounds + sum(1 for _, p in drafter.rounds if not p)


def test_layerskip_drafts_exactly_like_the_equal_draft_model(pair):
    """The pair's draft *is* the target's first 2 blocks + ln_f + head, so LayerSkipDrafter(target, 2)
    must propose exactly what the draft model proposes: same tokens, same statistics, also when
    sampling (same q, so the same random numbers give the same draws)."""
    target, draft = pair
    a = speculative_sampling(target, draft, PROMPT, 30, 3,
                             sampling=SamplingParams(temperature=0.8, top_k=30, generator=torch.Generator().manual_seed(5)))
    b = speculative_sampling(target, LayerSkipDrafter(target, 2), PROMPT, 30, 3,
                             sampling=SamplingParams(temperature=0.8, top_k=30, generator=torch.Generator().manual_seed(5)))
    assert a.tokens == b.tokens
    assert a.stats.token_sources == b.stats.token_sources
    assert 0 < a.stats.tokens_accepted < a.stats.tokens_drafted


def test_layerskip_cache_is_made_by_the_targets_own_factory(tmp_path):
    """In bfloat16 on a CPU, GPT2.new_kv_cache keeps keys and values in float32. LayerSkipDrafter
    used to build its cache itself in the model's dtype: its attention then ran in bfloat16, and it
    drafted differently from the equal draft model. Now it holds float32 keys for its n_layers
    blocks only, and proposes exactly what the equal bfloat16 draft model proposes."""
    dirs = save_agreeing_pair(tmp_path / "target", tmp_path / "draft", TARGET_CFG, draft_n_layer=2,
                              damping=0.1, seed=11, std=0.2, embedding_std=0.3)
    target, draft = (load_gpt2(d, device="cpu", dtype="bfloat16") for d in dirs)
    skip, model = LayerSkipDrafter(target, 2), ModelDrafter(draft)
    for drafter in (skip, model):
        drafter.start(PROMPT, 20)
    assert skip.cache.keys[0].dtype == target.new_kv_cache().keys[0].dtype == torch.float32
    assert len(skip.cache.keys) == 2
    tokens = list(PROMPT)
    for _ in range(10):  # one token at a time, as the draft steps: the logits agree exactly
        a, b = skip.next_logits(tokens), model.next_logits(tokens)
        assert torch.equal(a, b)
        tokens.append(int(a.argmax()))


def test_layerskip_shares_the_targets_weights(pair):
    target, _ = pair
    drafter = LayerSkipDrafter(target, 2)
    assert drafter.model is target
    n_params = sum(p.numel() for p in target.parameters())
    LayerSkipDrafter(target, 3)  # making more drafters adds no parameters anywhere
    assert sum(p.numel() for p in target.parameters()) == n_params


@pytest.mark.parametrize("exit_layer", [1, 3])
def test_exit_layer_logits_equal_transformers_hidden_state_through_the_head(tmp_path, exit_layer):
    """GPT2.forward(exit_layer=k) = ln_f and the head applied after the first k blocks, as
    transformers computes them (hidden_states[k] is the residual stream after k blocks)."""
    folder = save_random_checkpoint(tmp_path, TARGET_CFG, seed=4, std=0.2, embedding_std=0.3)
    ours = load_gpt2(folder)
    hf = hf_gpt2(folder)
    idx = torch.tensor([PROMPT])
    with torch.inference_mode():
        hidden = hf(idx, output_hidden_states=True).hidden_states[exit_layer]
        want = hf.lm_head(hf.transformer.ln_f(hidden))
        got = ours(idx, exit_layer=exit_layer)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_ngram_lookup():
    d = NGramDrafter(max_ngram=3)
    # the longest n-gram wins, and its most recent earlier occurrence
    assert d.propose([1, 2, 3, 7, 2, 3, 8, 1, 2, 3], 3) == ([7, 2, 3], None)
    assert d.propose([9, 2, 3, 4, 8, 3, 5, 2, 3], 2) == ([4, 8], None)  # [2, 3] beats [3]
    assert d.propose([4, 3, 6, 3], 5) == ([6, 3], None)  # only 1-gram [3]; what follows is short
    assert d.propose([1, 2, 3], 4) == ([], None)  # nothing repeats
    assert d.propose([1, 2, 1], 0) == ([], None)
    assert NGramDrafter(max_ngram=1).propose([5, 6, 5, 6, 5], 2) == ([6, 5], None)
    assert NGramDrafter(num_tokens=1).propose([5, 6, 5], 4) == ([6], None)


# ------------------------------------------------------------------------------ lossless

LOSSLESS_PROMPT = [1, 2, 3, 1, 2]  # the n-gram drafter matches [1, 2] at once, later rounds vary


@pytest.fixture(scope="module")
def lossless_pair(unrelated_pair):
    return unrelated_pair  # conftest: two unrelated models agreeing about half the time


def lossless_check(target, drafter, settings, gamma, n, seed=0):
    """check_lossless on the first 3 tokens after LOSSLESS_PROMPT; also returns how many tokens
    the drafter proposed in all."""
    drafted = []

    def generate(prompt, max_gen, **kwargs):
        result = speculative_sampling(target, drafter, prompt, max_gen, gamma, **kwargs)
        drafted.append(result.stats.tokens_drafted)
        return result

    return check_lossless(generate, target, LOSSLESS_PROMPT, 3, settings, samples=n, seed=seed), sum(drafted)


LOSSLESS_DRAFTERS = {  # ModelDrafter: test_lossless.py (a GPT2 draft is wrapped in one)
    "ngram": lambda target, draft: NGramDrafter(max_ngram=2),
    "layerskip": lambda target, draft: LayerSkipDrafter(target, 1),
}


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("name", list(LOSSLESS_DRAFTERS))
def test_every_drafter_is_lossless(lossless_pair, name, setting):
    target, draft = lossless_pair
    settings, gamma, n = SETTINGS[setting]
    n //= 2  # half of test_lossless's samples: still catches a 0.14 total variation (the next test)
    result, drafted = lossless_check(target, LOSSLESS_DRAFTERS[name](target, draft), settings, gamma, n)
    assert drafted > n // 2  # the drafter really drafted
    assert result.passed and result.p_value > 1e-3, f"{name}: {result.message}"


def test_a_drafter_that_lies_about_q_is_caught(lossless_pair):
    """Top-k 3 keeps ~70% of the draft's mass here: claiming q before top-k, it accepts its tokens
    too often (the first token alone is off by total variation 0.14, computed exactly)."""
    target, draft = lossless_pair
    result, _ = lossless_check(target, DrafterReportingUnfilteredQ(draft), dict(temperature=1.0, top_k=3), 1, 1500)
    assert not result.passed and result.p_value < 1e-6, result.message


def test_always_accepting_a_point_mass_proposal_is_caught(lossless_pair, monkeypatch):
    """The n-gram bug students make: accept a deterministic proposal whenever p(x) > 0."""
    target, _ = lossless_pair
    settings, gamma, n = SETTINGS["temperature 1"]
    monkeypatch.setattr(spec_decoding.algorithms.speculative, "point_masses",
                        lambda tokens, vocab, device=None: torch.zeros(len(tokens), vocab))  # r * 0 < p
    result, _ = lossless_check(target, NGramDrafter(2), settings, gamma, n)
    assert not result.passed and result.p_value < 1e-6, result.message


def test_point_mass_round_accepts_with_probability_p_and_resamples_p_without_x():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(2 * torch.randn(2, 6, generator=torch.Generator().manual_seed(1)), -1)
    q = point_masses([4], 6)
    torch.testing.assert_close(q, torch.tensor([[0.0, 0, 0, 0, 1, 0]]))
    n_rounds, accepted, replacements = 20000, 0, []
    for _ in range(n_rounds):
        verdict = modified_rejection_sampling(p, q, [4], g)
        n, token = verdict.n_accepted, verdict.next_token
        accepted += n
        if n == 0:
            replacements.append(token)
    from scipy import stats
    assert stats.binomtest(accepted, n_rounds, p[0, 4].item()).pvalue > 1e-3
    without_x = p[0].clone()
    without_x[4] = 0
    observed = torch.bincount(torch.tensor(replacements), minlength=6)
    assert observed[4] == 0
    others = torch.arange(6) != 4
    assert chi_square_p_value(observed[others], without_x[others] / without_x.sum()) > 1e-3


# ------------------------------------------------------------------------------ caches

def check_cache(model, cache, sequence):
    """Each layer of the cache holds what a fresh full forward over sequence[:cache.length] gives
    (a layer-skip cache has only the first layers)."""
    fresh = model.new_kv_cache()
    with torch.inference_mode():
        model(torch.tensor([sequence[:cache.length]]), fresh)
    for layer in range(len(cache.keys)):
        for got, want in ((cache.keys[layer], fresh.keys[layer]), (cache.values[layer], fresh.values[layer])):
            torch.testing.assert_close(got[:, :, :cache.length], want[:, :, :cache.length], atol=1e-5, rtol=0)


@pytest.mark.parametrize("module, run", [
    (spec_decoding.algorithms.greedy, lambda t, d, seed, cb: speculative_sampling_greedy(t, d, PROMPT, 30, 3,
                                                                                         observers=Observers(on_tokens=cb))),
    (spec_decoding.algorithms.speculative, lambda t, d, seed, cb: speculative_sampling(t, d, PROMPT, 30, 3,
                                                                                       sampling=SamplingParams(generator=torch.Generator().manual_seed(seed)),
                                                                                       observers=Observers(on_tokens=cb))),
])
@pytest.mark.parametrize("name", ["model", "ngram", "layerskip"])
def test_caches_equal_a_fresh_forward_after_every_round(monkeypatch, pair, module, run, name):
    target, draft = pair
    real_roll_back = module.roll_back
    rounds = 0
    for seed in range(2):
        drafter = DRAFTERS[name](target, draft)
        sequence = list(PROMPT)

        def roll_back_and_check(target_cache, the_drafter, seq_len):
            nonlocal rounds
            real_roll_back(target_cache, the_drafter, seq_len)
            assert the_drafter is drafter and seq_len == len(sequence)
            assert target_cache.length == seq_len - 1  # all but the last token, which is fed next
            check_cache(target, target_cache, sequence)
            if hasattr(drafter, "cache"):
                assert drafter.cache.length <= seq_len - 1
                check_cache(drafter.model, drafter.cache, sequence)
            rounds += 1

        monkeypatch.setattr(module, "roll_back", roll_back_and_check)
        run(target, drafter, seed, lambda tokens, sources: sequence.extend(tokens))
    assert rounds > 4


@pytest.mark.parametrize("name", ["ngram", "layerskip"])
def test_check_caches_after_every_round_handles_model_free_and_layer_skip_drafters(pair, name):
    """spec_decoding.checks watches the target's forward; a layer-skip drafter calls that same
    model with exit_layer and its own, shorter cache, which is checked layer by layer too."""
    target, draft = pair
    drafter = DRAFTERS[name](target, draft)
    result = check_caches_after_every_round(partial(speculative_sampling, target, drafter, gamma=3),
                                            target, None, PROMPT, 30, dict(temperature=1.0))
    assert result.passed, result.message
    assert max(s.round for s in result.snapshots) > 4
    # each cache seen is checked once more at the end: the target's, and the layer-skip drafter's
    assert len([s for s in result.snapshots if s.at_end]) == (2 if name == "layerskip" else 1)


# ------------------------------------------------------------------------------ bad input

@pytest.fixture(scope="module")
def other_vocab_model(tmp_path_factory):
    return load_gpt2(save_random_checkpoint(tmp_path_factory.mktemp("v50"), TINY.with_(vocab_size=50)))


class FixedVocabDrafter(Drafter):
    vocab_size = 50

    def propose(self, tokens, num_tokens, *args, **kwargs):
        return [], None


@pytest.mark.parametrize("generate", [
    lambda t, d: speculative_sampling_greedy(t, d, PROMPT, 10, 4),
    lambda t, d: speculative_sampling(t, d, PROMPT, 10, 4),
])
def test_a_drafter_with_another_vocabulary_is_refused(pair, other_vocab_model, generate):
    for drafter in (ModelDrafter(other_vocab_model), FixedVocabDrafter()):
        with pytest.raises(ValueError, match=r"vocabulary \(50 tokens\) differs from the target's \(100\)"):
            generate(pair[0], drafter)


@pytest.mark.parametrize("n_layers", [0, -1, 4, 5, 2.0, True, None])
def test_layerskip_needs_n_layers_between_1_and_n_layer_minus_1(pair, n_layers):
    with pytest.raises(ValueError, match=r"n_layers must be an int between 1 and n_layer - 1 = 3"):
        LayerSkipDrafter(pair[0], n_layers)


@pytest.mark.parametrize("max_ngram", [0, -2, 1.5, "3"])
def test_ngram_needs_max_ngram_at_least_1(max_ngram):
    with pytest.raises(ValueError, match="max_ngram must be an int >= 1"):
        NGramDrafter(max_ngram=max_ngram)
    with pytest.raises(ValueError, match="num_tokens must be an int >= 1 or None"):
        NGramDrafter(num_tokens=0)


def test_draft_must_be_a_model_or_a_drafter(pair):
    with pytest.raises(TypeError, match="draft must be a GPT2 model or a Drafter"):
        speculative_sampling_greedy(pair[0], "gpt2", PROMPT, 10, 4)
    with pytest.raises(TypeError, match="ModelDrafter needs a GPT2 model"):
        ModelDrafter("gpt2")
    assert isinstance(as_drafter(pair[1]), ModelDrafter)


def test_a_drafter_without_propose_says_so(pair):
    with pytest.raises(NotImplementedError, match="Drafter must implement propose"):
        speculative_sampling_greedy(pair[0], Drafter(), PROMPT, 10, 4)


def test_a_new_drafter_kind_is_added_once_and_both_scripts_take_it(monkeypatch, pair, tmp_path):
    """spec_decoding.cli.DRAFTER_KINDS is the one list: a kind registered there is accepted by
    benchmark.py --drafters and spec_decoding_generate.py --drafter, and built by name."""
    import benchmark
    import spec_decoding_generate
    from spec_decoding import cli

    target, _ = pair
    monkeypatch.setitem(cli.DRAFTER_KINDS, "lookup", cli.DrafterKind(
        build=lambda n, target, draft: NGramDrafter(max_ngram=n), describe=lambda n: f"lookup of {n}",
        number="the n-gram length", default=2))
    assert benchmark.parse_args(["--drafters", "lookup", "lookup:4", "--out", str(tmp_path)]).drafters == [
        "lookup:2", "lookup:4"]
    args = spec_decoding_generate.parse_args(["--drafter", "lookup"])
    drafter, line = spec_decoding_generate.make_drafter(args, target, target.wte.weight.device, "auto")
    assert isinstance(drafter, NGramDrafter) and drafter.max_ngram == 2 and line == "lookup:2 (lookup of 2)"
    assert benchmark.make_drafters(["lookup:4"], target, None)["lookup:4"].max_ngram == 4
