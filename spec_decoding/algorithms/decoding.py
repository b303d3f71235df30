"""Pieces the three generators share: checking their inputs, feeding the target the draft tokens
to score, the bookkeeping of a speculative round (how many tokens to draft, what the round
outputs, counting it, rolling back), and handing each round to its observers."""

import torch

from gpt2 import GPT2
from ..caches import new_cache
from ..contracts import Observers, SamplingParams, check_positive_int
from ..presentation.trace import Trace
from ..result import (FROM_BONUS, FROM_CORRECTION, FROM_DRAFT, FROM_TARGET, STOP_CONTEXT_FULL,
                      STOP_EOS, STOP_MAX_GEN, GenerationStats)


def prompt_to_list(prefix, model: GPT2) -> list[int]:
    """A list of ints or a 1-D LongTensor -> list of ints, checked against the model."""
    if isinstance(prefix, torch.Tensor):
        if prefix.dim() != 1 or prefix.dtype not in (torch.long, torch.int, torch.int16):
            raise ValueError(
                f"prefix must be a 1-D LongTensor (or a list of ints); got shape "
                f"{tuple(prefix.shape)} and dtype {prefix.dtype}"
            )
        prefix = prefix.tolist()
    if isinstance(prefix, (str, bytes)) or not all(isinstance(t, int) for t in prefix):
        raise ValueError("prefix must be a list of token ids (ints); encode text with gpt2.encode()")
    prompt = list(prefix)
    if not prompt:
        raise ValueError("prefix is empty: give at least one token (e.g. [50256], <|endoftext|>)")
    vocab = model.config.vocab_size
    if bad := [t for t in prompt if not 0 <= t < vocab]:
        raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab})")
    n_pos = model.config.n_positions
    if len(prompt) >= n_pos:
        raise ValueError(
            f"The prompt has {len(prompt)} tokens but the context window holds {n_pos}: it must be "
            f"shorter than {n_pos} to leave room for new tokens. Shorten the prompt."
        )
    return prompt


def check_drafter(target: GPT2, drafter) -> None:
    """The drafter must propose tokens from the target's vocabulary, on the target's device."""
    vocab = drafter.vocab_size
    if vocab is not None and vocab != target.config.vocab_size:
        raise ValueError(
            f"The draft's vocabulary ({vocab} tokens) differs from the target's "
            f"({target.config.vocab_size}): speculative decoding needs both models to share one "
            f"tokenizer. Pick a draft from the same family."
        )
    device = target.wpe.weight.device
    if drafter.device is not None and drafter.device != device:
        raise ValueError(
            f"target is on {device} but the draft is on {drafter.device}; load both on the same device"
        )


def start_generation(target: GPT2, drafter, prefix, max_gen: int, gamma: int, extra_slots: int = 0):
    """Check the inputs and set up a speculative generation: returns (tokens, target_cache,
    stats), tokens being the whole sequence (prompt first), which grows as tokens are taken.
    gamma: draft positions per round (a token tree: its depth); extra_slots: target cache slots
    for a token tree's nodes."""
    check_drafter(target, drafter)
    check_positive_int("max_gen", max_gen)
    check_positive_int("gamma", gamma)
    tokens = prompt_to_list(prefix, target)
    target_cache = new_cache(target, len(tokens), max_gen, extra_slots)
    drafter.start(list(tokens), max_gen)
    stats = GenerationStats(drafted_by_position=[0] * gamma, accepted_by_position=[0] * gamma)
    return tokens, target_cache, stats


def target_forward(target: GPT2, target_cache, tokens: list[int], draft_tokens: list[int],
                   drafter=None) -> torch.Tensor:
    """Score the draft in one target forward: logits [len(draft_tokens) + 1, V]. Row i comes after
    draft_tokens[:i], so it judges draft_tokens[i]; the last row gives the token after all of them.
    The drafter (if given) is handed the target's features of every position fed
    (Drafter.observe_target_features): feature drafters draft from them."""
    start = target_cache.length
    new = torch.tensor([tokens[start:] + draft_tokens], device=target.wpe.weight.device)
    logits, features = target(new, target_cache, num_last_logits=len(draft_tokens) + 1, return_features=True)
    if drafter is not None:
        drafter.observe_target_features(start, features[0])
    return logits[0]


def take_tokens(tokens: list[int], out: list[int], stats: GenerationStats, new_tokens, sources,
                eos_id: int | None, max_gen: int, n_positions: int, on_tokens=None) -> str | None:
    """Append new tokens to the sequence `tokens` (prompt included) and to the output `out`,
    noting where each came from; nothing is taken after eos. Returns the stop reason, or None."""
    taken = 0
    stop = None
    for token, source in zip(new_tokens, sources):
        tokens.append(token)
        out.append(token)
        stats.token_sources.append(source)
        taken += 1
        if token == eos_id:
            stop = STOP_EOS
            break
    if on_tokens:
        on_tokens(list(new_tokens[:taken]), list(sources[:taken]))
    if stop is None and len(out) >= max_gen:
        stop = STOP_MAX_GEN
    if stop is None and len(tokens) >= n_positions:
        stop = STOP_CONTEXT_FULL
    return stop


def round_gamma(gamma: int, out_len: int, max_gen: int, seq_len: int, target: GPT2, drafter) -> int:
    """How many tokens to draft this round: gamma, fewer near the end. A round outputs up to g + 1
    tokens, so g + 1 <= tokens still allowed keeps the output within max_gen and the context window
    (no model is ever fed a position >= its n_positions). 0 means a plain target step."""
    tokens_left = min(max_gen - out_len, target.config.n_positions - seq_len)
    if drafter.n_positions is not None:
        tokens_left = min(tokens_left, drafter.n_positions - seq_len)
    return max(0, min(gamma, tokens_left - 1))


def round_output(draft_tokens: list[int], n_accepted: int, next_token: int) -> tuple[list[int], list[str]]:
    """The tokens a round outputs, (tokens, sources): the accepted draft tokens, then the target's
    own token (a correction after a rejection, a bonus after a fully accepted draft, or a plain
    target step when nothing was drafted)."""
    n_drafted = len(draft_tokens)
    if n_drafted == 0:
        last = FROM_TARGET
    else:
        last = FROM_BONUS if n_accepted == n_drafted else FROM_CORRECTION
    return draft_tokens[:n_accepted] + [next_token], [FROM_DRAFT] * n_accepted + [last]


def record_round(stats: GenerationStats, n_drafted: int, n_accepted: int, draft_calls: int,
                 n_nodes: int | None = None) -> None:
    """Count one round. draft_calls: the drafter's forward passes so far (its forward_calls).
    n_drafted: draft positions (a token tree's depth); n_nodes: draft tokens the target scored
    (default n_drafted; a token tree's node count)."""
    stats.target_calls += 1
    stats.draft_calls = draft_calls
    stats.nodes_verified += n_drafted if n_nodes is None else n_nodes
    stats.gamma_by_round.append(n_drafted)
    if n_drafted:
        stats.accepted_depths.append(n_accepted)
        stats.rounds += 1
        stats.tokens_drafted += n_drafted
        stats.tokens_accepted += n_accepted
        stats.rejections += n_accepted < n_drafted
        for counts in (stats.drafted_by_position, stats.accepted_by_position):
            counts.extend([0] * (n_drafted - len(counts)))  # a round may draft more than gamma
        for i in range(n_drafted):
            stats.drafted_by_position[i] += 1
            stats.accepted_by_position[i] += i < n_accepted


def roll_back(target_cache, drafter, seq_len: int) -> None:
    """After a round, the target's cache and the drafter keep the accepted sequence minus its last
    token (the next round feeds it). O(1) for caches: only their lengths move."""
    target_cache.truncate(seq_len - 1)
    drafter.roll_back(seq_len - 1)


def round_observers(observers: Observers, tokens: list[int], gamma: int, sampling: SamplingParams,
                    branching=None):
    """Who sees each round of a generation: the caller's observers.on_round(report), and with
    observers.trace a Trace recorder subscribed the same way (the generators never call the trace
    themselves).

    Returns (notify, trace): notify(report) hands one RoundReport to every observer (None when
    there is no observer, so a generation without one builds no report); trace is the Trace for
    GenerationResult.trace, or None."""
    recorder = (Trace(list(tokens), gamma, sampling.temperature, sampling.top_k, sampling.top_p, branching=branching)
                if observers.trace else None)
    watching = [f for f in (observers.on_round, recorder) if f is not None]
    if not watching:
        return None, None

    def notify(report) -> None:
        for observe in watching:
            observe(report)

    return notify, recorder
