"""The algorithms: how tokens are drafted, verified and accepted.

    autoregressive   the baseline: the target alone, one forward per token
    greedy           speculative decoding at temperature 0: exactly the target's greedy output
    speculative      speculative sampling (Leviathan et al. 2023, Algorithm 1): lossless sampling
    rejection        the modified rejection sampling both sampled chains and trees use
    tree             token trees: several continuations verified in one target forward
    batched          B prompts at once, each row accepting its own draft tokens
    decoding         what the generators share: checks, a round's bookkeeping, its observers
"""
