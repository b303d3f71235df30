"""Course assignments built on this project: strip functions for students, grade their copies.

    python -m assignments make --functions spec_decoding.rejection.residual_distribution --out DIR
    python -m assignments make --assignment rejection_sampling --out DIR
    python -m assignments grade DIR

The ready-made assignments (a README each in assignments/<name>/) are listed in ASSIGNMENTS.
"""

# name -> the functions the student writes
ASSIGNMENTS = {
    "kv_cache": ["gpt2.kv_cache.KVCache.update", "gpt2.kv_cache.KVCache.truncate",
                 "gpt2.model.CausalSelfAttention.forward"],
    "greedy_speculative": ["spec_decoding.greedy.speculative_sampling_greedy"],
    "rejection_sampling": ["spec_decoding.rejection.modified_rejection_sampling",
                           "spec_decoding.rejection.residual_distribution"],
}

# function -> the grader's checks that exercise it (assignments/run_checks.py). A function not
# listed gets every end-to-end check.
CHECKS_FOR = {
    "gpt2.kv_cache.KVCache.update": ["cache_one_by_one", "cache_chunks", "cache_truncate", "baseline_greedy"],
    "gpt2.kv_cache.KVCache.advance": ["cache_one_by_one", "cache_chunks", "cache_truncate"],
    "gpt2.kv_cache.KVCache.truncate": ["cache_truncate", "greedy_caches"],
    "gpt2.model.CausalSelfAttention.forward": ["model_forward", "cache_one_by_one", "cache_chunks",
                                               "cache_truncate", "baseline_greedy"],
    "gpt2.model.GPT2.forward": ["model_forward", "cache_one_by_one", "cache_chunks", "cache_truncate",
                                "baseline_greedy"],
    "spec_decoding.greedy.speculative_sampling_greedy": ["greedy_equals_target", "greedy_unrelated_draft",
                                                         "greedy_draft_is_target", "greedy_caches",
                                                         "greedy_stopping"],
    "spec_decoding.rejection.residual_distribution": ["residual", "lossless"],
    "spec_decoding.rejection.modified_rejection_sampling": ["one_round", "lossless"],
    "spec_decoding.speculative.speculative_sampling": ["lossless", "sampling_caches", "sampling_stopping"],
    "spec_decoding.drafters.ModelDrafter.propose": ["greedy_equals_target", "lossless", "greedy_caches"],
    "spec_decoding.drafters.ModelDrafter.draw": ["greedy_equals_target", "lossless"],
}
END_TO_END = ["model_forward", "baseline_greedy", "greedy_equals_target", "greedy_caches", "greedy_stopping",
              "lossless", "sampling_stopping"]
