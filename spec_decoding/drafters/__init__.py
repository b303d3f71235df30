"""Drafters: whatever proposes the tokens the target verifies.

    drafter          the Drafter interface; ModelDrafter, NGramDrafter, LayerSkipDrafter
    token_tree       TokenTree: what a tree drafter proposes
    medusa, eagle    feature drafters, trained heads reading the target's features
    feature_files    saving and loading a trained feature drafter
"""

from .drafter import Drafter, FeatureDrafter, LayerSkipDrafter, ModelDrafter, NGramDrafter, as_drafter

__all__ = ["Drafter", "FeatureDrafter", "ModelDrafter", "NGramDrafter", "LayerSkipDrafter", "as_drafter"]
