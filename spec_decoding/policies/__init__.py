"""How many tokens to draft, and what it costs: the gamma policies and the cost models they decide from.

    gamma            GammaPolicy: FixedGamma, HeuristicGamma, AutoGamma
    costs            CostModel and BatchCostModel: measured seconds per call (measured by
                     spec_decoding.calibration, handed in)
    theory           Leviathan et al.'s speed-up formulas

Nothing here measures or reads the machine: a policy decides from the costs it is handed.
"""
