"""The bug zoo: speculative-decoding mistakes that well-known implementations have shipped, each
planted for a moment into the real code, so the checks (spec_decoding.checks) can be seen to catch
it. Every one of them still produces fluent text; only a check can tell.

Each bug is a context manager: inside `with bug.planted():` the ordinary generators
(speculative_sampling, speculative_sampling_greedy) run with the mistake, by monkeypatching one
step (unittest.mock.patch) or swapping in a small subclass. Nothing in the library is edited and
everything is restored on exit. notebooks/06_bug_zoo shows each one beside its check;
tests/test_bug_zoo.py proves each is caught and the correct code is not.

    from spec_decoding.bug_zoo import BUGS
    with BUGS["resample from p"].planted():
        speculative_sampling(target, draft, prompt, 3, gamma=2)  # subtly wrong samples
"""

from contextlib import contextmanager
from dataclasses import dataclass
from unittest.mock import patch

from . import decoding, drafters, greedy, rejection, speculative
from .greedy import speculative_sampling_greedy
from .result import STOP_EOS
from .sampling import logits_to_probs, sample
from .speculative import speculative_sampling



# ------------------------------------------------------------------------------------------------
# The sampling bugs: caught by the exact-enumeration chi-square test (check_lossless)
# ------------------------------------------------------------------------------------------------

@contextmanager
def resample_from_p():
    """After a rejection, draw the replacement from p instead of norm(max(0, p - q))."""
    with patch.object(rejection, "residual_distribution",
                      lambda target_probs, draft_probs: target_probs):
        yield


def top_p_before_temperature(logits, temperature=1.0, top_k=None, top_p=None):
    """logits_to_probs with the filters first and the temperature last (the wrong order: top-p
    then keeps a different set of tokens)."""
    filtered = logits_to_probs(logits, 1.0, top_k, top_p)  # filters at temperature 1
    return logits_to_probs(filtered.log() / temperature)  # then the temperature


@contextmanager
def target_filters_before_temperature():
    """The target's p gets top-k/top-p before the temperature; the draft's q the right order."""
    with patch.object(speculative, "logits_to_probs", top_p_before_temperature):
        yield


class GreedyDraftReportingSoftmax(drafters.ModelDrafter):
    """Takes the draft's argmax (a cheap speed-up: more agreement) but reports the
    softmax q as if it had sampled from it."""

    def draw(self, logits, temperature, top_k=None, top_p=None, generator=None):
        if temperature == 0:
            return super().draw(logits, temperature)
        return int(logits.argmax()), logits_to_probs(logits, temperature, top_k, top_p)  # the bug: argmax, not a draw from q


class DrafterReportingUnfilteredQ(drafters.ModelDrafter):
    """Samples after temperature, top-k and top-p but reports q before top-k/top-p."""

    def draw(self, logits, temperature, top_k=None, top_p=None, generator=None):
        if temperature == 0:
            return super().draw(logits, temperature)
        token = int(sample(logits_to_probs(logits, temperature, top_k, top_p), generator))
        return token, logits_to_probs(logits, temperature)  # the bug: q unfiltered


class DrafterNeverRollingBack(drafters.ModelDrafter):
    """Forgets to roll its KV cache back: rejected draft tokens stay in it."""

    def roll_back(self, length):
        pass  # the bug


def drafter_swapped_for(subclass):
    """() -> context manager: a GPT2 draft is wrapped in `subclass` instead of ModelDrafter."""
    return lambda: patch.object(drafters, "ModelDrafter", subclass)


# ------------------------------------------------------------------------------------------------
# The stopping bugs: caught by check_stopping
# ------------------------------------------------------------------------------------------------

@contextmanager
def bonus_token_past_max_gen():
    """The last round drafts as if one more token were allowed: when everything is accepted, its
    bonus token is one past max_gen."""
    real_round_gamma = decoding.round_gamma

    def round_gamma(gamma, out_len, max_gen, seq_len, target, draft):
        return real_round_gamma(gamma, out_len, max_gen + 1, seq_len, target, draft)  # the bug

    with _patch_generators("round_gamma", round_gamma):
        yield


@contextmanager
def tokens_kept_after_eos():
    """A round is taken whole and only then checked for eos: tokens after eos stay."""
    real_take_tokens = decoding.take_tokens

    def take_tokens(tokens, out, stats, new_tokens, sources, eos_id, max_gen, n_positions, on_tokens=None):
        stop = real_take_tokens(tokens, out, stats, new_tokens, sources, None, max_gen, n_positions,
                                on_tokens)  # the bug: eos not looked at while taking tokens
        return STOP_EOS if eos_id in new_tokens else stop

    with _patch_generators("take_tokens", take_tokens):
        yield


@contextmanager
def _patch_generators(name, replacement):
    with patch.object(greedy, name, replacement), patch.object(speculative, name, replacement):
        yield


# ------------------------------------------------------------------------------------------------
# The catalogue
# ------------------------------------------------------------------------------------------------

@dataclass
class Bug:
    name: str
    mistake: str  # what the code does wrong
    why_tempting: str  # why someone writes it
    check: str  # which check catches it: "lossless", "caches" or "stopping"
    planted: object  # () -> context manager: the generators run with the bug inside it
    settings: dict  # the sampling settings under which it shows
    code: object  # the function or class that holds the mistake (inspect.getsource(bug.code))

    def __repr__(self):
        return f"Bug({self.name!r}, caught by check_{self.check})"


BUGS = {}


def _add(*args):
    bug = Bug(*args)
    BUGS[bug.name] = bug


T1 = dict(temperature=1.0)
FILTERED = dict(temperature=1.5, top_k=6, top_p=0.7)  # strong filters: the bugs show

_add("greedy draft", "the draft takes its argmax while the target samples, and reports the "
     "softmax q it did not sample from",
     "argmax drafts agree with the target more often: a speed-up, for free it seems.",
     "lossless", drafter_swapped_for(GreedyDraftReportingSoftmax), T1,
     GreedyDraftReportingSoftmax)
_add("q before top-k/top-p", "the drafter samples after temperature, top-k and top-p but "
     "reports q before top-k/top-p",
     "q is computed once, early, and the filters are added later where the sampling happens.",
     "lossless", drafter_swapped_for(DrafterReportingUnfilteredQ), FILTERED,
     DrafterReportingUnfilteredQ)
_add("resample from p", "after a rejection the replacement is drawn from p instead of "
     "norm(max(0, p - q))",
     "'the target decides' sounds right, and the output still looks like the target's.",
     "lossless", resample_from_p, T1, resample_from_p)
_add("filters before temperature", "the target applies top-k/top-p before the temperature, the "
     "draft after it",
     "two code paths build the two distributions; each looks fine on its own.",
     "lossless", target_filters_before_temperature, FILTERED,
     top_p_before_temperature)
_add("cache not rolled back", "the drafter's KV cache keeps the rejected draft tokens",
     "rollback is one line that is easy to forget, and the text stays fluent.",
     "caches", drafter_swapped_for(DrafterNeverRollingBack), T1,
     DrafterNeverRollingBack)
_add("bonus token past max_gen", "the last round may output one token more than max_gen",
     "the bonus token is free, so why not keep it?", "stopping", bonus_token_past_max_gen, T1,
     bonus_token_past_max_gen)
_add("tokens after eos", "a round is taken whole even when eos is among its tokens",
     "rounds add several tokens at once; checking eos per token is easy to skip.",
     "stopping", tokens_kept_after_eos, T1, tokens_kept_after_eos)


def run_check(check: str, target, draft, settings: dict, samples: int = 1000, seed: int = 0,
          prompt=(1, 2, 3)):
    """Run the check named `check` ("lossless", "caches" or "stopping") on speculative_sampling
    (temperature 0: speculative_sampling_greedy) with this target and draft. Returns the check's
    result (.passed, .message). Lossless needs a tiny vocabulary (exact enumeration)."""
    from functools import partial

    from .checks import check_caches_after_every_round, check_lossless, check_stopping

    prompt = list(prompt)
    generate = speculative_sampling_greedy if settings.get("temperature", 0) == 0 else speculative_sampling
    if check == "lossless":
        return check_lossless(partial(generate, target, draft, gamma=2), target, prompt, 3, settings,
                          samples, seed)
    if check == "caches":
        return check_caches_after_every_round(partial(generate, target, draft, gamma=3), target, draft,
                                          prompt, 20, settings, seed)
    if check == "stopping":
        return check_stopping(partial(generate, target, draft, gamma=3), prompt, settings=settings)
    raise ValueError(f"unknown check {check!r}: lossless, caches or stopping")
