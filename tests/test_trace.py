"""The per-round trace (trace=True) agrees with the run it records, and its web page is complete."""

import re

import pytest
import torch

from gpt2 import encode, load_gpt2
from spec_decoding import (GREEDY, autoregressive_generate, Observers, SamplingParams, speculative_sampling,
                           speculative_sampling_greedy, tree_speculative_sampling)
from spec_decoding.result import FROM_BONUS, FROM_CORRECTION, FROM_DRAFT_BRANCH, FROM_TARGET
from spec_decoding.presentation.trace import ACCEPTED, REJECTED, UNJUDGED, number
from spec_decoding.presentation.trace_page import render_html
from spec_decoding.drafters.token_tree import tree_size

PROMPT = "def parse(text):\n    "


@pytest.fixture(scope="module")
def trained(trained_pair_dirs):
    return tuple(load_gpt2(d) for d in trained_pair_dirs)


@pytest.fixture(scope="module")
def sampled(trained):
    target, draft = trained
    return speculative_sampling(target, draft, encode(PROMPT), 60, gamma=4,
                                sampling=SamplingParams(temperature=1.0, generator=torch.Generator().manual_seed(0)),
                                observers=Observers(trace=True))


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
            if d.verdict == UNJUDGED:  # no test happened: nothing to show
                assert d.draw is None and d.accept_probability is None
                continue
            assert d.accept_probability == pytest.approx(min(1.0, d.p / d.q))
            if d.verdict == ACCEPTED:
                assert d.draw < d.accept_probability
            else:
                assert d.verdict == REJECTED and d.draw >= d.accept_probability
                rejected += 1
        if r.next_source == FROM_CORRECTION:  # drawn from the residual: p > q there, so mass > 0
            assert r.next_token in [t for t, _ in r.candidates] or r.candidates[-1][1] > 0
    assert rejected > 0 and sampled.trace.tokens_accepted > 0, "the trained pair should do both"


def test_trace_does_not_change_the_output(trained, sampled):
    target, draft = trained
    plain = speculative_sampling(target, draft, encode(PROMPT), 60, gamma=4,
                                 sampling=SamplingParams(temperature=1.0, generator=torch.Generator().manual_seed(0)))
    assert plain.tokens == sampled.tokens and plain.trace is None


def test_greedy_trace_agrees_with_the_run(trained):
    target, draft = trained
    result = speculative_sampling_greedy(target, draft, encode(PROMPT), 40, gamma=3,
                                         observers=Observers(trace=True))
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
    page.write_text(text.replace("round by round", "ROUND BY ROUND"))  # the run's own page: run again
    assert cli.main(args) == 0 and page.read_text() == text
    assert "replacing" in capsys.readouterr().err
    page.write_text("mine")  # a file the user made: refused, untouched
    with pytest.raises(SystemExit) as exit_info:
        cli.main(args)
    assert exit_info.value.code == 2
    assert "is not a trace page an earlier run wrote; pass --force" in capsys.readouterr().err
    assert page.read_text() == "mine"
    assert cli.main(args + ["--force"]) == 0
    assert page.read_text() == text  # same seed, same page


# ---------------------------------------------------------------------------------------------
# Token trees: the trace of tree_speculative_sampling, checked against the run's stats and against
# the target's and draft's probabilities from plain causal forwards over the output.

TREE = (2, 2, 1)
ROOT = -1


@pytest.fixture(scope="module")
def tree_sampled(trained):
    target, draft = trained
    return tree_speculative_sampling(target, draft, encode(PROMPT), 40, TREE,
                                     sampling=SamplingParams(temperature=1.0, generator=torch.Generator().manual_seed(0)),
                                     observers=Observers(trace=True))


def plain_probs(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """[len(tokens) + 1, V]: the model's distribution (temperature 1) before each output token and
    after the last, from one ordinary causal forward over prompt + tokens (no tree, no cache)."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + tokens]))[0]
    return torch.softmax(logits[len(prompt) - 1:].float(), dim=-1)


def check_tree_trace_matches_stats(result):
    trace, stats = result.trace, result.stats
    assert len(trace.rounds) == stats.target_calls  # one target forward per round
    assert [r.n_accepted for r in trace.rounds if r.depth] == stats.accepted_depths
    assert [r.depth for r in trace.rounds] == stats.gamma_by_round
    assert trace.tokens_accepted == stats.tokens_accepted
    assert trace.alpha == pytest.approx(stats.alpha)
    assert [a for a, _ in trace.acceptance_by_position()] == stats.accepted_by_position
    assert [d for _, d in trace.acceptance_by_position()] == stats.drafted_by_position
    out = trace.output_tokens()
    assert [t for t, *_ in out] == result.tokens  # the accepted paths and the target's tokens
    assert [s for _, s, *_ in out] == stats.token_sources  # side branches included
    for r in trace.rounds:
        assert len(r.drafted) == tree_size(TREE[:r.depth])  # every node drafted is recorded
        # The path goes down from the root one depth at a time; it holds exactly the accepted nodes.
        assert r.n_accepted == len(r.path)
        assert [r.drafted[i].parent for i in r.path] == ([ROOT] + r.path)[:len(r.path)]
        assert [r.drafted[i].depth for i in r.path] == list(range(1, len(r.path) + 1))
        assert {i for i, d in enumerate(r.drafted) if d.verdict == ACCEPTED} == set(r.path)
        visited = [ROOT] + r.path
        for d in r.drafted:  # only the children of the root and of accepted nodes are judged
            assert (d.verdict != UNJUDGED) <= (d.parent in visited)
        assert r.next_source == (FROM_TARGET if r.depth == 0 else FROM_BONUS if len(r.path) == r.depth
                                 else FROM_CORRECTION)


def rounds_with_context(result):
    """(round, output tokens before it) for the rounds whose whole output reached the output."""
    before = 0
    for r in result.trace.rounds:
        if r.emitted == r.n_accepted + 1:
            yield r, before
        before += r.emitted


def children_of(r, node):
    return [i for i, d in enumerate(r.drafted) if d.parent == node]


def test_sampled_tree_trace_agrees_with_the_run(trained, tree_sampled):
    """Every number of a judged node, recomputed from plain forwards: p and q at its parent's
    position, p' after the earlier siblings' rejections (norm(max(0, p' - q)) each), min(1, p'/q),
    and the draw on the right side of it; the correction's candidates are the last p'."""
    target, draft = trained
    check_tree_trace_matches_stats(tree_sampled)
    prompt = encode(PROMPT)
    p_all = plain_probs(target, prompt, tree_sampled.tokens)
    q_all = plain_probs(draft, prompt, tree_sampled.tokens)
    seen = {ACCEPTED: 0, REJECTED: 0, "later sibling judged": 0, "correction": 0}
    for r, before in rounds_with_context(tree_sampled):
        for depth, node in enumerate([ROOT] + r.path):
            p, q = p_all[before + depth], q_all[before + depth]  # after the path down to node
            residual = p  # p': the target the next child is tested against
            judged = [c for c in children_of(r, node) if r.drafted[c].verdict != UNJUDGED]
            assert judged == children_of(r, node)[:len(judged)]  # tried in order, a prefix
            for c in judged:
                d = r.drafted[c]
                assert d.p == pytest.approx(float(p[d.token]), rel=1e-3, abs=1e-6)
                assert d.q == pytest.approx(float(q[d.token]), rel=1e-3, abs=1e-6)
                assert d.adjusted_p == pytest.approx(float(residual[d.token]), rel=1e-3, abs=1e-6)
                assert d.accept_probability == pytest.approx(min(1.0, d.adjusted_p / d.q))
                if d.verdict == ACCEPTED:
                    assert d.draw < d.accept_probability and c == judged[-1] and c in r.path
                else:
                    assert d.draw >= d.accept_probability
                    residual = torch.clamp(residual - q, min=0)
                    residual = residual / residual.sum() if residual.sum() > 0 else p
                seen[d.verdict] += 1
                seen["later sibling judged"] += c != judged[0]
        assert r.next_p == pytest.approx(float(p_all[before + len(r.path), r.next_token]), rel=1e-3, abs=1e-6)
        if r.next_source == FROM_CORRECTION:  # drawn from the last p' at the stop node
            seen["correction"] += 1
            for token, value in r.candidates:
                assert value == pytest.approx(float(residual[token]), rel=1e-3, abs=1e-5)
            assert r.candidates[0][1] == pytest.approx(float(residual.max()), rel=1e-3)
    for d in (d for r in tree_sampled.trace.rounds for d in r.drafted if d.verdict == UNJUDGED):
        assert d.draw is None and d.accept_probability is None and d.adjusted_p is None
    assert min(seen.values()) > 0, f"the trained pair should do all of these: {seen}"


def test_tree_trace_does_not_change_the_output(trained, tree_sampled):
    target, draft = trained
    plain = tree_speculative_sampling(target, draft, encode(PROMPT), 40, TREE,
                                      sampling=SamplingParams(temperature=1.0, generator=torch.Generator().manual_seed(0)))
    assert plain.tokens == tree_sampled.tokens and plain.trace is None


def test_greedy_tree_trace_agrees_with_the_run(trained):
    """Accepted nodes are the target's argmax after their parent, judged siblings are not, and the
    target's token is its argmax at the stop node (argmax from a plain forward over the output)."""
    target, draft = trained
    prompt = encode(PROMPT)
    result = tree_speculative_sampling(target, draft, prompt, 40, TREE, sampling=GREEDY,
                                       observers=Observers(trace=True))
    check_tree_trace_matches_stats(result)
    assert result.tokens == autoregressive_generate(target, prompt, 40).tokens
    p_all = plain_probs(target, prompt, result.tokens)
    rejected = 0
    for r, before in rounds_with_context(result):
        for depth, node in enumerate([ROOT] + r.path):
            argmax = int(p_all[before + depth].argmax())
            for c in children_of(r, node):
                d = r.drafted[c]
                assert d.draw is None and d.q is None and d.adjusted_p is None
                assert d.p == pytest.approx(float(p_all[before + depth, d.token]), rel=1e-3, abs=1e-6)
                assert d.verdict == (ACCEPTED if d.token == argmax else REJECTED)
                assert d.accept_probability == (1.0 if d.token == argmax else 0.0)
                rejected += d.verdict == REJECTED
        assert r.next_token == int(p_all[before + len(r.path)].argmax()) == r.candidates[0][0]
    for d in (d for r in result.trace.rounds for d in r.drafted if d.verdict == UNJUDGED):
        assert d.accept_probability is None
    assert rejected > 0 and result.trace.tokens_accepted > 0


def test_tree_page_has_every_round_and_node(tree_sampled):
    trace = tree_sampled.trace
    page = render_html(trace, pair="test pair")
    assert len(re.findall(r'<tr class="round">', page)) == len(trace.rounds) > 0
    assert len(re.findall(r'<div class="tree">', page)) == len(trace.rounds)
    assert not re.search(r"<(script|img|link|iframe)[^>]*\b(src|href)=", page)
    assert re.findall(r"https?://[^\s\"']+", page) == ["http://www.w3.org/2000/svg"]
    # One span per output token, one per tree node (with its number), one per target token.
    n_spans = len(re.findall(r'<span class="tok [^"]*" data-k=', page))
    assert n_spans == len(tree_sampled.tokens) + sum(len(r.drafted) + 1 for r in trace.rounds)
    assert len(re.findall(r'data-node="', page)) == sum(len(r.drafted) for r in trace.rounds)
    assert "token tree 2,2,1" in page and "Acceptance by depth" in page and "depth i in the round" in page
    if FROM_DRAFT_BRANCH in tree_sampled.stats.token_sources:
        assert '<span class="tok draft_branch"' in page


@pytest.mark.parametrize("kind", ["greedy", "sampled", "tree greedy", "tree sampled"])
def test_on_round_sees_every_round_and_the_trace_is_one_such_observer(trained, kind):
    """The generators hand each round to their observers (on_round; trace=True subscribes a Trace
    the same way): the reports rebuild the output, one per target call, as the trace records it."""
    target, draft = trained
    reports = []
    settings = dict(max_gen=30, observers=Observers(on_round=reports.append, trace=True))
    if kind.startswith("tree"):
        temperature = 0.0 if "greedy" in kind else 1.0
        result = tree_speculative_sampling(target, draft, encode(PROMPT), branching=(2, 2), **settings,
                                           sampling=SamplingParams(temperature, generator=torch.Generator().manual_seed(0)))
    elif kind == "greedy":
        result = speculative_sampling_greedy(target, draft, encode(PROMPT), gamma=3, **settings)
    else:
        result = speculative_sampling(target, draft, encode(PROMPT), gamma=3, **settings,
                                      sampling=SamplingParams(1.0, generator=torch.Generator().manual_seed(0)))
    assert len(reports) == len(result.trace.rounds) == result.stats.target_calls
    rebuilt = []
    for report, recorded in zip(reports, result.trace.rounds):
        accepted = (report.tree.path_tokens(report.verdict.path) if report.tree is not None
                    else report.draft_tokens[:report.n_accepted])
        rebuilt += accepted + [report.next_token]
        assert rebuilt[:report.n_out] == result.tokens[:report.n_out]
        assert (report.n_accepted, report.next_token) == (recorded.n_accepted, recorded.next_token)
    assert reports[-1].n_out == len(result.tokens) and rebuilt[:len(result.tokens)] == result.tokens


# ---------------------------------------------------------------------------------------------
# Exploring a trace in a REPL


def test_trace_repr_is_one_short_line(sampled, tree_sampled):
    for result in (sampled, tree_sampled):
        trace = result.trace
        text = repr(trace)
        assert "\n" not in text and len(text) < 160, text
        assert f"{len(trace.rounds)} rounds, {len(result.tokens)} tokens, alpha {trace.alpha:.2f}" in text
        assert len(repr(trace.rounds[0])) < 300 and "\n" not in repr(trace.rounds[0])


def test_a_round_prints_readably_with_token_text(sampled):
    """print(trace.rounds[k]): a line per drafted token with its text beside its id and its
    numbers, then the target's token and what it was drawn from."""
    from gpt2 import decode
    rounds = sampled.trace.rounds
    r = next(r for r in rounds if r.next_source == FROM_CORRECTION
             and any(d.verdict == UNJUDGED for d in r.drafted))
    lines = str(r).splitlines()
    assert lines[0] == f"{len(r.drafted)} drafted, {r.n_accepted} accepted; then the target's token."
    assert len(lines) == 2 + len(r.drafted) + 2
    for d, line in zip(r.drafted, lines[2:]):
        assert f"{decode([d.token])!r} #{d.token}" in line and line.rstrip().endswith(d.verdict)
        assert number(d.p) in line
    unjudged = lines[2 + [d.verdict for d in r.drafted].index(UNJUDGED)]
    assert unjudged.split()[-4:] == ["-", "-", "not", "judged"]  # min(1,p/q) and draw: none
    assert f"target's token: {decode([r.next_token])!r} #{r.next_token}, a correction, drawn from the residual" in str(r)
    assert sampled.trace.explain().count("Round ") == len(rounds)


def test_p_and_the_residuals_value_of_the_target_token(sampled):
    """next_p is p(x) in the target's row; next_from_p its value in what it was drawn from: the
    residual norm(max(0, p - q)) after a rejection, p itself after a bonus. The docstring says
    which is which."""
    rounds = [r for r in sampled.trace.rounds if r.emitted == r.n_accepted + 1]
    corrections = [r for r in rounds if r.next_source == FROM_CORRECTION]
    bonuses = [r for r in rounds if r.next_source == FROM_BONUS]
    assert corrections
    for r in bonuses:  # (a 60-token run may have none)
        assert r.next_from_p == pytest.approx(r.next_p, abs=1e-6)
    assert any(abs(r.next_from_p - r.next_p) > 1e-3 for r in corrections)
    assert all(r.next_from_p == pytest.approx(dict(r.candidates).get(r.next_token, r.next_from_p), abs=1e-5)
               for r in corrections)
    assert "residual" in type(sampled.trace.rounds[0]).__doc__ and "next_from_p" in type(sampled.trace.rounds[0]).__doc__


def test_tiny_vocabulary_shows_ids_only(pair_dirs):
    """A model without GPT-2's vocabulary: tokens show as #id, never as a wrong GPT-2 text."""
    target, draft = (load_gpt2(d) for d in pair_dirs)
    result = speculative_sampling(target, draft, [1, 2, 3], 8, gamma=3,
                                  sampling=SamplingParams(temperature=1.0, generator=torch.Generator().manual_seed(0)),
                                  observers=Observers(trace=True))
    text = str(result.trace.rounds[0])
    assert re.search(r" #\d+ ", text) and not re.search(r"'[^']*' #\d+", text)
