"""Speculative sampling is lossless: its output follows the target's distribution exactly.

With a 16-token vocabulary the exact distribution of the first three generated tokens (4,096
outcomes) can be enumerated from the target's own probabilities. Thousands of speculative samples
are compared with it by a chi-square test. The same test must reject the draft's samples, and
the classic bug of resampling from p instead of norm(max(0, p - q)) (notebook 06, with
the other bugs of the zoo): so it has the power to fail.
"""

from functools import partial

import pytest
import torch
from conftest import TINY_VOCAB

from spec_decoding import (AutoGamma, CostModel, GammaPolicy, autoregressive_generate, logits_to_probs,
                           modified_rejection_sampling, residual_distribution, speculative_sampling)
from spec_decoding.policies.costs import describe_model
from spec_decoding.checks import check_lossless, chi_square_p_value, exact_distribution

V = TINY_VOCAB.vocab_size
PROMPT = [1, 2, 3]
N_TOKENS = 3
# Samples: the 1,000 at which the bug zoo's check catches every sampling bug it plants on this pair
# and prompt at p < 1e-6 (notebook 06's asserts); below that some go unseen (at 500: the greedy
# draft, resampling from p).
SETTINGS = {  # name: (sampling settings, gamma, samples)
    "temperature 1": (dict(temperature=1.0), 2, 1000),
    "temperature 0.7, top-k 6, top-p 0.9": (dict(temperature=0.7, top_k=6, top_p=0.9), 1, 1000),
}


@pytest.fixture(scope="module")
def pair(unrelated_pair):
    return unrelated_pair  # conftest: two unrelated models agreeing about half the time


def speculative(target, draft, gamma):
    return partial(speculative_sampling, target, draft, gamma=gamma)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_speculative_samples_follow_the_target_distribution(pair, name):
    target, draft = pair
    settings, gamma, n = SETTINGS[name]
    exact = exact_distribution(target, PROMPT, N_TOKENS, settings)
    assert exact.shape == (V,) * N_TOKENS and exact.sum().item() == pytest.approx(1.0)
    result = check_lossless(speculative(target, draft, gamma), target, PROMPT, N_TOKENS, settings,
                            samples=n, seed=0)
    assert result.passed and result.p_value > 1e-3, result.message

    # Power: the draft's own samples, half as many, are clearly told apart (its total variation
    # from p, estimated from fewer samples, still exceeds the speculative samples').
    draft_result = check_lossless(partial(autoregressive_generate, draft), target, PROMPT, N_TOKENS,
                                  settings, samples=n // 2, seed=1)
    assert not draft_result.passed and draft_result.p_value < 1e-6
    assert draft_result.total_variation > result.total_variation


def test_exact_distribution_by_hand(pair):
    """The batched enumeration equals the chain rule computed one prefix at a time."""
    target, _ = pair
    settings = dict(temperature=0.7, top_k=6, top_p=0.9)
    exact = exact_distribution(target, PROMPT, 2, settings)
    with torch.inference_mode():
        p1 = logits_to_probs(target(torch.tensor([PROMPT]))[0, -1].double(), **settings)
        for t1 in (0, 5, 11):
            p2 = logits_to_probs(target(torch.tensor([PROMPT + [t1]]))[0, -1].double(), **settings)
            torch.testing.assert_close(exact[t1], (p1[t1] * p2).double(), atol=1e-6, rtol=1e-4)


def random_distributions(rows, seed, sharpness=2.0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(sharpness * torch.randn(rows, 6, generator=g, dtype=torch.float64), -1).float()


def test_one_round_against_random_p_and_q():
    """Leviathan's Theorem: the first token of a round is distributed as p[0]; a token that
    follows an accepted draft token is distributed as the next row of p (here p does not depend
    on the prefix); the acceptance probability is sum(min(p, q))."""
    g = torch.Generator().manual_seed(0)
    p, q = random_distributions(3, seed=1), random_distributions(2, seed=2)  # gamma = 2
    n_rounds = 20000
    first, second, accepted_first = [], [], 0
    for _ in range(n_rounds):
        draft_tokens = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(2)]
        verdict = modified_rejection_sampling(p, q, draft_tokens, g)
        n = verdict.n_accepted
        out = draft_tokens[:n] + [verdict.next_token]
        first.append(out[0])
        accepted_first += n >= 1
        if n >= 1:
            second.append(out[1])
    for observed, probs in ((first, p[0]), (second, p[1])):
        assert chi_square_p_value(torch.bincount(torch.tensor(observed), minlength=6), probs) > 1e-3
    from scipy import stats  # here, not at the top: importing it costs each test worker seconds

    expected_accept = torch.minimum(p[0], q[0]).sum().item()
    assert stats.binomtest(accepted_first, n_rounds, expected_accept).pvalue > 1e-3
    # and the test can fail: the first token is not distributed as q[0]
    assert chi_square_p_value(torch.bincount(torch.tensor(first), minlength=6), q[0]) < 1e-6


def test_bonus_token_when_everything_is_accepted():
    """p == q: every draft token is accepted and the bonus token is drawn from p[gamma]."""
    g = torch.Generator().manual_seed(0)
    p = random_distributions(3, seed=3)
    bonus = []
    for _ in range(6000):
        draft_tokens = [int(torch.multinomial(p[i], 1, generator=g)) for i in range(2)]
        verdict = modified_rejection_sampling(p, p[:2], draft_tokens, g)
        assert verdict.n_accepted == 2 and verdict.residual is None
        bonus.append(verdict.next_token)
    assert chi_square_p_value(torch.bincount(torch.tensor(bonus), minlength=6), p[2]) > 1e-3


def test_residual_distribution():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.2, 0.5, 0.1, 0.2])
    torch.testing.assert_close(residual_distribution(p, q), torch.tensor([0.75, 0.0, 0.25, 0.0]))
    # p == q: max(0, p - q) is all zero; fall back to p
    torch.testing.assert_close(residual_distribution(p, p), p)


class PastDependentGamma(GammaPolicy):
    """Chooses g in 0..3 from the outcomes of earlier rounds (plain steps included), so the
    draft length changes from round to round and from sample to sample."""
    gamma_max = 3

    def __init__(self):
        self.rounds, self.accepted, self.chosen = 0, 0, []

    def next_gamma(self):
        self.chosen.append((self.rounds + self.accepted) % 4)
        return self.chosen[-1]

    def update(self, drafted, accepted):
        self.rounds += 1
        self.accepted += accepted


def marginal_auto_gamma(target, draft):
    """AutoGamma with costs at which drafting barely pays for this pair: it switches on and off."""
    return AutoGamma(CostModel(target=describe_model(target), draft=describe_model(draft),
                               draft_step_s=0.03, target_score_s=[0.1, 0.12, 0.14, 0.16]))


@pytest.mark.parametrize("make_policy,lengths", [(lambda t, d: PastDependentGamma(), {0, 1, 2}),
                                                 (marginal_auto_gamma, {0, 1})])
def test_a_gamma_policy_keeps_sampling_lossless(pair, make_policy, lengths):
    """The policy's state carries over from sample to sample, so g varies within and between
    samples; g depends only on the past, so the output still follows the target exactly. (1,000
    samples, as above: the bug zoo's sampling bugs on this pair are caught at p < 1e-6 there.)"""
    target, draft = pair
    settings = SETTINGS["temperature 1"][0]
    policy, gammas = make_policy(target, draft), []

    def generate(prompt, n_tokens, **kwargs):
        result = speculative_sampling(target, draft, prompt, n_tokens, policy, **kwargs)
        gammas.extend(result.stats.gamma_by_round)
        return result

    result = check_lossless(generate, target, PROMPT, N_TOKENS, settings, samples=SETTINGS["temperature 1"][2],
                            seed=5)
    assert lengths <= set(gammas)  # plain steps and several draft lengths (3 tokens: g <= 2)
    assert result.passed and result.p_value > 1e-3, result.message
