"""What the generators return (the new tokens and statistics about how they were made) and what
they hand their observers after each round (RoundReport)."""

from dataclasses import asdict, dataclass, field

# Where each output token came from.
FROM_DRAFT = "draft"  # a draft token the target accepted
FROM_CORRECTION = "correction"  # the target's token in place of the first rejected draft token
FROM_BONUS = "bonus"  # the target's extra token after all gamma draft tokens were accepted
FROM_TARGET = "target"  # plain autoregressive decoding (the baseline)
FROM_DRAFT_BRANCH = "draft_branch"  # token trees: an accepted draft token from a side branch

STOP_MAX_GEN = "max_gen"
STOP_EOS = "eos"
STOP_CONTEXT_FULL = "context_full"

ROOT = -1  # token trees: the parent of the depth-1 nodes (the sequence's last token)


@dataclass
class RoundReport:
    """One round, as a generator hands it to its observers: the on_round callback, and the trace
    recorder (spec_decoding.presentation.trace) with Observers(trace=True). The tensors are the round's own: an observer
    reads them and must not change them.

    A chain of g draft tokens: target_logits [g + 1, V]. A token tree of N nodes: target_logits
    [N + 1, V] (row 0 after the root, row 1 + i after node i) and draft_tokens = tree.tokens.
    """

    draft_tokens: list[int]
    target_logits: "torch.Tensor"  # the target's logits after each prefix (each tree node)
    n_accepted: int  # draft tokens accepted (a tree: the length of the accepted path)
    next_token: int  # the target's own token: a correction, a bonus, or a plain step's token
    n_out: int  # the output's length after the round
    temperature: float  # 0: greedy
    target_probs: "torch.Tensor | None" = None  # sampling: p, as the rejection step used it
    draft_probs: "torch.Tensor | None" = None  # chain sampling: q [g, V] (point masses if not sampled)
    verdict: object = None  # sampling: rejection.Verdict (a chain); a tree: tree.TreeVerdict
    tree: object = None  # a tree round: its drafters.token_tree.TokenTree (draft_probs per node are in it)


@dataclass
class GenerationStats:
    target_calls: int = 0  # forward passes of the target (the first one includes the prompt)
    draft_calls: int = 0  # forward passes of the draft
    rounds: int = 0  # draft-then-verify rounds
    tokens_drafted: int = 0
    tokens_accepted: int = 0
    # Draft tokens the target judged and rejected: at most one a round (the first it judged
    # wrong; the draft tokens after it are dropped unjudged, see alpha), so also the rounds that
    # ended in a rejection. Dropped tokens in all: tokens_drafted - tokens_accepted.
    rejections: int = 0
    drafted_by_position: list[int] = field(default_factory=list)  # [gamma]: rounds that drafted position i
    accepted_by_position: list[int] = field(default_factory=list)  # [gamma]: rounds that accepted it
    nodes_verified: int = 0  # draft tokens the target scored (a chain: tokens_drafted; a tree: its nodes)
    accepted_depths: list[int] = field(default_factory=list)  # per round: draft tokens accepted
    token_sources: list[str] = field(default_factory=list)  # one FROM_* per output token
    gamma_by_round: list[int] = field(default_factory=list)  # draft tokens of each round (0: plain step)
    stop_reason: str = ""  # STOP_MAX_GEN, STOP_EOS or STOP_CONTEXT_FULL
    seconds: float = 0.0  # wall time of the whole generation, prompt included

    @property
    def tokens_generated(self) -> int:
        return len(self.token_sources)

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted draft tokens (None when nothing was drafted)."""
        return self.tokens_accepted / self.tokens_drafted if self.tokens_drafted else None

    @property
    def alpha(self) -> float | None:
        """Accepted / judged draft tokens: the per-token acceptance chance of Leviathan's theory.
        Tokens drafted after a round's first rejection are never judged, so for gamma > 1 this is
        higher than acceptance_rate, and it is what spec_decoding.policies.theory expects."""
        judged = self.tokens_accepted + self.rejections
        return self.tokens_accepted / judged if judged else None

    @property
    def tokens_per_target_call(self) -> float:
        return self.tokens_generated / self.target_calls if self.target_calls else 0.0

    @property
    def nodes_per_target_call(self) -> float:
        """Draft tokens the target scored per call: its verification width (a tree's nodes)."""
        return self.nodes_verified / self.target_calls if self.target_calls else 0.0

    @property
    def acceptance_by_position(self) -> list[float | None]:
        return [a / d if d else None for a, d in zip(self.accepted_by_position, self.drafted_by_position)]

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_generated / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        for name in ("tokens_generated", "acceptance_rate", "alpha", "tokens_per_target_call",
                     "nodes_per_target_call", "acceptance_by_position", "tokens_per_second"):
            d[name] = getattr(self, name)
        return d


@dataclass
class GenerationResult:
    tokens: list[int]  # the new tokens only (the prompt is not repeated)
    stats: GenerationStats
    trace: "Trace | None" = None  # per-round record (spec_decoding.presentation.trace), when asked for with Observers(trace=True)
