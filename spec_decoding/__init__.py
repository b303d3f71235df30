"""Speculative decoding on top of the hand-written GPT-2.

p is the target's next-token distribution (the big model whose output we want), q the draft's
(whatever proposes tokens: a small model, or another Drafter from spec_decoding.drafters).

The package, one folder per concern:
    algorithms/      the generators: autoregressive, greedy, speculative, tree, batched
    drafters/        what proposes draft tokens
    policies/        how many tokens to draft (gamma policies) and the cost models they read
    presentation/    traces, the trace page, colours, loop marks
    checks/          checks that a generator keeps its promises, and the bug zoo
and, at the top: sampling (logits to a token), result (what the generators return), caches
(feeding a model its KV cache), contracts (what callers hand in, checked), calibration
(measuring the costs) and cli (the scripts' shared arguments).
"""

from .algorithms.autoregressive import autoregressive_generate
from .algorithms.greedy import speculative_sampling_greedy
from .algorithms.rejection import modified_rejection_sampling, residual_distribution
from .algorithms.speculative import speculative_sampling
from .algorithms.tree import tree_speculative_sampling
from .contracts import GREEDY, Observers, SamplingParams
from .drafters import Drafter, LayerSkipDrafter, ModelDrafter, NGramDrafter
from .policies.costs import CostModel
from .policies.gamma import AutoGamma, FixedGamma, GammaPolicy, HeuristicGamma
from .result import GenerationResult, GenerationStats
from .sampling import logits_to_probs, sample

__all__ = [
    "autoregressive_generate", "speculative_sampling_greedy", "speculative_sampling",
    "Drafter", "ModelDrafter", "NGramDrafter", "LayerSkipDrafter", "tree_speculative_sampling",
    "modified_rejection_sampling", "residual_distribution", "logits_to_probs", "sample",
    "GenerationResult", "GenerationStats", "CostModel", "GammaPolicy", "FixedGamma", "HeuristicGamma",
    "AutoGamma", "SamplingParams", "Observers", "GREEDY",
]
