"""What a round of speculative decoding costs on this machine: the CostModel.

Leviathan's speed-up formula needs two costs, measured on the hardware in use:
  c               one draft step relative to one target step (0 for a model-free drafter);
  verify_cost(g)  the target scoring g + 1 tokens in one forward, relative to one target step
                  (1 in the paper's idealisation; more on a CPU: docs/ has the measurements).
A token tree's verification (tree_verify_cost) is one more cost, when it was timed.
spec_decoding.calibration.calibrate_costs measures them in a few seconds on warm KV caches; this
module only holds and reads them, so the gamma policies (spec_decoding/policies/gamma.py) decide
from costs handed to them. A CostModel can be printed, saved to JSON and loaded again; it
remembers which models it was measured on, and using it with other models is an error.
"""

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from gpt2.model import GPT2
from .theory import break_even_alpha, predicted_speedup


def describe_model(model) -> str:
    """What the cost of running `model` depends on: for a GPT-2 its shape, dtype and device (a
    random-weight stand-in costs what the real model costs). A drafter wrapping a GPT-2
    (ModelDrafter) is described as that GPT-2; another drafter by its class and settings."""
    if isinstance(model, GPT2):
        c, w = model.config, model.wpe.weight
        # int8 / float16 / w8a8 weights (an accelerated model's format) cost what their bytes cost, not the dtype's
        fmt = getattr(model, "quantize", None)  # an accelerated model's weight format, where not its dtype's
        weights = f", {fmt} weights" if fmt else ""
        return (f"GPT2(n_layer={c.n_layer}, n_head={c.n_head}, n_embd={c.n_embd}, "
                f"vocab_size={c.vocab_size}, {str(w.dtype).replace('torch.', '')}{weights}, {w.device.type})")
    if type(model).__name__ == "ModelDrafter" and isinstance(getattr(model, "model", None), GPT2):
        return describe_model(model.model)
    settings = {k: v for k, v in vars(model).items()
                if not k.startswith("_") and k != "forward_calls" and isinstance(v, (int, float, str, bool))}
    inner = [describe_model(v) for v in vars(model).values() if isinstance(v, GPT2)]
    return f"{type(model).__name__}({', '.join([f'{k}={v}' for k, v in sorted(settings.items())] + inner)})"


class SavedAsJson:
    """save(path) / load(path) for a cost dataclass: measured once, reused (benchmark.py --out)."""

    def save(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1))
        return path

    @classmethod
    def load(cls, path):
        try:
            return cls(**json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError, TypeError) as e:
            raise ValueError(f"{path}: not a {cls.__name__} JSON file (made by {cls.__name__}.save): {e}") from None


@dataclass
class CostModel(SavedAsJson):
    """Measured seconds per call, with the models they were measured on.

    target_score_s[k - 1]: the target scoring k new tokens in one forward (k = 1: a plain step;
    k = g + 1: verifying g draft tokens), for k = 1 .. gamma_max + 1.
    draft_step_s: the drafter proposing one more token (0 for a model-free drafter).
    draft_catch_up_s: {str(rows): seconds} of a draft model proposing one token after `rows`
    tokens its cache has not seen, in one forward (a probe of gamma="auto" after `rows` - 1 plain
    rounds: the draft catches up over the tokens it skipped); rows = 1 is draft_step_s. Empty:
    not measured (a model-free drafter, or a CostModel saved before it was timed).
    sample_s: what a sampled round adds per distribution it makes (a drafted token's q, a scored
    row's p): softmax over the vocabulary and a draw. The forwards above are timed without it, as a
    greedy round runs them; `sampled()` adds it. 0: not measured.
    sampled_round_extra_s: what a sampled drafting round costs beyond its forwards and sample_s per
    distribution: the verdict (the rejection test, on a rejection the residual and its draw) and
    the round's bookkeeping, from one round of g = 1 timed as the generator runs it (a draft
    model only; 0 otherwise). `sampled()` adds it to every round that drafts.
    """
    target: str  # describe_model(target)
    draft: str  # describe_model(draft)
    draft_step_s: float
    target_score_s: list[float]
    context_len: int = 0  # tokens in the KV caches while timing
    rounds: int = 0  # timing rounds (each cost is a median over them)
    notes: dict = field(default_factory=dict)
    tree_score_s: dict = field(default_factory=dict)  # "2,2,1" -> the target scoring that tree's root and nodes
    draft_catch_up_s: dict = field(default_factory=dict)  # "64" -> the draft proposing after 64 unseen tokens
    sample_s: float = 0.0  # one row of logits to probabilities at temperature 1, and one draw from it
    sampled_round_extra_s: float = 0.0  # a sampled drafting round's own work beyond forwards and draws

    def __post_init__(self):
        if not self.target_score_s or min(self.target_score_s) <= 0 or self.draft_step_s < 0:
            raise ValueError("CostModel needs target_score_s (seconds > 0 for k = 1 .. gamma_max + 1 "
                             "tokens) and draft_step_s >= 0")

    def sampled(self) -> "CostModel":
        """The costs of a sampled round (temperature > 0): each draft step draws from its q, and the
        target's k scored rows each become a p, and a round that drafts adds its verdict and
        bookkeeping (sampled_round_extra_s). For a small pair over GPT-2's 50,257 tokens this is
        as much as a forward, and a policy deciding from the forwards alone drafts where it loses."""
        s, extra = self.sample_s, self.sampled_round_extra_s
        return replace(self, draft_step_s=self.draft_step_s + s,
                       target_score_s=[cost + k * s + (extra if k > 1 else 0.0)
                                       for k, cost in enumerate(self.target_score_s, start=1)],
                       draft_catch_up_s={rows: cost + s for rows, cost in self.draft_catch_up_s.items()},
                       sample_s=0.0, sampled_round_extra_s=0.0)

    @property
    def gamma_max(self) -> int:
        return len(self.target_score_s) - 1

    def up_to(self, gamma_max: int) -> "CostModel":
        """These costs for gamma 0..gamma_max only: AutoGamma, handed them, drafts at most gamma_max."""
        if isinstance(gamma_max, bool) or not isinstance(gamma_max, int) or gamma_max < 1:
            raise ValueError(f"gamma_max must be an int >= 1, got {gamma_max!r}")
        if gamma_max > self.gamma_max:
            raise ValueError(f"gamma_max={gamma_max} but the CostModel covers gamma up to {self.gamma_max}: "
                             f"calibrate it with gamma_max={gamma_max}")
        return replace(self, target_score_s=self.target_score_s[:gamma_max + 1])

    @property
    def target_step_s(self) -> float:
        return self.target_score_s[0]

    @property
    def c(self) -> float:
        """A draft step relative to a target step."""
        return self.draft_step_s / self.target_step_s

    def verify_cost(self, gamma: int) -> float:
        """The target scoring gamma + 1 tokens, relative to one target step (gamma = 0: 1)."""
        if not 0 <= gamma <= self.gamma_max:
            raise ValueError(f"this CostModel covers gamma 0..{self.gamma_max}, not {gamma}: "
                             f"calibrate it with gamma_max >= {gamma}")
        return self.target_score_s[gamma] / self.target_step_s

    def tree_verify_cost(self, branching) -> float:
        """The target scoring a token tree's root and nodes in one forward (spec_decoding.algorithms.tree),
        relative to one target step."""
        label = ",".join(map(str, branching))
        if label not in self.tree_score_s:
            raise ValueError(f"this CostModel has no timing for the tree {label}: calibrate it with "
                             f"trees=[({label})]")
        return self.tree_score_s[label] / self.target_step_s

    def round_seconds(self, gamma: int) -> float:
        """Expected wall time of a round that drafts gamma tokens: gamma draft steps + the target
        scoring gamma + 1 tokens."""
        return gamma * self.draft_step_s + self.target_score_s[gamma]

    def catch_up_seconds(self, rows: int) -> float:
        """Seconds of the draft proposing one token after `rows` tokens it has not seen (one forward
        over all of them): linear between the measured row counts (and (1, draft_step_s)), the
        last stretch's slope beyond them; draft_step_s where nothing was measured."""
        points = [(1, self.draft_step_s)] + sorted((int(k), v) for k, v in self.draft_catch_up_s.items())
        for (n0, s0), (n1, s1) in zip(points, points[1:]):
            if rows <= n1 or (n1, s1) == points[-1]:
                return max(self.draft_step_s, s0 + (s1 - s0) * (rows - n0) / (n1 - n0))
        return self.draft_step_s

    def break_even_alpha(self) -> float | None:
        """The acceptance chance from which speculation pays at all (Leviathan's formula with
        these costs, best gamma), or None if it never does."""
        return break_even_alpha(self.c, self.verify_cost, self.gamma_max)

    def check_models(self, target, draft) -> None:
        """Raise a clear error if this CostModel was measured on other models."""
        for role, expected, model in (("target", self.target, target), ("draft", self.draft, draft)):
            if (got := describe_model(model)) != expected:
                raise ValueError(
                    f"This CostModel was measured with the {role} {expected}, but the {role} given is "
                    f"{got}. Costs differ between models and devices: calibrate a new one with "
                    f"calibrate_costs(target, draft) (or load the file made for these models).")

    def __str__(self):
        verify = ", ".join(f"{g + 1}: {self.verify_cost(g):.2f}" for g in range(1, self.gamma_max + 1))
        alpha = self.break_even_alpha()
        return (f"CostModel for target {self.target}, draft {self.draft} "
                f"({self.context_len} tokens of context, {self.rounds} rounds):\n"
                f"  target step {1000 * self.target_step_s:.2f} ms, draft step "
                f"{1000 * self.draft_step_s:.2f} ms, c = {self.c:.3f}\n"
                f"  target scoring k tokens, relative to one step: {verify}\n"
                f"  speculation pays from alpha = "
                + (f"{alpha:.2f}" if alpha is not None else "never (the draft costs too much)"))


@dataclass
class BatchCostModel(SavedAsJson):
    """What a forward pass costs as a function of the rows it processes: the batch's cost model.

    A row is one new token of one sequence: a batched step of B sequences is B rows, the target
    verifying gamma draft tokens for each of them is B * (gamma + 1) rows. rows[i] rows took
    target_s[i] seconds in the target and draft_s[i] in the draft (each sequence with context_len
    tokens in its KV cache); between measured row counts the cost is interpolated linearly.
    Measured by spec_decoding.calibration.calibrate_batch_costs.
    """
    target: str  # describe_model(target)
    draft: str  # describe_model(draft)
    rows: list[int]  # increasing
    target_s: list[float]
    draft_s: list[float]
    context_len: int = 0
    notes: dict = field(default_factory=dict)

    def __post_init__(self):
        if (not self.rows or self.rows != sorted(set(self.rows)) or self.rows[0] < 1
                or not len(self.rows) == len(self.target_s) == len(self.draft_s)
                or min(self.target_s) <= 0 or min(self.draft_s) <= 0):
            raise ValueError("BatchCostModel needs increasing row counts >= 1 and, for each, the "
                             "target's and the draft's seconds (> 0)")

    @staticmethod
    def _at(rows: list[int], seconds: list[float], n: int) -> float:
        """Seconds for n rows, interpolated linearly between the measured row counts."""
        if not rows[0] <= n <= rows[-1]:
            raise ValueError(f"{n} rows is outside the measured range {rows[0]}..{rows[-1]}: "
                             f"calibrate with more rows")
        for (n0, s0), (n1, s1) in zip(zip(rows, seconds), zip(rows[1:], seconds[1:])):
            if n0 <= n <= n1:
                return s0 + (s1 - s0) * (n - n0) / (n1 - n0)
        return seconds[0]  # a single measured row count

    def target_seconds(self, n_rows: int) -> float:
        return self._at(self.rows, self.target_s, n_rows)

    def draft_seconds(self, n_rows: int) -> float:
        return self._at(self.rows, self.draft_s, n_rows)

    def c(self, batch_size: int) -> float:
        """A draft step of B rows relative to a target step of B rows."""
        return self.draft_seconds(batch_size) / self.target_seconds(batch_size)

    def verify_cost(self, batch_size: int, gamma: int) -> float:
        """The target scoring B * (gamma + 1) rows relative to a target step of B rows."""
        return self.target_seconds(batch_size * (gamma + 1)) / self.target_seconds(batch_size)

    def predicted_speedup(self, alpha: float, gamma: int, batch_size: int) -> float:
        """Batched speculative over batched autoregressive throughput at batch B (theory.py)."""
        return predicted_speedup(alpha, gamma, self.c(batch_size), self.verify_cost(batch_size, gamma))

    def best_gamma(self, alpha: float, batch_size: int, gammas) -> int:
        return max(gammas, key=lambda g: self.predicted_speedup(alpha, g, batch_size))

