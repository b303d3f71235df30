"""The grader's checks, run in a subprocess inside the grading copy (the project with the
student's files in place), so the student's functions are the ones imported:

    python -m assignments.run_checks SETUP.json CHECK [CHECK ...]

SETUP.json names the checkpoints and the reference file the grader made with the instructor's
code. Prints one JSON line per check: {"check", "passed", "message", "seconds"}. Messages are in
plain words, for the student.
"""

import json
import sys
import time
import traceback
from functools import partial
from pathlib import Path

import torch

from gpt2 import load_gpt2
from spec_decoding import autoregressive_generate, speculative_sampling, speculative_sampling_greedy
from spec_decoding.checks import (check_caches_after_every_round, check_greedy_matches_target,
                                  check_lossless, check_stopping, chi_square_p_value)

PROMPT = [5, 17, 42, 8, 99, 3]
VOCAB_PROMPT = [1, 2, 3]
LOSSLESS_SAMPLES = 1000  # catches the bug zoo's sampling bugs at p < 1e-6 (tests/test_bug_zoo.py)


class Failed(Exception):
    """A check's verdict, in plain words."""


def close(got, want, what, atol=1e-4):
    diff = (got.float() - want.float()).abs().max().item()
    if diff > atol:
        raise Failed(f"{what}: the logits differ from the reference by up to {diff:.3g} (allowed {atol:g})")


# ------------------------------------------------------------------------------------------------
# The model and its KV cache
# ------------------------------------------------------------------------------------------------

def model_forward(ctx):
    with torch.inference_mode():
        close(ctx.target(ctx.ref["sequence"][None])[0], ctx.ref["logits"], "a full forward without a cache")


def cache_one_by_one(ctx):
    cache = ctx.target.new_kv_cache()
    with torch.inference_mode():
        rows = [ctx.target(ctx.ref["sequence"][None, i:i + 1], cache)[0, -1] for i in range(len(ctx.ref["sequence"]))]
    if cache.length != len(ctx.ref["sequence"]):
        raise Failed(f"after feeding {len(ctx.ref['sequence'])} tokens one at a time the cache's length is "
                     f"{cache.length}: advance the length by the number of tokens fed")
    close(torch.stack(rows), ctx.ref["logits"], "feeding one token at a time through the KV cache")


def cache_chunks(ctx):
    cache = ctx.target.new_kv_cache()
    seq = ctx.ref["sequence"]
    with torch.inference_mode():
        rows = [ctx.target(seq[None, i:i + 3], cache)[0] for i in range(0, len(seq), 3)]
    close(torch.cat(rows), ctx.ref["logits"], "feeding chunks of 3 tokens through the KV cache")


def cache_truncate(ctx):
    """Feed a wrong continuation, roll back with truncate(), feed the right one: as fresh."""
    seq, k = ctx.ref["sequence"], ctx.ref["truncate_at"]
    cache = ctx.target.new_kv_cache()
    with torch.inference_mode():
        ctx.target(torch.cat([seq[:k], ctx.ref["wrong_tokens"]])[None], cache)
        cache.truncate(k)
        if cache.length != k:
            raise Failed(f"after truncate({k}) the cache's length is {cache.length}, not {k}: the cache "
                         f"was not rolled back (the bug zoo's 'cache not rolled back')")
        logits = ctx.target(seq[None, k:], cache)[0]
    close(logits, ctx.ref["logits"][k:], f"after truncate({k}) and new tokens (the rejected tokens must be "
          f"forgotten: the bug zoo's 'cache not rolled back')")


def baseline_greedy(ctx):
    tokens = autoregressive_generate(ctx.target, PROMPT, 30).tokens
    want = ctx.ref["greedy"]
    if tokens != want:
        i = next((i for i, (a, b) in enumerate(zip(tokens, want)) if a != b), min(len(tokens), len(want)))
        raise Failed(f"greedy generation with the cache differs from the reference at token {i}: "
                     f"got {tokens[i:i + 3]}, expected {want[i:i + 3]}")


# ------------------------------------------------------------------------------------------------
# Greedy speculative decoding
# ------------------------------------------------------------------------------------------------

def _greedy(ctx, draft, gammas=(1, 3, 5), what="with a draft that mostly agrees"):
    for gamma in gammas:
        result = check_greedy_matches_target(partial(speculative_sampling_greedy, ctx.target, draft,
                                                     gamma=gamma), ctx.target, PROMPT, 30)
        if not result.passed:
            raise Failed(f"gamma={gamma}, {what}: your {result.message}")


def greedy_equals_target(ctx):
    _greedy(ctx, ctx.draft)


def greedy_unrelated_draft(ctx):
    _greedy(ctx, ctx.unrelated, (1, 4), "with an unrelated draft (nearly every token rejected)")


def greedy_draft_is_target(ctx):
    _greedy(ctx, ctx.target, (2, 4), "with draft == target (every token accepted, bonus tokens)")


def greedy_caches(ctx):
    _caches(ctx, speculative_sampling_greedy, {})


def greedy_stopping(ctx):
    _stopping(ctx, speculative_sampling_greedy, {})


def _caches(ctx, generate, settings):
    result = check_caches_after_every_round(partial(generate, ctx.target, ctx.draft, gamma=3), ctx.target,
                                            ctx.draft, PROMPT, 24, settings)
    if not result.passed:
        raise Failed(result.message + " (the bug zoo's 'cache not rolled back')")


def _stopping(ctx, generate, settings):
    result = check_stopping(partial(generate, ctx.target, ctx.draft, gamma=3), PROMPT, settings=settings)
    if not result.passed:
        message = result.message
        if "past max_gen" in message:
            message += " (the bug zoo's 'bonus token past max_gen')"
        if "after eos" in message or "eos_id" in message:
            message += " (the bug zoo's 'tokens after eos')"
        raise Failed(message)


# ------------------------------------------------------------------------------------------------
# Modified rejection sampling, the residual, speculative sampling
# ------------------------------------------------------------------------------------------------

def residual(ctx):
    from spec_decoding.rejection import residual_distribution

    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.2, 0.5, 0.1, 0.2])
    got = residual_distribution(p, q)
    if torch.allclose(got, p):
        raise Failed("residual_distribution(p, q) returned p itself: after a rejection the replacement "
                     "must come from norm(max(0, p - q)), not p (the bug zoo's 'resample from p')")
    want = torch.tensor([0.75, 0.0, 0.25, 0.0])
    if not torch.allclose(got, want, atol=1e-6):
        raise Failed(f"residual_distribution(p={p.tolist()}, q={q.tolist()}) gave {got.tolist()}, "
                     f"expected norm(max(0, p - q)) = {want.tolist()}")
    same = residual_distribution(p, p)
    if not torch.allclose(same, p):
        raise Failed(f"residual_distribution(p, p) gave {same.tolist()}: when p == q, max(0, p - q) is all "
                     f"zero; return p itself (it is never sampled from in exact arithmetic, but rounding happens)")


def _n_and_token(verdict):
    """(n accepted, next token) of what the student's modified_rejection_sampling returned."""
    if not (hasattr(verdict, "n_accepted") and hasattr(verdict, "next_token")):
        raise Failed(f"modified_rejection_sampling returned {type(verdict).__name__}: it must return a "
                     f"Verdict(n_accepted, next_token, uniforms, residual) (spec_decoding.rejection.Verdict)")
    return verdict.n_accepted, verdict.next_token


def one_round(ctx):
    """Leviathan's theorem on random p and q: the round's first token follows p[0], the first
    draft token is accepted with probability sum(min(p[0], q[0])), and the bonus token follows p[g]."""
    from spec_decoding.rejection import modified_rejection_sampling

    g = torch.Generator().manual_seed(0)
    def dist(seed, rows):
        return torch.softmax(2 * torch.randn(rows, 6, generator=torch.Generator().manual_seed(seed),
                                             dtype=torch.float64), -1).float()
    p, q = dist(1, 3), dist(2, 2)
    first, accepted, n_rounds = [], 0, 6000
    for _ in range(n_rounds):
        draft_tokens = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(2)]
        n, token = _n_and_token(modified_rejection_sampling(p, q, draft_tokens, g))
        if not (isinstance(n, int) and 0 <= n <= 2):
            raise Failed(f"modified_rejection_sampling returned n = {n!r}: it must be the number of "
                         f"accepted draft tokens, an int between 0 and {len(draft_tokens)}")
        first.append((draft_tokens[:n] + [int(token)])[0])
        accepted += n >= 1
    counts = torch.bincount(torch.tensor(first), minlength=6)
    p_value = chi_square_p_value(counts, p[0])
    tv = 0.5 * (counts / counts.sum() - p[0]).abs().sum().item()
    if p_value < 1e-3:
        raise Failed(f"the first token of a round does not follow p: total variation {tv:.2f}, "
                     f"p = {p_value:.1g} (accept with probability min(1, p(x)/q(x)); after a rejection "
                     f"draw from norm(max(0, p - q)))")
    expected = torch.minimum(p[0], q[0]).sum().item()
    rate = accepted / n_rounds
    sd = (expected * (1 - expected) / n_rounds) ** 0.5
    if abs(rate - expected) > 4 * sd:
        raise Failed(f"the first draft token was accepted {rate:.3f} of the time; the theory says "
                     f"sum(min(p, q)) = {expected:.3f}")
    bonus = []
    for _ in range(3000):
        draft_tokens = [int(torch.multinomial(p[i], 1, generator=g)) for i in range(2)]
        n, token = _n_and_token(modified_rejection_sampling(p, p[:2], draft_tokens, g))
        if n != 2:
            raise Failed(f"with q == p every draft token must be accepted (min(1, p/q) = 1), but only {n} of 2 were")
        bonus.append(int(token))
    p_value = chi_square_p_value(torch.bincount(torch.tensor(bonus), minlength=6), p[2])
    if p_value < 1e-3:
        raise Failed(f"when every draft token is accepted, the bonus token does not follow the last row "
                     f"of p (p = {p_value:.1g})")


def lossless(ctx):
    result = check_lossless(partial(speculative_sampling, ctx.vocab_target, ctx.vocab_draft, gamma=2),
                            ctx.vocab_target, VOCAB_PROMPT, 3, dict(temperature=1.0), LOSSLESS_SAMPLES, seed=0)
    if not result.passed:
        raise Failed(f"your sampler's distribution differs from the target's: total variation "
                     f"{result.total_variation:.2f} (a correct sampler shows about {result.reference_tv:.2f} "
                     f"with {result.samples} samples), p = {result.p_value:.1g}")


def sampling_caches(ctx):
    _caches(ctx, speculative_sampling, dict(temperature=1.0))


def sampling_stopping(ctx):
    _stopping(ctx, speculative_sampling, dict(temperature=1.0))


CHECKS = {f.__name__: f for f in (
    model_forward, cache_one_by_one, cache_chunks, cache_truncate, baseline_greedy,
    greedy_equals_target, greedy_unrelated_draft, greedy_draft_is_target, greedy_caches, greedy_stopping,
    residual, one_round, lossless, sampling_caches, sampling_stopping)}


class Context:
    def __init__(self, setup):
        self.ref = torch.load(setup["references"])
        self.target = load_gpt2(setup["target"])
        self.draft = load_gpt2(setup["draft"])
        self.unrelated = load_gpt2(setup["unrelated"])
        self.vocab_target = load_gpt2(setup["vocab_target"])
        self.vocab_draft = load_gpt2(setup["vocab_draft"])


def explain(error: BaseException, root: Path) -> str:
    if isinstance(error, Failed):
        return str(error)
    if isinstance(error, NotImplementedError):
        return f"not implemented yet ({error})"
    frames = [f for f in traceback.extract_tb(error.__traceback__) if str(root) in f.filename]
    where = f" at {Path(frames[-1].filename).relative_to(root)}:{frames[-1].lineno}" if frames else ""
    return f"raised {type(error).__name__}: {error}{where}"


def main(argv):
    torch.set_num_threads(1)
    setup = json.loads(Path(argv[0]).read_text())
    root = Path.cwd().resolve()
    ctx = Context(setup)
    for name in argv[1:]:
        start = time.perf_counter()
        try:
            CHECKS[name](ctx)
            passed, message = True, "ok"
        except Exception as error:  # noqa: BLE001  (any failure of the student's code is a verdict)
            passed, message = False, explain(error, root)
        print(json.dumps({"check": name, "passed": passed, "message": message,
                          "seconds": round(time.perf_counter() - start, 2)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
