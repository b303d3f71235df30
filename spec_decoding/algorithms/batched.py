"""Batched speculative decoding: B prompts of different lengths decoded together, each row
accepting its own number of draft tokens every round.

Why it is not just "add a batch dimension": in one round row 0 may accept all gamma draft tokens
while row 1 rejects the first. From then on the rows have different lengths, so they need
different positions (GPT-2's position embeddings are learned and absolute: a token's position is
part of its input), different KV-cache lengths and different attention masks.

How this module handles it: per-row lengths.
    Every row is its own sequence at its own, true positions 0, 1, 2, ... . The KV cache
    (BatchedKVCache) is the single-sequence cache with one length per row instead of one length:
    a forward pass writes row b's new keys/values at [lengths[b], lengths[b] + T), and rolling a
    row back after a rejection moves only lengths[b], exactly like KVCache.truncate does for one
    sequence. The new tokens of a forward are right-padded to the longest row's count; a padding
    token's keys land past its row's length, where a rejected draft token's would (stale, never
    attended to, overwritten later), and its output is ignored. The attention mask lets query t of
    row b see cache slots 0 .. lengths[b] + t: its own past and nothing else.

The other way: left padding plus masks (transformers' generate, lucidrains').
    Right-align the rows (pad on the left) so that every row's newest token sits in the same
    column, and mask the padding out. Positions are then cumsum(mask) - 1 per row, not the column.
    It suits plain batched decoding, where every row grows by one token a step. Speculation breaks
    the alignment every round (rows accept different counts), so each round the rows must be
    re-aligned: shift tokens, both KV caches and the masks of every row that accepted fewer than
    the most (or roll every row back to the batch's minimum and throw away accepted tokens). That
    is the re-padding transformers' maintainers cite for refusing batched assisted generation.
    Per-row lengths never move a cache entry; the price is a [B, 1, T, S] mask on every step.

Finished rows (eos, max_gen, a full context window) stop costing work: they leave the batch at
the end of their round and their cache rows are dropped (one copy of the cache when it happens).

    batched_autoregressive_generate(model, prompts, max_gen, ...)           the baseline
    batched_speculative_sampling(target, draft, prompts, max_gen, gamma,   greedy at temperature 0,
                                 temperature=..., ...)                      else lossless sampling
Both return a BatchedResult: one GenerationResult per prompt (tokens and stats, as the
single-sequence generators return) and the batch's forward passes and wall time.
"""

import time
from dataclasses import dataclass, field

import torch

from gpt2 import GPT2, KVCache
from ..contracts import GREEDY, Observers, SamplingParams, check_observers, check_positive_int, check_sampling
from ..drafters.drafter import model_facts
from ..result import FROM_TARGET, GenerationResult, GenerationStats
from ..sampling import logits_to_probs, sample
from .decoding import (check_drafter, prompt_to_list, record_round, round_gamma,
                       round_output, take_tokens)
from .rejection import modified_rejection_sampling

# The largest batch accepted. Every row keeps a KV cache of the whole window in both models, and
# the tests and benchmarks here go to 32; a larger batch is a typo more often than a plan.
MAX_BATCH_SIZE = 64


class BatchedKVCache:
    """A KV cache for B sequences of different lengths: one length per row.

    Holds the buffers of a KVCache made by model.new_kv_cache (so the dtype and device follow the
    model's rule), [B, n_head, max_len, head_dim] per layer, and lengths [B]: row b's positions
    [0, lengths[b]) hold valid keys/values. Writes may run up to `extra_slots` past a row's
    room (right padding, see the module docstring).
    """

    def __init__(self, cache: KVCache):
        self.keys, self.values = cache.keys, cache.values
        self.max_len = cache.max_len
        self.lengths = torch.zeros(cache.batch_size, dtype=torch.long, device=cache.keys[0].device)

    @property
    def batch_size(self) -> int:
        return len(self.lengths)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Write k, v [B, n_head, T, head_dim] of `layer`: row b at slots [lengths[b], lengths[b] + T).
        Returns all keys/values up to the longest row's end, [B, n_head, max(lengths) + T, head_dim]
        (the attention mask hides what each row must not see)."""
        T = k.shape[2]
        rows = torch.arange(self.batch_size, device=k.device)[:, None]  # [B, 1]
        slots = self.lengths[:, None] + torch.arange(T, device=k.device)  # [B, T]
        # keys[rows, :, slots] is [B, T, n_head, head_dim]: one (row, slot) pair per new token
        self.keys[layer][rows, :, slots] = k.transpose(1, 2).to(self.keys[layer].dtype)
        self.values[layer][rows, :, slots] = v.transpose(1, 2).to(self.values[layer].dtype)
        end = int(self.lengths.max()) + T
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def advance(self, n_new: torch.Tensor) -> None:
        """Row b took n_new[b] real tokens (its padding is not counted)."""
        self.lengths += n_new

    def truncate(self, lengths: list[int]) -> None:
        """Roll row b back to lengths[b] (<= its current length). O(1) per row, as KVCache.truncate."""
        new = torch.tensor(lengths, dtype=torch.long, device=self.lengths.device)
        if new.shape != self.lengths.shape or (new < 0).any() or (new > self.lengths).any():
            raise ValueError(f"BatchedKVCache.truncate: need {self.batch_size} lengths between 0 and "
                             f"the current ones {self.lengths.tolist()}; got {lengths}")
        self.lengths = new

    def keep_rows(self, rows: list[int]) -> None:
        """Keep only these rows (finished ones leave the batch): copies the cache once."""
        index = torch.tensor(rows, dtype=torch.long, device=self.lengths.device)
        self.keys = [k.index_select(0, index) for k in self.keys]
        self.values = [v.index_select(0, index) for v in self.values]
        self.lengths = self.lengths.index_select(0, index)


def new_batched_cache(model: GPT2, prompts: list[list[int]], max_gen: int, extra_slots: int) -> BatchedKVCache:
    """Room for the longest sequence any row can reach, plus extra_slots for right padding (the
    most new tokens one forward feeds a row beyond its own)."""
    longest = min(model.config.n_positions, max(len(p) for p in prompts) + max_gen)
    return BatchedKVCache(model.new_kv_cache(len(prompts), max_len=longest, extra_slots=extra_slots))


def forward_rows(model: GPT2, cache: BatchedKVCache, new_tokens: list[list[int]],
                 num_last_logits: int = 1) -> torch.Tensor:
    """GPT2.forward for rows of different lengths: row b feeds new_tokens[b] (any count, even 0)
    at its own positions cache.lengths[b], ...; returns logits [B, num_last_logits, V],
    right-aligned: logits[b, -n:] belong to row b's last n real tokens (n <= len(new_tokens[b])).

    The blocks are the model's own; only the positions and the mask are per row."""
    device = model.wpe.weight.device
    T = max(len(t) for t in new_tokens)
    n_new = torch.tensor([len(t) for t in new_tokens], device=device)
    idx = torch.tensor([t + [0] * (T - len(t)) for t in new_tokens], device=device)  # right-padded
    slots = cache.lengths[:, None] + torch.arange(T, device=device)  # [B, T]
    # A padding token may sit past the context window; its output is ignored, so any valid
    # position does for it (real tokens never pass the window: the generators stop before).
    positions = slots.clamp(max=model.config.n_positions - 1)
    key_slots = torch.arange(int(slots.max()) + 1, device=device)  # every slot any row may read
    attn_mask = (key_slots[None, None, :] <= slots[:, :, None])[:, None]  # [B, 1, T, S]
    if T == 1 and bool((cache.lengths == cache.lengths[0]).all()):
        attn_mask = None  # one new token per row, rows of one length: every slot is visible (batch 1)
    x = model.wte(idx) + model.wpe(positions)
    for layer, block in enumerate(model.h):
        x = block(x, attn_mask, cache, layer)
    cache.advance(n_new)
    # Only the last num_last_logits real positions of each row go through the head.
    last = (n_new[:, None] - num_last_logits + torch.arange(num_last_logits, device=device)).clamp(min=0)
    x = x.gather(1, last[:, :, None].expand(-1, -1, x.shape[-1]))  # [B, num_last_logits, C]
    return model.head(model.ln_f(x))


class BatchedModelDrafter:
    """ModelDrafter's batched twin: a smaller GPT-2 proposes draft tokens for every row, one batched
    forward per draft position, on a BatchedKVCache. After a round row b's cache keeps its accepted
    sequence minus the last token (one or two tokens behind, as ModelDrafter's)."""

    def __init__(self, model: GPT2):
        if not isinstance(model, GPT2):
            raise TypeError(f"the draft must be a GPT2 model, got {type(model).__name__}")
        self.model = model
        self.vocab_size, self.n_positions, self.device = model_facts(model)
        self.cache = None
        self.forward_calls = 0

    def start(self, prompts: list[list[int]], max_gen: int) -> None:
        # A row feeds at most 2 tokens after its prompt (the 2 it lacks after a fully accepted round).
        self.cache = new_batched_cache(self.model, prompts, max_gen, extra_slots=2)
        self.forward_calls = 0

    def propose(self, sequences: list[list[int]], gammas: list[int], temperature: float = 0.0,
                top_k=None, top_p=None, generator=None):
        """Row b drafts gammas[b] tokens after sequences[b]. Returns (draft_tokens, draft_probs):
        a list per row, draft_probs[b] [gammas[b], V] the q each token was drawn from (None when
        greedy). A row with fewer tokens to draft sits out the later steps (feeds nothing)."""
        draft_tokens = [[] for _ in sequences]
        draft_probs = [[] for _ in sequences]
        lengths = self.cache.lengths.tolist()
        for step in range(max(gammas, default=0)):
            feed = [(seq + drafted)[length:] if step < g else []
                    for seq, drafted, length, g in zip(sequences, draft_tokens, lengths, gammas)]
            logits = forward_rows(self.model, self.cache, feed)[:, -1]  # [B, V]
            self.forward_calls += 1
            lengths = self.cache.lengths.tolist()
            if temperature == 0:
                choice, q = logits.argmax(dim=-1), None
            else:
                q = logits_to_probs(logits, temperature, top_k, top_p)  # [B, V], as the target's p
                choice = sample(q, generator)
            for b, g in enumerate(gammas):
                if step < g:
                    draft_tokens[b].append(int(choice[b]))
                    if q is not None:
                        draft_probs[b].append(q[b])
        return draft_tokens, [torch.stack(q) if q else None for q in draft_probs]

    def roll_back(self, lengths: list[int]) -> None:
        self.cache.truncate([min(have, keep) for have, keep in zip(self.cache.lengths.tolist(), lengths)])

    def keep_rows(self, rows: list[int]) -> None:
        self.cache.keep_rows(rows)


@dataclass
class BatchRoundReport:
    """One round of a batch, as batched_speculative_sampling hands it to on_round (after the
    roll-back, before finished rows leave). Read it; do not change it."""
    sequences: list[list[int]]  # every prompt followed by its output so far
    active: list[int]  # active[i]: the prompt in cache row i
    gammas: list[int]  # draft tokens of each cache row this round
    n_accepted: list[int]  # accepted draft tokens of each cache row
    target_cache: BatchedKVCache
    draft_cache: BatchedKVCache


@dataclass
class BatchedResult:
    rows: list[GenerationResult]  # one per prompt, in the prompts' order
    target_forwards: int = 0  # batched forward passes of the target
    draft_forwards: int = 0  # batched forward passes of the draft
    seconds: float = 0.0  # wall time of the whole batch
    batch_sizes: list[int] = field(default_factory=list)  # rows in the batch at each target forward

    @property
    def tokens(self) -> list[list[int]]:
        return [r.tokens for r in self.rows]

    @property
    def tokens_generated(self) -> int:
        return sum(len(r.tokens) for r in self.rows)

    @property
    def tokens_per_second(self) -> float:
        """Summed over the rows: the batch's throughput."""
        return self.tokens_generated / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_accepted(self) -> int:
        return sum(r.stats.tokens_accepted for r in self.rows)

    @property
    def rejections(self) -> int:
        return sum(r.stats.rejections for r in self.rows)

    @property
    def alpha(self) -> float | None:
        """Accepted / judged draft tokens over all rows (GenerationStats.alpha, summed)."""
        judged = self.tokens_accepted + self.rejections
        return self.tokens_accepted / judged if judged else None


def check_prompts(prompts, model: GPT2, max_batch_size: int = MAX_BATCH_SIZE) -> list[list[int]]:
    """A list of prompts (each a list of ints or a 1-D LongTensor) -> list of lists, checked."""
    if isinstance(prompts, (str, bytes, torch.Tensor)) or not isinstance(prompts, (list, tuple)):
        raise ValueError("prompts must be a list of prompts, each a list of token ids or a 1-D "
                         f"LongTensor; got {type(prompts).__name__}")
    if not prompts:
        raise ValueError("prompts is empty: give at least one prompt")
    if len(prompts) > max_batch_size:
        raise ValueError(f"{len(prompts)} prompts is more than the largest batch, {max_batch_size}: "
                         f"split them into batches of at most {max_batch_size}")
    device = model.wpe.weight.device
    checked = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, torch.Tensor) and prompt.device != device:
            raise ValueError(f"prompt {i} is on {prompt.device} but the model is on {device}: "
                             f"move it with .to('{device}') or pass a list of ints")
        try:
            checked.append(prompt_to_list(prompt, model))
        except ValueError as e:
            raise ValueError(f"prompt {i}: {e}") from None
    return checked


def _finish(results: list[GenerationResult], stops: list[str | None], start: float) -> None:
    for result, stop in zip(results, stops):
        result.stats.stop_reason = stop
    for result in results:
        result.stats.seconds = time.perf_counter() - start


@torch.inference_mode()
def batched_autoregressive_generate(model: GPT2, prefixes, max_gen: int, sampling: SamplingParams = GREEDY,
                                    eos_id: int | None = None) -> BatchedResult:
    """The baseline, batched: the target alone, one batched forward per new token of every row.
    Each row stops at eos_id (kept), max_gen or a full window, as autoregressive_generate.
    sampling: SamplingParams(temperature, top_k, top_p, generator); the default, GREEDY, takes
    every row's argmax."""
    check_positive_int("max_gen", max_gen)
    sampling = check_sampling(sampling)
    temperature, top_k, top_p = sampling.filters
    sequences = check_prompts(prefixes, model)
    results = [GenerationResult([], GenerationStats()) for _ in sequences]
    stops: list[str | None] = [None] * len(sequences)
    cache = new_batched_cache(model, sequences, max_gen, extra_slots=0)
    active = list(range(len(sequences)))  # the prompt index of each cache row
    batch = BatchedResult(results)
    start = time.perf_counter()
    while active:
        lengths = cache.lengths.tolist()
        logits = forward_rows(model, cache, [sequences[r][n:] for r, n in zip(active, lengths)])[:, -1]
        batch.target_forwards += 1
        batch.batch_sizes.append(len(active))
        if temperature == 0:
            choice = logits.argmax(dim=-1).tolist()
        else:
            choice = sample(logits_to_probs(logits, temperature, top_k, top_p), sampling.generator).tolist()
        for r, token in zip(active, choice):
            results[r].stats.target_calls += 1
            stops[r] = take_tokens(sequences[r], results[r].tokens, results[r].stats, [token],
                                   [FROM_TARGET], eos_id, max_gen, model.config.n_positions)
        active = _drop_finished(active, stops, [cache])
    batch.seconds = time.perf_counter() - start
    _finish(results, stops, start)
    return batch


def _drop_finished(active: list[int], stops, caches) -> list[int]:
    """Finished rows leave the batch: the rows still running, their caches compacted."""
    keep = [i for i, r in enumerate(active) if stops[r] is None]
    if len(keep) < len(active) and keep:
        for cache in caches:
            cache.keep_rows(keep)
    return [active[i] for i in keep]


def greedy_verdict(target_logits: torch.Tensor, draft_tokens: list[int], draft_probs=None,
                   generator=None) -> tuple[int, int]:
    """One row's greedy verdict: keep draft tokens while they equal the target's argmax, then the
    target's own argmax. target_logits [g + 1, V] -> (n accepted, next token)."""
    target_choice = target_logits.argmax(dim=-1).tolist()
    n = 0
    while n < len(draft_tokens) and draft_tokens[n] == target_choice[n]:
        n += 1
    return n, target_choice[n]


def sampling_verdict(target_probs: torch.Tensor, draft_tokens: list[int], draft_probs, generator=None):
    """One row's modified rejection sampling (spec_decoding.algorithms.rejection): target_probs [g + 1, V],
    draft_probs [g, V] (None when g = 0) -> (n accepted, next token). Each row draws its own
    uniforms."""
    verdict = modified_rejection_sampling(target_probs, draft_probs, draft_tokens, generator)
    return verdict.n_accepted, verdict.next_token


def judge_rows(target_scores: list[torch.Tensor], draft_tokens, draft_probs, temperature, generator):
    """Every row's verdict, each from its own p, q and draws: [(n accepted, next token)] per row.
    (One row's acceptance must never decide another's: tests/test_batched.py plants that bug.)"""
    verdict = greedy_verdict if temperature == 0 else sampling_verdict
    return [verdict(scores, tokens, probs, generator)
            for scores, tokens, probs in zip(target_scores, draft_tokens, draft_probs)]


@torch.inference_mode()
def batched_speculative_sampling(target: GPT2, draft: GPT2, prefixes, max_gen: int, gamma: int,
                                 sampling: SamplingParams = GREEDY, eos_id: int | None = None,
                                 observers: Observers | None = None) -> BatchedResult:
    """Speculative decoding of B prompts at once, each row exactly as it would be decoded alone:
    sampling (SamplingParams) at temperature 0, the default, gives every row the target's own
    greedy output; temperature > 0 samples every row from the target's distribution (after the
    same temperature / top-k / top-p).

    Each round: the draft proposes up to gamma tokens for every row (one batched draft forward per
    position), the target scores every row's draft in one batched forward, every row accepts its
    own prefix and adds the target's token, and every row's caches roll back to its own length.
    prefixes: a list of prompts (lists of ints or 1-D LongTensors) of any lengths, at most
    MAX_BATCH_SIZE of them.
    observers: only on_round(report), which sees every round (a BatchRoundReport: the sequences,
    the rows, the caches), as the single-sequence generators' observers do.
    """
    check_positive_int("max_gen", max_gen)
    check_positive_int("gamma", gamma)
    sampling = check_sampling(sampling)
    observers = check_observers(observers, allowed=("on_round",), who="batched_speculative_sampling")
    temperature, top_k, top_p = sampling.filters
    generator = sampling.generator
    drafter = BatchedModelDrafter(draft)
    check_drafter(target, drafter)
    sequences = check_prompts(prefixes, target)
    results = [GenerationResult([], GenerationStats(drafted_by_position=[0] * gamma,
                                                    accepted_by_position=[0] * gamma))
               for _ in sequences]
    stops: list[str | None] = [None] * len(sequences)
    draft_calls = [0] * len(sequences)  # draft forwards each row took part in
    target_cache = new_batched_cache(target, sequences, max_gen, extra_slots=gamma + 1)
    drafter.start(sequences, max_gen)
    active = list(range(len(sequences)))
    batch = BatchedResult(results)
    start = time.perf_counter()
    while active:
        rows = [sequences[r] for r in active]
        gammas = [round_gamma(gamma, len(results[r].tokens), max_gen, len(sequences[r]), target, drafter)
                  for r in active]

        # 1. The draft proposes up to gammas[i] tokens for every row (q per row when sampling).
        draft_tokens, draft_probs = drafter.propose(rows, gammas, temperature, top_k, top_p, generator)
        batch.draft_forwards += max(gammas)

        # 2. The target scores every row's draft in one forward: row i's last gammas[i] + 1 logits.
        lengths = target_cache.lengths.tolist()
        logits = forward_rows(target, target_cache,
                              [(seq + drafted)[n:] for seq, drafted, n in zip(rows, draft_tokens, lengths)],
                              num_last_logits=max(gammas) + 1)
        batch.target_forwards += 1
        batch.batch_sizes.append(len(active))
        if temperature != 0:
            logits = logits_to_probs(logits, temperature, top_k, top_p)
        target_scores = [logits[i, logits.shape[1] - g - 1:] for i, g in enumerate(gammas)]

        # 3. Every row accepts its own prefix of its own draft, then the target's token.
        verdicts = judge_rows(target_scores, draft_tokens, draft_probs, temperature, generator)
        for r, drafted, g, (n, next_token) in zip(active, draft_tokens, gammas, verdicts):
            draft_calls[r] += g
            new_tokens, sources = round_output(drafted, n, next_token)
            record_round(results[r].stats, len(drafted), n, draft_calls[r])
            stops[r] = take_tokens(sequences[r], results[r].tokens, results[r].stats, new_tokens,
                                   sources, eos_id, max_gen, target.config.n_positions)

        # 4. Each row's caches roll back to its own accepted sequence minus the last token.
        keep = [len(sequences[r]) - 1 for r in active]
        target_cache.truncate(keep)
        drafter.roll_back(keep)
        if observers.on_round is not None:
            observers.on_round(BatchRoundReport(sequences, list(active), gammas, [n for n, _ in verdicts],
                                                target_cache, drafter.cache))

        # 5. Finished rows leave the batch.
        active = _drop_finished(active, stops, [target_cache, drafter])
    batch.seconds = time.perf_counter() - start
    _finish(results, stops, start)
    return batch


