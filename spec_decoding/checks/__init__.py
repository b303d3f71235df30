"""Checks that a generator keeps its promises, and the bug zoo that shows them catching mistakes.

    generator_checks  lossless sampling (exact enumeration, chi-square), greedy exactness, caches
                      after every round, stopping, batches, speed against the theory
    bug_zoo           known mistakes, planted for a moment into the real code
"""

from .generator_checks import (P_VALUE_THRESHOLD, acceptance_by_position, cache_difference,
                               check_batch_greedy, check_caches_after_every_round,
                               check_greedy_matches_target, check_lossless, check_samples, check_speed,
                               check_stopping, chi_square_p_value, counts_of, exact_distribution,
                               seeded_generator, total_variation)

__all__ = ["P_VALUE_THRESHOLD", "acceptance_by_position", "cache_difference", "check_batch_greedy",
           "check_caches_after_every_round", "check_greedy_matches_target", "check_lossless",
           "check_samples", "check_speed", "check_stopping", "chi_square_p_value", "counts_of",
           "exact_distribution", "seeded_generator", "total_variation"]
