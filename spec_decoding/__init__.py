"""Speculative decoding on top of the hand-written GPT-2.

p is the target's next-token distribution (the big model whose output we want), q the draft's
(whatever proposes tokens: a small model, or another Drafter from spec_decoding.drafters).
"""

from .autoregressive import autoregressive_generate
from .costs import CostModel
from .drafters import Drafter, LayerSkipDrafter, ModelDrafter, NGramDrafter
from .gamma import AutoGamma, FixedGamma, GammaPolicy, HeuristicGamma
from .greedy import speculative_sampling_greedy
from .result import GenerationResult, GenerationStats
from .sampling import logits_to_probs, sample
from .rejection import modified_rejection_sampling, residual_distribution
from .speculative import speculative_sampling
from .tree import tree_speculative_sampling

__all__ = [
    "autoregressive_generate", "speculative_sampling_greedy", "speculative_sampling",
    "Drafter", "ModelDrafter", "NGramDrafter", "LayerSkipDrafter", "tree_speculative_sampling",
    "modified_rejection_sampling", "residual_distribution", "logits_to_probs", "sample",
    "GenerationResult", "GenerationStats", "CostModel", "GammaPolicy", "FixedGamma", "HeuristicGamma",
    "AutoGamma",
]
