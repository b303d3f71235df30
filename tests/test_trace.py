"""The per-round trace (trace=True) agrees with the run it records, and its web page is complete."""

import re

import pytest
import torch

from gpt2 import encode, load_gpt2
from spec_decoding import autoregressive_generate, speculative_sampling, speculative_sampling_greedy
from spec_decoding.result import FROM_BONUS, FROM_CORRECTION, FROM_TARGET
from spec_decoding.trace import ACCEPTED, REJECTED, UNJUDGED, render_html

PROMPT = "def parse(text):\n    "


@pytest.fixture(scope="module")
def trained(trained_pair_dirs):
    return tuple(load_gpt2(d) for d in trained_pair_dirs)


@pytest.fixture(scope="module")
def sampled(trained):
    target, draft = trained
    return speculative_sampling(target, draft, encode(PROMPT), 60, gamma=4, temperature=1.0,
                                generator=torch.Generator().manual_seed(0), trace=True)


def check_trace_matches_stats(result):
    trace, stats = result.trace, result.stats
    assert sum(1 for r in trace.rounds if r.drafted) == stats.rounds  # stats skip plain target steps
    assert trace.tokens_accepted == stats.tokens_accepted
    assert trace.alpha == pytest.approx(stats.alpha)
    assert [a for a, _ in trace.acceptance_by_position()] == stats.accepted_by_position
    assert [d for _, d in trace.acceptance_by_position()] == stats.drafted_by_position
    out = trace.output_tokens()
    assert [t for t, *_ in out] == result.tokens
    assert [s for _, s, *_ in out] == stats.token_sources
    for r in trace.rounds:
        verdicts = [d.verdict for d in r.drafted]
        assert verdicts == ([ACCEPTED] * r.n_accepted + [REJECTED] * (r.n_accepted < len(r.drafted))
                            + [UNJUDGED] * max(0, len(r.drafted) - r.n_accepted - 1))
        assert r.next_source == (FROM_TARGET if not r.drafted else FROM_BONUS
                                 if r.n_accepted == len(r.drafted) else FROM_CORRECTION)


def test_sampled_trace_agrees_with_the_run(sampled):
    check_trace_matches_stats(sampled)
    rejected = 0
    for r in sampled.trace.rounds:
        for d in r.drafted:
            assert d.accept_probability == pytest.approx(min(1.0, d.p / d.q))
            if d.verdict == ACCEPTED:
                assert d.draw < d.accept_probability
            elif d.verdict == REJECTED:
                assert d.draw >= d.accept_probability
                rejected += 1
            else:
                assert d.draw is None
        if r.next_source == FROM_CORRECTION:  # drawn from the residual: p > q there, so mass > 0
            assert r.next_token in [t for t, _ in r.candidates] or r.candidates[-1][1] > 0
    assert rejected > 0 and sampled.trace.tokens_accepted > 0, "the trained pair should do both"


def test_trace_does_not_change_the_output(trained, sampled):
    target, draft = trained
    plain = speculative_sampling(target, draft, encode(PROMPT), 60, gamma=4, temperature=1.0,
                                 generator=torch.Generator().manual_seed(0))
    assert plain.tokens == sampled.tokens and plain.trace is None


def test_greedy_trace_agrees_with_the_run(trained):
    target, draft = trained
    result = speculative_sampling_greedy(target, draft, encode(PROMPT), 40, gamma=3, trace=True)
    check_trace_matches_stats(result)
    assert result.tokens == autoregressive_generate(target, encode(PROMPT), 40).tokens
    for r in result.trace.rounds:
        # The target's token is its argmax: the first of the candidates recorded for it.
        assert r.candidates[0][0] == r.next_token
        for d in r.drafted:
            assert d.draw is None and d.q is None
            assert d.accept_probability == {ACCEPTED: 1.0, REJECTED: 0.0, UNJUDGED: None}[d.verdict]


def test_page_is_self_contained_and_has_every_round(sampled):
    page = render_html(sampled.trace, pair="test pair")
    rounds = len(re.findall(r'<tr class="round">', page))
    assert rounds == len(sampled.trace.rounds) > 0
    assert f'data-rounds="{rounds}"' in page
    # Nothing to fetch: no external scripts, styles, fonts or images.
    assert not re.search(r"<(script|img|link|iframe)[^>]*\b(src|href)=", page)
    assert "url(" not in page and "@import" not in page
    assert re.findall(r"https?://[^\s\"']+", page) == ["http://www.w3.org/2000/svg"]  # a namespace name
    # One span per output token in the text, plus one per drafted and target token in the rows.
    n_spans = len(re.findall(r'<span class="tok [^"]*" data-k=', page))
    assert n_spans == len(sampled.tokens) + sum(len(r.drafted) + 1 for r in sampled.trace.rounds)


def test_command_line_writes_the_page_and_never_overwrites(trained_pair_dirs, tmp_path, capsys):
    import spec_decoding_generate as cli

    target_dir, draft_dir = trained_pair_dirs
    page = tmp_path / "trace.html"
    args = ["--target", str(target_dir), "--draft", str(draft_dir), "--prompt", PROMPT,
            "--max-gen", "12", "--temperature", "1", "--seed", "3", "--html", str(page)]
    assert cli.main(args) == 0
    text = page.read_text()
    assert "round by round" in text and str(target_dir) in text
    page.write_text("mine")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(args)
    assert exit_info.value.code == 2
    assert "already exists; pass --force" in capsys.readouterr().err
    assert page.read_text() == "mine"
    assert cli.main(args + ["--force"]) == 0
    assert page.read_text() == text  # same seed, same page
