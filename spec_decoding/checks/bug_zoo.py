"""The bug zoo: speculative-decoding mistakes that public implementations have shipped, each
planted for a moment into the real code, so the checks (spec_decoding.checks) can be seen to catch
it. Every one of them still produces fluent text; only a check can tell. Each entry names its
source (bug.source: the project, the issue or pull request, what happened there) and the words its
check's message says when it catches it (bug.says).

Three kinds: sampling bugs change the output's distribution (check_lossless); cache, indexing and
stopping bugs break greedy exactness or max_gen/eos (check_greedy_matches_target,
check_batch_greedy, check_caches_after_every_round, check_stopping); speed bugs keep the output
exact and only throw acceptance away (check_speed: "lossless, but slower: ...").

Each bug is a context manager: inside `with bug.planted():` the ordinary generators
(speculative_sampling, speculative_sampling_greedy) run with the mistake, by monkeypatching one
step (unittest.mock.patch) or swapping in a small subclass. Nothing in the library is edited and
everything is restored on exit. notebooks/06_bug_zoo shows each one beside its check and asserts
that each is caught and the correct code is not (the suite runs it; tests/test_bug_zoo.py tests the
rest of the zoo).

    from spec_decoding.checks.bug_zoo import BUGS
    with BUGS["resample from p"].planted():
        speculative_sampling(target, draft, prompt, 3, gamma=2)  # subtly wrong samples
"""

from contextlib import contextmanager
from dataclasses import dataclass
from unittest.mock import patch

import torch

from ..algorithms import batched, decoding, greedy, rejection, speculative
from ..algorithms.greedy import speculative_sampling_greedy
from ..algorithms.rejection import Verdict
from ..algorithms.speculative import speculative_sampling
from ..drafters import drafter
from ..result import STOP_EOS
from ..sampling import logits_to_probs, sample



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


class GreedyDraftReportingSoftmax(drafter.ModelDrafter):
    """Takes the draft's argmax (a cheap speed-up: more agreement) but reports the
    softmax q as if it had sampled from it."""

    def draw(self, logits, temperature, top_k=None, top_p=None, generator=None):
        if temperature == 0:
            return super().draw(logits, temperature)
        return int(logits.argmax()), logits_to_probs(logits, temperature, top_k, top_p)  # the bug: argmax, not a draw from q


class DrafterReportingUnfilteredQ(drafter.ModelDrafter):
    """Samples after temperature, top-k and top-p but reports q before top-k/top-p."""

    def draw(self, logits, temperature, top_k=None, top_p=None, generator=None):
        if temperature == 0:
            return super().draw(logits, temperature)
        token = int(sample(logits_to_probs(logits, temperature, top_k, top_p), generator))
        return token, logits_to_probs(logits, temperature)  # the bug: q unfiltered


class DrafterNeverRollingBack(drafter.ModelDrafter):
    """Forgets to roll its KV cache back: rejected draft tokens stay in it."""

    def roll_back(self, length):
        pass  # the bug


def drafter_swapped_for(subclass):
    """() -> context manager: a GPT2 draft is wrapped in `subclass` instead of ModelDrafter."""
    return lambda: patch.object(drafter, "ModelDrafter", subclass)


@contextmanager
def every_draft_accepted():
    """The acceptance test never rejects: every draft token is kept, then the bonus is drawn."""
    def accept_all(target_probs, draft_probs, draft_tokens, generator=None):
        g = len(draft_tokens)
        return Verdict(g, int(sample(target_probs[g], generator)), [], None)  # the bug: no test at all

    with patch.object(speculative, "modified_rejection_sampling", accept_all):
        yield


# ------------------------------------------------------------------------------------------------
# The speed bugs: lossless, so only check_speed (and the draft's cache check) can tell
# ------------------------------------------------------------------------------------------------

def sampler_match(target_probs, draft_probs, draft_tokens, generator=None):
    """Accept a draft token only when a fresh draw from p equals it; on a mismatch output that draw.
    Every output token is a draw from p, so the output is exact, but a token is accepted with
    probability sum(p q) instead of sum(min(p, q))."""
    for i, x in enumerate(draft_tokens):
        drawn = int(sample(target_probs[i], generator))
        if drawn != x:  # the bug: equality of two draws, not the test r < p(x) / q(x)
            return Verdict(i, drawn, [], None)
    g = len(draft_tokens)
    return Verdict(g, int(sample(target_probs[g], generator)), [], None)


@contextmanager
def sampler_match_acceptance():
    with patch.object(speculative, "modified_rejection_sampling", sampler_match):
        yield


class DrafterRewindingTooFar(drafter.ModelDrafter):
    """On every round with a rejection its KV cache is trimmed two entries further than the
    accepted sequence, and it never catches up: it feeds only the tokens it believes are new, so
    its context falls two tokens further behind with every rejecting round. (ModelDrafter feeds
    whatever its cache has not seen, which would heal a cache trimmed too far; mlxcel's drafter fed
    only the newest token, as this one does.)"""

    def start(self, prompt, max_gen):
        super().start(prompt, max_gen)
        self.skipped = 0  # accepted tokens missing from the cache for good

    def next_logits(self, tokens):
        self.forward_calls += 1
        seen = self.cache.length + self.skipped  # the sequence positions it believes it holds
        return self.model(torch.tensor([tokens[seen:]], device=self.device), self.cache)[0, -1]

    def roll_back(self, length):
        seen = self.cache.length + self.skipped
        if seen >= length:  # a draft token was rejected: trim back to `length`, and two more
            trim = min(seen - length + 2, self.cache.length)  # the bug: + 2
            self.cache.truncate(self.cache.length - trim)
            self.skipped = length - self.cache.length


class DrafterStoppingWhenUnsure(drafter.ModelDrafter):
    """Stops drafting as soon as its most likely token has probability below P_ACCEPT (decided
    before drawing, from q alone, so the output stays exact): drafts are short and almost
    always accepted, so acceptance reads high while little is speculated."""

    P_ACCEPT = 0.8

    def propose(self, tokens, num_tokens, temperature=0.0, top_k=None, top_p=None, generator=None):
        draft_tokens, draft_probs = [], []
        for _ in range(num_tokens):
            logits = self.next_logits(tokens + draft_tokens)
            if logits_to_probs(logits, temperature or 1.0, top_k, top_p).max() < self.P_ACCEPT:
                break  # the bug: a confident-draft threshold cuts the draft short
            token, q = self.draw(logits, temperature, top_k, top_p, generator)
            draft_tokens.append(token)
            if q is not None:
                draft_probs.append(q)
        return draft_tokens, torch.stack(draft_probs) if draft_probs else None


# ------------------------------------------------------------------------------------------------
# The cache and indexing bugs that break greedy exactness: caught by check_greedy_matches_target
# ------------------------------------------------------------------------------------------------

@contextmanager
def cache_reset_not_rolled_back():
    """After each round the target's KV cache is reset (emptied) where a rollback was meant, while
    the verification still feeds only the tokens after the rollback point: it attends to an almost
    empty cache."""
    snapshot = {}  # id(cache) -> the length a rollback would have kept

    def roll_back(target_cache, drafter, seq_len):
        snapshot[id(target_cache)] = seq_len - 1
        target_cache.truncate(0)  # the bug: reset, not truncate(seq_len - 1)
        drafter.roll_back(seq_len - 1)

    def target_forward(target, target_cache, tokens, draft_tokens, drafter=None):
        start = snapshot.get(id(target_cache), target_cache.length)
        new = torch.tensor([(tokens + draft_tokens)[start:]], device=target.wpe.weight.device)
        logits, features = target(new, target_cache, num_last_logits=len(draft_tokens) + 1,
                                  return_features=True)
        if drafter is not None:
            drafter.observe_target_features(start, features[0])
        return logits[0]

    with _patch_generators("roll_back", roll_back), _patch_generators("target_forward", target_forward):
        yield


@contextmanager
def verification_rows_shifted():
    """Draft token i is judged by the target's logits row i + 1 (the row after it) instead of row
    i (the row before it); the last row is used twice for the bonus."""
    real_target_forward = decoding.target_forward

    def target_forward(target, target_cache, tokens, draft_tokens, drafter=None):
        logits = real_target_forward(target, target_cache, tokens, draft_tokens, drafter)  # [g + 1, V]
        return torch.cat([logits[1:], logits[-1:]])  # the bug: "row 0 belongs to the last token"

    with _patch_generators("target_forward", target_forward):
        yield


@contextmanager
def batch_rows_rewound_alike():
    """After a batched round every row's cache is rewound by one shared count (what the row that
    accepted the most needs), not each by its own: rows that accepted fewer keep rejected draft
    tokens' keys and values."""
    real_truncate = batched.BatchedKVCache.truncate

    def truncate(self, lengths):
        have = self.lengths.tolist()
        rewind = min(h - keep for h, keep in zip(have, lengths))  # the bug: one count for all rows
        real_truncate(self, [h - rewind for h in have])

    with patch.object(batched.BatchedKVCache, "truncate", truncate):
        yield


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

@dataclass(frozen=True)
class Source:
    """Where a bug was reported or fixed in public: the project, the issue/pull request links and
    one sentence of what happened there. links empty: not found reported anywhere."""
    project: str
    links: tuple[str, ...]
    story: str


@dataclass
class Bug:
    name: str
    mistake: str  # what the code does wrong
    why_tempting: str  # why someone writes it
    check: str  # which check catches it: "lossless", "caches", "stopping", "speed", "greedy" or "batch"
    planted: object  # () -> context manager: the generators run with the bug inside it
    settings: dict  # the sampling settings under which it shows
    code: object  # the function or class that holds the mistake (inspect.getsource(bug.code))
    source: Source  # where it shipped
    says: str  # words the check's message says when it catches it

    def __repr__(self):
        return f"Bug({self.name!r}, caught by check_{self.check})"


BUGS = {}


def _add(**fields):
    bug = Bug(**fields)
    BUGS[bug.name] = bug


T1 = dict(temperature=1.0)
GREEDY = dict(temperature=0.0)
FILTERED = dict(temperature=1.5, top_k=6, top_p=0.7)  # strong filters: the bugs show
DIFFERS = "differs from the target's distribution"
HF = "https://github.com/huggingface/transformers"

_add(name="greedy draft", check="lossless", settings=T1, planted=drafter_swapped_for(GreedyDraftReportingSoftmax),
     code=GreedyDraftReportingSoftmax, says=DIFFERS,
     mistake="the draft takes its argmax while the target samples, and reports the softmax q it did not "
             "sample from",
     why_tempting="argmax drafts agree with the target more often: a speed-up, for free it seems.",
     source=Source("huggingface/transformers", (f"{HF}/issues/32867", f"{HF}/pull/33534"),
                   "Assisted generation had been switched to a greedy assistant for speed while sampling "
                   "still tested its tokens against the assistant's softmax; issue 32867 reported that the "
                   "output no longer followed the main model's distribution, and PR 33534 made the "
                   "assistant sample whenever the main model samples."))
_add(name="q before top-k/top-p", check="lossless", settings=FILTERED,
     planted=drafter_swapped_for(DrafterReportingUnfilteredQ), code=DrafterReportingUnfilteredQ, says=DIFFERS,
     mistake="the drafter samples after temperature, top-k and top-p but reports q before top-k/top-p",
     why_tempting="q is computed once, early, and the filters are added later where the sampling happens.",
     source=Source("huggingface/transformers", (f"{HF}/issues/47932", f"{HF}/pull/47961"),
                   "Candidate generators (DFlash, MTP) drew their tokens from the processor-filtered logits "
                   "(top_k=50 by default) but returned the raw logits as q, so with do_sample=True the "
                   "acceptance ratio was inflated and the output drifted from the target's distribution; "
                   "the PR returns the distribution the tokens were drawn from."))
_add(name="resample from p", check="lossless", settings=T1, planted=resample_from_p, code=resample_from_p,
     says=DIFFERS,
     mistake="after a rejection the replacement is drawn from p instead of norm(max(0, p - q))",
     why_tempting="'the target decides' sounds right, and the output still looks like the target's.",
     source=Source("SafeAILab/EAGLE", ("https://github.com/SafeAILab/EAGLE/issues/329",),
                   "The issue reports that EAGLE's non-greedy path never uses the draft's q: it takes "
                   "q(x) = 1 and draws the replacement from the target's own distribution instead of "
                   "norm(max(0, p - q)), so it is not lossless."))
_add(name="filters before temperature", check="lossless", settings=FILTERED,
     planted=target_filters_before_temperature, code=top_p_before_temperature, says=DIFFERS,
     mistake="the target applies top-k/top-p before the temperature, the draft after it",
     why_tempting="two code paths build the two distributions; each looks fine on its own.",
     source=Source("fishaudio/fish-speech", ("https://github.com/fishaudio/fish-speech/pull/1150",),
                   "A plain sampler, not speculative decoding: its logits_to_probs applied the temperature "
                   "after top-p filtering, so top-p chose its tokens from the unscaled distribution; the "
                   "PR moved the temperature first. (Not found reported for a speculative pair.)"))
_add(name="every draft accepted", check="lossless", settings=T1, planted=every_draft_accepted,
     code=every_draft_accepted, says=DIFFERS,
     mistake="the acceptance test never rejects: every draft token is kept",
     why_tempting="a count of matches that is always full looks like a great draft, not like a bug.",
     source=Source("huggingface/transformers", (f"{HF}/pull/28508",),
                   "transformers' first _speculative_sampling accepted the assistant's tokens all the "
                   "time because of a faulty test of the number of matches (n_matches); the PR fixed it "
                   "and several other departures from the paper's algorithm."))
_add(name="cache not rolled back", check="caches", settings=T1, planted=drafter_swapped_for(DrafterNeverRollingBack),
     code=DrafterNeverRollingBack, says="lossless, but slower: after round",
     mistake="the drafter's KV cache keeps the rejected draft tokens",
     why_tempting="rollback is one line that is easy to forget, and the text stays fluent.",
     source=Source("ml-explore/mlx-swift-lm", ("https://github.com/ml-explore/mlx-swift-lm/pull/308",),
                   "Gemma 4 multi-token-prediction decoding rewound only the main model's cache by the "
                   "rejected count; a reviewer found the drafter's shared key/value snapshot still held "
                   "the rejected rows, so every round after a partial acceptance drafted while attending "
                   "to them, and the author confirmed it."))
_add(name="bonus token past max_gen", check="stopping", settings=T1, planted=bonus_token_past_max_gen,
     code=bonus_token_past_max_gen, says="past max_gen",
     mistake="the last round may output one token more than max_gen",
     why_tempting="the bonus token is free, so why not keep it?",
     source=Source("rohitg00/ai-engineering-from-scratch",
                   ("https://github.com/rohitg00/ai-engineering-from-scratch/pull/185",),
                   "A review of a teaching repository's Rust speculative-decoding loop found that it could "
                   "overshoot max_tokens, both in the accepted-token branch and in the bonus-token branch, "
                   "and suggested stopping at the budget."))
_add(name="tokens after eos", check="stopping", settings=T1, planted=tokens_kept_after_eos,
     code=tokens_kept_after_eos, says="after eos were kept",
     mistake="a round is taken whole even when eos is among its tokens",
     why_tempting="rounds add several tokens at once; checking eos per token is easy to skip.",
     source=Source("huggingface/transformers", (f"{HF}/issues/47912",),
                   "Assisted/speculative decoding committed the whole accepted block when the target "
                   "accepted an EOS in its middle, so tokens after the EOS were returned; the fix trims "
                   "the block at the first EOS."))
_add(name="sampler match", check="speed", settings=T1, planted=sampler_match_acceptance, code=sampler_match,
     says="lossless, but slower: the target accepted",
     mistake="a draft token is accepted only when it equals a fresh draw from p (whose draw is output "
             "on a mismatch): exact, but accepted with probability sum(p q), not sum(min(p, q))",
     why_tempting="comparing tokens is what greedy verification does, and the output is provably exact.",
     source=Source("lablup/mlxcel", ("https://github.com/lablup/mlxcel/pull/992",),
                   "The PR found that the speculative path accepted a draft token only when it equalled a "
                   "fresh draw from the target ('sampler-match'), which was never biased but loses "
                   "acceptance (sum p(x) q(x)), and added modified rejection sampling as an opt-in rule."))
_add(name="draft cache rewound too far", check="speed", settings=T1, planted=drafter_swapped_for(DrafterRewindingTooFar),
     code=DrafterRewindingTooFar, says="lossless, but slower",
     mistake="on every rejecting round the draft's KV cache is trimmed two entries too many, and the "
             "drafter never feeds them again: its context falls behind round by round",
     why_tempting="off-by-one arithmetic on who fed which token; the output stays exact, so no "
                  "correctness test fails.",
     source=Source("lablup/mlxcel", ("https://github.com/lablup/mlxcel/issues/994",
                                     "https://github.com/lablup/mlxcel/pull/1002"),
                   "The draft cache was trimmed by min(rejected + 1, k) on every rejecting round, two "
                   "entries more than the round had to give back, and the shortfall was never recovered: "
                   "the drafter's context fell behind and acceptance decayed; PR 1002 trims rejected - 1."))
_add(name="draft cut by confidence", check="speed", settings=T1, planted=drafter_swapped_for(DrafterStoppingWhenUnsure),
     code=DrafterStoppingWhenUnsure, says="tokens per target call",
     mistake="the drafter stops as soon as its top token's probability is below a threshold (0.8), so "
             "it drafts little and what it drafts is almost always accepted",
     why_tempting="a confident draft is rarely rejected, and acceptance near 100% looks like success.",
     source=Source("ggml-org/llama.cpp", ("https://github.com/ggml-org/llama.cpp/issues/3919",),
                   "Acceptance in the speculative example read 100%: after min-p sampling landed, only "
                   "very confident draft tokens (p_accept = 0.8) were drafted, so the draft was almost "
                   "always right but rarely speculated; p_accept was lowered to 0.5 and made a flag."))
_add(name="cache reset, not rolled back", check="greedy", settings=GREEDY, planted=cache_reset_not_rolled_back,
     code=cache_reset_not_rolled_back, says="differs from the target's own greedy output",
     mistake="after a round the target's KV cache is reset where a rollback was meant, while the "
             "verification feeds only the new tokens: it attends to an almost empty cache",
     why_tempting="reset and rollback sit side by side in a cache API, and a sibling code path had the "
                  "right call.",
     source=Source("paiml/aprender", ("https://github.com/paiml/aprender/pull/2014",),
                   "The self-speculative GPU path called reset_kv_cache_gpu() where "
                   "rollback_kv_cache_gpu(snapshot) was meant, so each verification attended over an "
                   "almost empty key/value cache and the output diverged from plain greedy decoding."))
_add(name="batch rows rewound alike", check="batch", settings=GREEDY, planted=batch_rows_rewound_alike,
     code=batch_rows_rewound_alike, says="row",
     mistake="in a batch every row's cache is rewound by one shared count, so rows that accepted fewer "
             "draft tokens keep the rejected tokens' keys and values",
     why_tempting="one offset for the whole batch is how the cache worked before speculation.",
     source=Source("Blaizzy/mlx-vlm", ("https://github.com/Blaizzy/mlx-vlm/pull/1155",
                                       "https://github.com/Blaizzy/mlx-vlm/issues/1144"),
                   "Batched Gemma 4 MTP speculative decoding advanced every row's cache offset by the "
                   "whole draft block; rows that accepted fewer kept rejected drafts' keys and values, "
                   "acceptance collapsed and outputs fell into loops (issue 1144, fixed by PR 1155)."))
_add(name="verification row off by one", check="greedy", settings=GREEDY, planted=verification_rows_shifted,
     code=verification_rows_shifted, says="differs from the target's own greedy output",
     mistake="draft token i is judged by the target's row i + 1 (the row after it) instead of row i",
     why_tempting="the forward is fed the last accepted token first, so 'row 0 belongs to it' sounds right.",
     source=Source("mlx-node/mlx-node", ("https://github.com/mlx-node/mlx-node/pull/11",
                                         "https://github.com/feifeibear/LLMSpeculativeSampling/issues/29"),
                   "A review of mlx-node's speculative decoding found the verification logits sliced from "
                   "position 1, so every draft token was judged by the row after it; in "
                   "LLMSpeculativeSampling issue 29 users argued at length which target row verifies "
                   "which draft token."))

PROMPTS = ([1, 2, 3], [4, 5], [6, 7, 8, 9], [10])  # mixed lengths: a batch's rows drift apart

# The speed bugs need a pair whose agreement depends on the context (a draft that loses context
# then agrees less): save_agreeing_pair's draft is the target's first block, over 16 tokens, with
# room for long runs. The exact-enumeration checks keep the unrelated pair (agreeing about half
# the time: every branch of the rejection step is frequent). Make it with
# offline.random_weights.save_agreeing_pair(target_dir, draft_dir, GPT2Config(**SPEED_PAIR_CONFIG), **SPEED_PAIR).
SPEED_PAIR_CONFIG = dict(n_layer=3, n_head=2, n_embd=32, n_positions=64, vocab_size=16)
SPEED_PAIR = dict(draft_n_layer=1, damping=0.5, seed=7, std=0.3, embedding_std=0.3)



def run_check(check: str, target, draft, settings: dict, samples: int = 1000, seed: int = 0,
              prompt=(1, 2, 3)):
    """Run the check named `check` on speculative_sampling (temperature 0:
    speculative_sampling_greedy; "batch": batched_speculative_sampling) with this target and
    draft. Returns the check's result (.passed, .message). Lossless needs a tiny vocabulary
    (exact enumeration); speed needs a GPT2 draft (it measures q afresh)."""
    from functools import partial

    from .generator_checks import (check_batch_greedy, check_caches_after_every_round, check_greedy_matches_target,
                         check_lossless, check_speed, check_stopping)

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
    if check == "speed":
        window = min(target.config.n_positions, draft.config.n_positions)
        max_gen = min(48, window - 1 - max(len(p) for p in PROMPTS))  # long runs: a decay shows
        return check_speed(partial(generate, target, draft, gamma=4), target, draft, 4, PROMPTS, max_gen,
                           settings, seed=seed)
    if check == "greedy":
        return check_greedy_matches_target(partial(speculative_sampling_greedy, target, draft, gamma=3),
                                           target, prompt, 24)
    if check == "batch":
        return check_batch_greedy(partial(batched.batched_speculative_sampling, target, draft, gamma=3),
                                  target, PROMPTS, 20)
    raise ValueError(f"unknown check {check!r}: lossless, caches, stopping, speed, greedy or batch")
