"""Checks that tell a correct speculative decoder from a subtly wrong one.

The tests, the bug-zoo notebook and the assignment grader all use these, and so can you on your
own drafter or generator. Each check returns a small result object with `passed` and a `message`
in plain words; `assert result.passed, result.message` turns it into a test.

A generator here is any callable `generate_fn(prefix, max_gen, **kwargs)` returning a
GenerationResult (or a plain list of tokens), kwargs being what the check passes: `sampling` (a
SamplingParams: the check's settings, temperature, top_k and top_p, with its own seeded
generator) and `observers` (an Observers with on_tokens). Bind the models and gamma with
functools.partial:

    from functools import partial
    from spec_decoding import speculative_sampling
    from spec_decoding.checks import check_lossless

    result = check_lossless(partial(speculative_sampling, target, draft, gamma=2), target,
                            prompt=[1, 2, 3], n_tokens=3, settings=dict(temperature=1.0),
                            samples=6000, seed=0)
    print(result)  # passed, p-value, total variation (and what a perfect sampler would show)

- check_lossless: sampled output follows the target's distribution exactly. The exact
  distribution of the first n_tokens is enumerated from the target (small vocabularies only: V^n
  outcomes) and compared with samples by Pearson's chi-square test.
- check_greedy_matches_target: greedy speculative output equals the target's own greedy output.
- check_caches_after_every_round: every KV cache holds, at the start of every round and at the
  end, exactly what a fresh forward over the accepted tokens gives (rollback done right).
- check_batch_greedy: every row of a batched greedy generation equals that prompt's own greedy output.
- check_speed: the speed bugs that stay lossless. The run's acceptance and tokens per target call
  are compared with what the pair's own distributions predict (fresh forwards of both models over
  the output: sum(min(p, q)) at each position); a run well below them fails with "lossless, but
  slower: ...".
"""

from dataclasses import dataclass, field
import itertools

import torch

from ..algorithms.autoregressive import autoregressive_generate
from ..contracts import Observers, SamplingParams
from ..policies.theory import expected_tokens_per_round
from ..result import FROM_CORRECTION, FROM_DRAFT
from ..sampling import logits_to_probs

P_VALUE_THRESHOLD = 1e-3  # below this, the samples are declared not to follow the target
SPEED_Z = 4.0  # check_speed: this many standard errors below the prediction fails (one-sided p ~ 3e-5)
SPEED_SLACK = 0.15  # ... and tokens per call more than this share below (the formula's idealisation)
MAX_OUTCOMES = 1_000_000  # V ** n_tokens above this is too many cells to enumerate and fill


def seeded_generator(target, seed: int) -> torch.Generator:
    """A generator on the target's device (a GPU's sampling draws from a GPU generator), seeded."""
    return torch.Generator(device=target.wpe.weight.device).manual_seed(seed)


def _tokens_of(result) -> list[int]:
    return list(result.tokens) if hasattr(result, "tokens") else list(result)


# ------------------------------------------------------------------------------------------------
# Exact enumeration and the chi-square comparison
# ------------------------------------------------------------------------------------------------

@torch.inference_mode()
def exact_distribution(target, prompt: list[int], n_tokens: int, settings: dict) -> torch.Tensor:
    """The target's exact distribution of its next n_tokens tokens, [V] * n_tokens (float64):
    P(t1, ..., tn) = p(t1) p(t2 | t1) ... p(tn | t1..tn-1), after the sampling settings
    (temperature > 0, top_k, top_p). One batched forward over all V^(n-1) prefixes."""
    V = target.config.vocab_size
    if settings.get("temperature", 1.0) == 0:
        raise ValueError("exact_distribution needs temperature > 0 (for greedy decoding use "
                         "check_greedy_matches_target)")
    if V ** n_tokens > MAX_OUTCOMES:
        raise ValueError(
            f"Enumerating {n_tokens} tokens over a {V}-token vocabulary means {V ** n_tokens:,} "
            f"outcomes (at most {MAX_OUTCOMES:,}): use a tiny vocabulary (e.g. 16) or fewer tokens")
    if len(prompt) + n_tokens - 1 > target.config.n_positions:
        raise ValueError(f"prompt + {n_tokens - 1} tokens do not fit the context window")
    device = target.wpe.weight.device
    prefixes = torch.tensor(list(itertools.product(range(V), repeat=n_tokens - 1)),
                            dtype=torch.long, device=device).reshape(V ** (n_tokens - 1), n_tokens - 1)
    idx = torch.cat([torch.tensor(prompt, device=device).expand(len(prefixes), -1), prefixes], 1)
    logits = target(idx, num_last_logits=n_tokens).double()  # [V^(n-1), n, V]
    probs = logits_to_probs(logits, **settings).double()
    # Row r is the prefix (t1..tn-1); position k of it gives p(. | prompt, t1..tk).
    prefix_prob = torch.ones(len(prefixes), dtype=torch.float64, device=device)
    for k in range(n_tokens - 1):
        prefix_prob *= probs[:, k].gather(1, prefixes[:, k:k + 1]).squeeze(1)
    joint = prefix_prob[:, None] * probs[:, n_tokens - 1]  # [V^(n-1), V]
    return joint.reshape((V,) * n_tokens).cpu()


def counts_of(samples, vocab_size: int, n_tokens: int) -> torch.Tensor:
    """How often each n-token outcome occurs among the samples (each a token list), [V^n]."""
    counts = torch.zeros(vocab_size ** n_tokens, dtype=torch.float64)
    for s in samples:
        cell = 0
        for t in s[:n_tokens]:
            cell = cell * vocab_size + t
        counts[cell] += 1
    return counts


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square test of counts against probs (same number of cells). An outcome of
    probability 0 that occurs gives p = 0. Cells expecting fewer than 5 samples are pooled into
    one, as the test requires."""
    counts, probs = counts.reshape(-1).double(), probs.reshape(-1).double()
    impossible = probs == 0
    if counts[impossible].sum() > 0:
        return 0.0
    counts, probs = counts[~impossible], probs[~impossible]
    expected = probs / probs.sum() * counts.sum()
    impossible = expected == 0  # outcomes of probability 0 (top-k, top-p)
    if (counts[impossible] > 0).any():
        return 0.0  # the sampler made an outcome the target never makes
    counts, expected = counts[~impossible], expected[~impossible]  # else 0/0 in a pooled cell
    small = expected < 5
    if small.any():
        counts = torch.cat([counts[~small], counts[small].sum().view(1)])
        expected = torch.cat([expected[~small], expected[small].sum().view(1)])
    if len(expected) < 2:
        return 1.0  # too few samples to tell anything
    statistic = ((counts - expected) ** 2 / expected).sum()
    df = torch.tensor((len(expected) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(df, statistic / 2))  # P(chi-square(df) > statistic)


def total_variation(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Half the L1 distance between the empirical distribution of counts and probs. Even a
    perfect sampler shows some (finite samples); compare with LosslessCheck.reference_tv."""
    counts, probs = counts.reshape(-1).double(), probs.reshape(-1).double()
    return 0.5 * (counts / counts.sum() - probs / probs.sum()).abs().sum().item()


@dataclass
class LosslessCheck:
    p_value: float  # chi-square test of the samples against the exact distribution
    total_variation: float  # of the samples' empirical distribution from the exact one
    reference_tv: float  # what a perfect sampler shows with as many samples (sampling noise)
    samples: int
    passed: bool  # p_value > threshold
    counts: torch.Tensor = field(repr=False)  # [V^n] outcome counts
    exact: torch.Tensor = field(repr=False)  # [V] * n exact probabilities

    @property
    def message(self) -> str:
        verdict = ("follows the target's distribution" if self.passed
                   else "differs from the target's distribution")
        return (f"the sampler's output {verdict}: total variation {self.total_variation:.3f} "
                f"(a perfect sampler shows about {self.reference_tv:.3f} with {self.samples} "
                f"samples), p = {self.p_value:.2g}")

    def __str__(self):
        return ("PASS: " if self.passed else "FAIL: ") + self.message


def check_samples(samples, exact: torch.Tensor, seed: int = 0,
                  threshold: float = P_VALUE_THRESHOLD) -> LosslessCheck:
    """Compare token lists (each at least n tokens) with an exact distribution [V] * n."""
    n_tokens, V = exact.dim(), exact.shape[0]
    if any(len(s) < n_tokens for s in samples):
        short = min(len(s) for s in samples)
        raise ValueError(f"every sample needs {n_tokens} tokens; one has only {short} "
                         f"(an eos_id stopped it, or max_gen is too small?)")
    counts = counts_of(samples, V, n_tokens)
    # Sampling noise: the same number of draws from the exact distribution itself.
    g = torch.Generator().manual_seed(seed + 10_000)
    perfect = torch.multinomial(exact.reshape(-1).float(), len(samples), replacement=True, generator=g)
    perfect_counts = torch.bincount(perfect, minlength=V ** n_tokens).double()
    p_value = chi_square_p_value(counts, exact)
    return LosslessCheck(p_value, total_variation(counts, exact), total_variation(perfect_counts, exact),
                         len(samples), p_value > threshold, counts, exact)


def check_lossless(generate_fn, target, prompt: list[int], n_tokens: int = 3,
                   settings: dict | None = None, samples: int = 5000, seed: int = 0,
                   threshold: float = P_VALUE_THRESHOLD) -> LosslessCheck:
    """Is generate_fn's sampled output distributed exactly as the target's own? Draws `samples`
    generations of n_tokens tokens, generate_fn(prompt, n_tokens, sampling=SamplingParams(**settings,
    generator=g)), with
    one torch.Generator seeded `seed`, and compares the counts of their n-token outcomes with the
    exactly enumerated distribution (chi-square test, p > threshold passes).

    Power: with a 16-token vocabulary, 3 tokens and a few thousand samples it tells the draft's
    own samples, or resampling from p instead of norm(max(0, p - q)), from the target's at
    p < 1e-6 (notebooks/06_bug_zoo shows which bugs it catches with how many samples)."""
    settings = dict(temperature=1.0) if settings is None else dict(settings)
    exact = exact_distribution(target, prompt, n_tokens, settings)
    g = seeded_generator(target, seed)
    sampling = SamplingParams(**settings, generator=g)
    drawn = [_tokens_of(generate_fn(prompt, n_tokens, sampling=sampling)) for _ in range(samples)]
    return check_samples(drawn, exact, seed, threshold)


# ------------------------------------------------------------------------------------------------
# Greedy: identical to the target's own greedy output
# ------------------------------------------------------------------------------------------------

@dataclass
class GreedyCheck:
    passed: bool
    tokens: list[int]  # what generate_fn produced
    expected: list[int]  # the target's own greedy output
    first_mismatch: int | None  # index of the first differing token (or of the length mismatch)

    @property
    def message(self) -> str:
        if self.passed:
            return f"greedy output equals the target's own greedy output ({len(self.expected)} tokens)"
        i = self.first_mismatch
        got = self.tokens[i] if i < len(self.tokens) else "nothing"
        return (f"greedy output differs from the target's own greedy output at token {i}: "
                f"got {got}, the target chooses {self.expected[i] if i < len(self.expected) else 'nothing'} "
                f"({len(self.tokens)} tokens made, {len(self.expected)} expected)")

    def __str__(self):
        return ("PASS: " if self.passed else "FAIL: ") + self.message


def check_greedy_matches_target(generate_fn, target, prompt: list[int], max_gen: int = 30,
                                eos_id: int | None = None) -> GreedyCheck:
    """generate_fn(prompt, max_gen[, eos_id=...]) must return exactly the target's greedy tokens."""
    kwargs = {} if eos_id is None else dict(eos_id=eos_id)
    tokens = _tokens_of(generate_fn(prompt, max_gen, **kwargs))
    expected = autoregressive_generate(target, prompt, max_gen, **kwargs).tokens
    mismatch = next((i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b), None)
    if mismatch is None and len(tokens) != len(expected):
        mismatch = min(len(tokens), len(expected))
    return GreedyCheck(mismatch is None, tokens, expected, mismatch)


# ------------------------------------------------------------------------------------------------
# KV caches: equal to a fresh forward over the accepted tokens after every round
# ------------------------------------------------------------------------------------------------

@torch.inference_mode()
def cache_difference(model, cache, sequence: list[int]) -> float:
    """Largest |difference| between the cache's keys/values at positions [0, cache.length) and
    those of a fresh forward over sequence[:cache.length]."""
    if cache.length == 0:
        return 0.0
    fresh = model.new_kv_cache(max_len=cache.length)
    model(torch.tensor([sequence[:cache.length]], device=model.wpe.weight.device), fresh)
    n = cache.length
    return max((got[:, :, :n].float() - want[:, :, :n].float()).abs().max().item()
               for layer in range(len(cache.keys))  # an early-exit (layer-skip) cache has fewer
               for got, want in ((cache.keys[layer], fresh.keys[layer]),
                                 (cache.values[layer], fresh.values[layer])))


@dataclass
class CacheSnapshot:
    """One cache, checked at the start of a round (or at the end of the generation)."""
    role: str  # "target" or "draft"
    round: int  # rounds completed before this check
    cache_length: int
    sequence_length: int  # accepted tokens so far, prompt included
    problem: str | None  # None: the cache is right
    at_end: bool = False  # checked after the generation returned, not at the start of a round


@dataclass
class CacheCheck:
    passed: bool
    snapshots: list[CacheSnapshot]

    @property
    def message(self) -> str:
        if self.passed:
            return (f"every KV cache equals a fresh forward over the accepted tokens at every round "
                    f"({len(self.snapshots)} checks)")
        return next(s.problem for s in self.snapshots if s.problem)

    def lags(self, role: str) -> list[int]:
        """sequence_length - cache_length at each check of `role`'s cache."""
        return [s.sequence_length - s.cache_length for s in self.snapshots if s.role == role]

    def __str__(self):
        return ("PASS: " if self.passed else "FAIL: ") + self.message


def check_caches_after_every_round(generate_fn, target, draft=None, prompt: list[int] = (1, 2, 3),
                                   max_gen: int = 30, settings: dict | None = None, seed: int = 0,
                                   atol: float = 1e-5) -> CacheCheck:
    """Run generate_fn(prompt, max_gen, observers=Observers(on_tokens=...), [sampling=...]) once and check
    the KV caches of target and draft (GPT2 models; draft None for a model-free drafter) at the
    start of every round and at the end: a cache of length L must hold exactly the keys/values
    of a fresh forward over the first L accepted tokens. A cache not rolled back after a
    rejection still holds the rejected draft tokens and fails.

    How: both models' forward is wrapped for the run, to see each cache and the tokens written
    into it; on_tokens (called once per round with the accepted tokens) tells the sequence."""
    settings = dict(settings or {})
    sequence = list(prompt)
    rounds = [0]
    watched = {}  # id(cache) -> [role, model, cache, tokens written by position, round last checked]
    snapshots = []
    checking = [False]  # True while inspect() runs its own fresh forward: not watched

    def inspect(entry, at_end=False):
        role, model, cache, written, _ = entry
        entry[4] = rounds[0]
        n = cache.length
        problem = None
        if n > len(sequence):
            problem = (f"after round {rounds[0]} the {role}'s KV cache holds {n} positions but only "
                       f"{len(sequence)} tokens are accepted: it was not rolled back")
        elif written[:n] != sequence[:n]:
            bad = next(i for i in range(n) if written[i] != sequence[i])
            problem = (f"after round {rounds[0]} the {role}'s KV cache still holds token {written[bad]} at "
                       f"position {bad} where the accepted sequence has {sequence[bad]}: it was not "
                       f"rolled back after a rejection")
        else:
            checking[0] = True
            try:
                diff = cache_difference(model, cache, sequence)
            finally:
                checking[0] = False
            if diff > atol:
                problem = (f"after round {rounds[0]} the {role}'s KV cache differs from a fresh forward "
                           f"over the accepted tokens (max |difference| {diff:.2g})")
        if problem and role == "draft":
            # A drafter's state only shapes the proposals; the q it reports is still the one it
            # sampled from, so the output keeps the target's distribution: only acceptance suffers.
            problem = "lossless, but slower: " + problem
        snapshots.append(CacheSnapshot(role, rounds[0], n, len(sequence), problem, at_end))

    def watch(model, role):
        real_forward = model.forward

        def forward(idx, cache=None, num_last_logits=None, **kwargs):
            if cache is not None and not checking[0]:
                entry = watched.setdefault(id(cache), [role, model, cache, [], -1])
                if entry[4] < rounds[0]:  # first use of this cache since the last round ended
                    inspect(entry)
                written = entry[3]
                del written[cache.length:]
                written.extend(idx[0].tolist())
            return real_forward(idx, cache, num_last_logits, **kwargs)  # kwargs: exit_layer

        model.forward = forward  # an instance attribute: nn.Module.__call__ finds it first

    def on_tokens(tokens, sources):
        sequence.extend(tokens)
        rounds[0] += 1

    models = [(target, "target")] + ([(draft, "draft")] if draft is not None and draft is not target else [])
    for model, role in models:
        watch(model, role)
    kwargs = dict(observers=Observers(on_tokens=on_tokens))
    if settings.get("temperature", 0) != 0:
        kwargs.update(sampling=SamplingParams(**settings, generator=seeded_generator(target, seed)))
    try:
        generate_fn(list(prompt), max_gen, **kwargs)
    except Exception:
        # A cache left too long often makes the next forward fail; report the cause if seen.
        if not any(s.problem for s in snapshots):
            raise
    else:
        for entry in watched.values():
            inspect(entry, at_end=True)
    finally:
        for model, _ in models:
            del model.forward
    return CacheCheck(all(s.problem is None for s in snapshots), snapshots)


# ------------------------------------------------------------------------------------------------
# Stopping: exactly max_gen tokens, nothing after eos
# ------------------------------------------------------------------------------------------------

@dataclass
class StoppingCheck:
    passed: bool
    problems: list[str]

    @property
    def message(self) -> str:
        if self.passed:
            return "stops right: exactly max_gen tokens, and eos is the last token when it comes"
        return self.problems[0]

    def __str__(self):
        return ("PASS: " if self.passed else "FAIL: ") + self.message


def check_stopping(generate_fn, prompt: list[int], max_gens=range(1, 12), settings: dict | None = None,
                   seeds=range(3), eos_position: int = 4) -> StoppingCheck:
    """generate_fn(prompt, max_gen, [sampling=...], [eos_id=...]) must (1) return
    exactly max_gen tokens for every max_gen in max_gens (the context window must not be reached),
    with nothing made and thrown away when it returns stats (every accepted draft token and every
    target call's own token is in the output); (2) with eos_id set to the token a free run made
    at eos_position, return that run's tokens up to the first eos, eos kept, nothing after."""
    settings = dict(settings or {})
    sampling = settings.get("temperature", 0) != 0

    def run(max_gen, seed, **kwargs):
        if sampling:
            kwargs.update(sampling=SamplingParams(**settings, generator=torch.Generator().manual_seed(seed)))
        return generate_fn(list(prompt), max_gen, **kwargs)

    problems = []
    for max_gen in max_gens:
        result = run(max_gen, max_gen)
        tokens = _tokens_of(result)
        if len(tokens) != max_gen:
            problems.append(f"asked for max_gen={max_gen} tokens, got {len(tokens)}"
                            + (": a token past max_gen (a bonus token?)" if len(tokens) > max_gen else ""))
        elif hasattr(result, "stats") and result.stats.tokens_accepted + result.stats.target_calls != max_gen:
            s = result.stats
            problems.append(f"max_gen={max_gen}: {s.tokens_accepted} accepted draft tokens + "
                            f"{s.target_calls} target calls != {max_gen} tokens: something was made "
                            f"past max_gen and thrown away")
    for seed in seeds:
        free = _tokens_of(run(eos_position + 8, seed))
        eos = free[eos_position]
        expected = free[:free.index(eos) + 1]
        stopped = _tokens_of(run(eos_position + 8, seed, eos_id=eos))
        if stopped != expected:
            extra = (f": {len(stopped) - len(expected)} token(s) after eos were kept"
                     if stopped[:len(expected)] == expected else "")
            problems.append(f"with eos_id={eos} the output should stop after {len(expected)} tokens "
                            f"(at the first eos, kept), got {len(stopped)} tokens{extra}")
    return StoppingCheck(not problems, problems)


# ------------------------------------------------------------------------------------------------
# Batches: every row is its prompt's own greedy output
# ------------------------------------------------------------------------------------------------

def check_batch_greedy(batch_generate_fn, target, prompts: list[list[int]], max_gen: int = 20) -> GreedyCheck:
    """batch_generate_fn(prompts, max_gen) -> a BatchedResult (or one token list per prompt) must
    give every row exactly its prompt's own greedy output from the target. Returns the first row
    that differs (its GreedyCheck, the message naming the row), or a pass."""
    result = batch_generate_fn([list(p) for p in prompts], max_gen)
    rows = result.tokens if hasattr(result, "tokens") else result
    for i, (prompt, tokens) in enumerate(zip(prompts, rows)):
        row = check_greedy_matches_target(lambda *_: list(tokens), target, list(prompt), max_gen)
        if not row.passed:
            return BatchGreedyCheck(False, row.tokens, row.expected, row.first_mismatch, i, len(prompts))
    return BatchGreedyCheck(True, [], [], None, None, len(prompts))


@dataclass
class BatchGreedyCheck(GreedyCheck):
    row: int | None = None  # the first row that differs
    rows: int = 0

    @property
    def message(self) -> str:
        if self.passed:
            return f"every one of the {self.rows} rows equals its prompt's own greedy output"
        return f"row {self.row} of the batch: " + GreedyCheck.message.fget(self)


# ------------------------------------------------------------------------------------------------
# Speed: acceptance and tokens per target call against what the pair's distributions predict
# ------------------------------------------------------------------------------------------------

@torch.inference_mode()
def acceptance_by_position(target, draft, prompt: list[int], tokens: list[int], settings: dict) -> list[float]:
    """sum(min(p, q)) before each output token [len(tokens)]: the chance that a draft token drawn
    from q is accepted there (Leviathan et al. 2023, section 3), p and q from fresh forwards of the
    target and the draft over prompt + tokens (no cache a run could have spoiled). Greedy
    (temperature 0): 1 where the two argmaxes agree, else 0."""
    device = target.wpe.weight.device
    idx = torch.tensor([list(prompt) + list(tokens)[:-1]], device=device)
    n = len(tokens)
    target_logits = target(idx, num_last_logits=n)[0].double()  # [n, V]
    draft_logits = draft(idx.to(draft.wpe.weight.device), num_last_logits=n)[0].double().to(device)
    if settings.get("temperature", 0) == 0:
        return (target_logits.argmax(-1) == draft_logits.argmax(-1)).double().tolist()
    p, q = logits_to_probs(target_logits, **settings), logits_to_probs(draft_logits, **settings)
    return torch.minimum(p, q).sum(-1).tolist()


@dataclass
class SpeedCheck:
    passed: bool
    gamma: int
    judged: int  # draft tokens the target judged (accepted, or the first rejected of a round)
    accepted: int
    expected_accepted: float  # sum of sum(min(p, q)) over the judged positions
    acceptance_z: float  # (accepted - expected) / its standard deviation
    measured_alpha: float  # mean sum(min(p, q)) over every output position: the pair's acceptance
    rounds: int  # rounds that could draft gamma tokens (not cut by max_gen or the window)
    tokens_per_call: float  # mean tokens those rounds output
    predicted_tokens_per_call: float  # (1 - alpha^(gamma+1)) / (1 - alpha), alpha = measured_alpha
    tokens_z: float  # (tokens_per_call - predicted) / its standard error
    problem: str | None = None

    @property
    def rate(self) -> float:
        return self.accepted / self.judged if self.judged else 0.0

    @property
    def message(self) -> str:
        if self.problem:
            return self.problem
        return (f"speed as the pair predicts: {self.accepted} of {self.judged} judged draft tokens accepted "
                f"({self.expected_accepted:.1f} expected from sum(min(p, q))), {self.tokens_per_call:.2f} "
                f"tokens per target call ({self.predicted_tokens_per_call:.2f} predicted at gamma {self.gamma})")

    def __str__(self):
        return ("PASS: " if self.passed else "FAIL: ") + self.message


def check_speed(generate_fn, target, draft, gamma: int, prompts=((1, 2, 3),), max_gen: int = 24,
                settings: dict | None = None, runs: int = 8, seed: int = 0, z: float = SPEED_Z,
                slack: float = SPEED_SLACK) -> SpeedCheck:
    """Is generate_fn as fast as its pair allows? For the bugs that keep the output's distribution
    (so check_lossless passes) but throw acceptance away. generate_fn(prompt, max_gen,
    [sampling=...]) must return a GenerationResult (its stats) and draft up to `gamma`
    tokens a round with `draft` (a GPT2: the check runs it afresh to measure q).

    `runs` generations (prompts in turn, seeds seed, seed + 1, ...) are measured two ways:
    1. Acceptance. At every judged position the target accepts with probability sum(min(p, q)),
       p and q from fresh forwards over the run's own output (acceptance_by_position): the
       accepted count's expectation is their sum and its variance the sum of a (1 - a), exactly,
       whatever the contexts. Fails when the count is more than z standard deviations below.
    2. Tokens per target call, over rounds that could draft gamma tokens, against
       (1 - alpha^(gamma+1)) / (1 - alpha) with alpha the pair's acceptance measured over every
       output position. The formula idealises (one alpha for every position), so it fails only
       when the run is z standard errors and `slack` below it."""
    settings = dict(settings or {})
    sampling = settings.get("temperature", 0) != 0
    judged = accepted = 0
    expected = variance = 0.0
    all_alphas, sizes = [], []
    for i in range(runs):
        prompt = list(prompts[i % len(prompts)])
        kwargs = dict(sampling=SamplingParams(**settings, generator=seeded_generator(target, seed + i))) \
            if sampling else {}
        result = generate_fn(prompt, max_gen, **kwargs)
        tokens, sources = list(result.tokens), list(result.stats.token_sources)
        alphas = acceptance_by_position(target, draft, prompt, tokens, settings)
        all_alphas += alphas
        for a, source in zip(alphas, sources):
            if source in (FROM_DRAFT, FROM_CORRECTION):
                judged += 1
                accepted += source == FROM_DRAFT
                expected += a
                variance += a * (1 - a)
        window = min(target.config.n_positions, draft.config.n_positions)
        start = 0
        for end, source in enumerate(sources):
            if source != FROM_DRAFT:  # a round ends with the target's own token
                if start + gamma + 1 <= max_gen and len(prompt) + start + gamma + 1 <= window:
                    sizes.append(end + 1 - start)
                start = end + 1
    # Greedy acceptance is certain given the contexts (variance 0): a floor of 1 lets a near-tie
    # of the logits (a cached and a fresh forward may round apart) not count as a bug.
    acceptance_z = (accepted - expected) / max(variance, 1.0) ** 0.5
    alpha = sum(all_alphas) / len(all_alphas)
    predicted = expected_tokens_per_round(alpha, gamma)
    rounds = len(sizes)
    per_call = sum(sizes) / rounds if rounds else 0.0
    sd = (sum((s - per_call) ** 2 for s in sizes) / max(rounds - 1, 1)) ** 0.5 if rounds else 0.0
    tokens_z = (per_call - predicted) / max(sd / max(rounds, 1) ** 0.5, 1e-9)
    check = SpeedCheck(True, gamma, judged, accepted, expected, acceptance_z, alpha, rounds, per_call,
                       predicted, tokens_z)
    if judged and acceptance_z < -z:
        check.passed = False
        check.problem = (f"lossless, but slower: the target accepted {accepted} of {judged} judged draft "
                         f"tokens ({check.rate:.2f}) where the pair's own distributions predict "
                         f"{expected:.1f} ({expected / judged:.2f}; sum(min(p, q)) at each judged position, "
                         f"from fresh forwards), {-acceptance_z:.1f} standard deviations below: the drafts "
                         f"or the acceptance test lose agreement the two models have")
    elif rounds and tokens_z < -z and per_call < (1 - slack) * predicted:
        check.passed = False
        check.problem = (f"lossless, but slower: {per_call:.2f} tokens per target call where the pair's "
                         f"measured acceptance {alpha:.2f} predicts {predicted:.2f} at gamma {gamma} "
                         f"((1 - alpha^(gamma+1)) / (1 - alpha)), {-tokens_z:.1f} standard errors below, "
                         f"while acceptance reads {check.rate:.2f}: fewer tokens are drafted than gamma "
                         f"allows")
    return check
