"""What callers hand the generators, checked: a clear error says what was wrong and how to fix it.

    SamplingParams(temperature, top_k, top_p, generator)   how every token is drawn, the same for
                                                            the target's p and the draft's q
    Observers(on_tokens, on_round, trace)                   who watches a generation as it goes

Each is one value, so a generator's signature names what it needs (target, draft, prefix, max_gen,
gamma, sampling, eos_id, observers) and a new option changes one class, not every generator.
"""

from dataclasses import dataclass
from typing import Callable


def check_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is drawn: the logits divided by temperature, then top_k, then top_p
    (spec_decoding.sampling.logits_to_probs), then a draw with `generator` (a torch.Generator on
    the models' device, or None for torch's global one). temperature 0 is greedy: the argmax, and
    top_k, top_p and generator are not used."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    generator: object = None  # torch.Generator | None

    def __post_init__(self):
        # inf would flatten p and q to NaN wherever a logit is -inf (e.g. outside a drafter's
        # reduced vocabulary); nan compares false to everything
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < float("inf"):
            raise ValueError(f"temperature must be a finite number >= 0 (0 means greedy), got {t!r}")
        if self.top_k is not None:
            check_positive_int("top_k", self.top_k)
        if self.top_p is not None and (isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float))
                                       or not 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def filters(self) -> tuple:
        """(temperature, top_k, top_p): what logits_to_probs takes."""
        return self.temperature, self.top_k, self.top_p


GREEDY = SamplingParams(temperature=0.0)


def check_sampling(sampling) -> "SamplingParams":
    """The sampling argument of a generator: a SamplingParams (None: greedy is not assumed; say it)."""
    if not isinstance(sampling, SamplingParams):
        raise ValueError(f"sampling must be a SamplingParams (e.g. SamplingParams(temperature=0.8, "
                         f"top_k=50) or spec_decoding.GREEDY), got {type(sampling).__name__}")
    return sampling


@dataclass(frozen=True)
class Observers:
    """Who watches a generation, all optional:
    on_tokens(tokens, sources): after each round, its new tokens and where each came from (FROM_*);
    on_round(report): each round as a RoundReport (spec_decoding.result): p, q, the verdict;
    trace: True records every round in result.trace (spec_decoding.presentation.trace)."""

    on_tokens: Callable | None = None
    on_round: Callable | None = None
    trace: bool = False

    def __post_init__(self):
        for name in ("on_tokens", "on_round"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise ValueError(f"Observers.{name} must be a function, got {getattr(self, name)!r}")
        if not isinstance(self.trace, bool):
            raise ValueError(f"Observers.trace must be True or False, got {self.trace!r}")


NO_OBSERVERS = Observers()


def check_observers(observers, allowed=("on_tokens", "on_round", "trace"), who: str = "this generator") -> Observers:
    """The observers argument: None (nobody watches) or an Observers using only what `who` reports."""
    if observers is None:
        return NO_OBSERVERS
    if not isinstance(observers, Observers):
        raise ValueError(f"observers must be an Observers (e.g. Observers(on_tokens=print)), got "
                         f"{type(observers).__name__}")
    unused = [name for name in ("on_tokens", "on_round", "trace")
              if name not in allowed and getattr(observers, name) not in (None, False)]
    if unused:
        raise ValueError(f"{who} reports no {', '.join(unused)}: it offers {', '.join(allowed) or 'no observers'}")
    return observers
