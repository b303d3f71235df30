"""Offline stand-ins for the hub: train a small pair, make random-weight stand-ins.

    python -m offline.train_pair --out runs/trained_pair       # a small real target/draft pair
    python -m offline.random_weights --size tiny --out DIR     # random weights in the hub's layout

Neither is part of the model (gpt2/) or of the decoders (spec_decoding/): they only write
checkpoints that gpt2.loading reads, so that everything runs where the hub is unreachable.
"""
