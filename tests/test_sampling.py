"""Temperature, top-k and top-p against transformers' logits processors (the reference)."""

import pytest
import torch

from spec_decoding.sampling import logits_to_probs, next_token, sample


def reference_probs(logits, temperature, top_k, top_p):
    # imported here: transformers takes seconds to import, and every test worker imports this module
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    scores = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k is not None:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p is not None:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return torch.softmax(scores, dim=-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.5])
@pytest.mark.parametrize("top_k", [None, 1, 5, 40])
@pytest.mark.parametrize("top_p", [None, 0.5, 0.9, 1.0])
def test_matches_transformers(temperature, top_k, top_p):
    logits = torch.randn(8, 100, generator=torch.Generator().manual_seed(0)) * 3
    ours = logits_to_probs(logits, temperature, top_k, top_p)
    torch.testing.assert_close(ours, reference_probs(logits, temperature, top_k, top_p), atol=1e-6, rtol=0)
    torch.testing.assert_close(ours.sum(-1), torch.ones(8))


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()
    kept = lambda p: (logits_to_probs(logits, top_p=p) > 0).sum().item()  # noqa: E731
    assert [kept(p) for p in (0.1, 0.5, 0.51, 0.8, 0.81, 0.95, 0.96, 1.0)] == [1, 1, 2, 2, 3, 3, 4, 4]
    torch.testing.assert_close(logits_to_probs(logits, top_p=0.8), torch.tensor([0.625, 0.375, 0, 0]))


def test_greedy_and_sampling():
    logits = torch.tensor([0.1, 2.0, -1.0, 1.9])
    assert next_token(logits, temperature=0) == 1
    assert next_token(logits, temperature=1.0, top_k=1) == 1
    draws = sample(logits_to_probs(logits.expand(4000, 4), top_k=2), torch.Generator().manual_seed(0))
    assert set(draws.tolist()) == {1, 3}
    share = (draws == 1).double().mean().item()
    expected = torch.softmax(torch.tensor([2.0, 1.9]), 0)[0].item()
    assert abs(share - expected) < 0.03
