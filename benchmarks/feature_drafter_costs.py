"""What one draft step of each drafter costs, relative to one target step (c), on a target of an
official GPT-2 shape with random weights (a step's time does not depend on the values):

    python -m benchmarks.feature_drafter_costs [--model gpt2-large] [--context 128] [--threads 1]

Drafters timed (spec_decoding.calibration.calibrate_costs, warm caches, the calls taking turns):
Medusa (one head: a round of g tokens runs g heads; its own output layer, and shared_readout: the
target's), EAGLE (one block + the full head), EAGLE
with a reduced draft vocabulary of 32k tokens (EAGLE-3's size), and layer-skip with a quarter of
the blocks for comparison. Every weight gets the CPU kernels loading gives it
(gpt2.speed.kernels.attach_kernels). Prints a table; nothing is written.
"""

import argparse

import torch

from gpt2 import GPT2, OFFICIAL_CONFIGS
from gpt2.speed.kernels import attach_kernels
from spec_decoding.drafters import LayerSkipDrafter
from spec_decoding.drafters.eagle import EagleDrafter, EagleNet
from spec_decoding.drafters.medusa import MedusaDrafter, MedusaHeads
from spec_decoding.calibration import calibrate_costs


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt2-large", choices=sorted(OFFICIAL_CONFIGS))
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budget", type=float, default=3.0, help="seconds of timing per drafter")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with torch.no_grad():
        target = GPT2(OFFICIAL_CONFIGS[args.model]).eval()
    V = target.config.vocab_size
    drafters = {
        "medusa (one head)": MedusaDrafter(target, MedusaHeads(target, 1).eval()),
        "medusa (one head, shared readout)": MedusaDrafter(target, MedusaHeads(target, 1, shared_readout=True).eval()),
        "eagle (full vocabulary)": EagleDrafter(target, EagleNet(target).eval()),
        "eagle (32k draft vocabulary)": EagleDrafter(target, EagleNet(target).eval(), torch.arange(min(V, 32000))),
        f"layerskip:{target.config.n_layer // 4}": LayerSkipDrafter(target, target.config.n_layer // 4),
    }
    for module in [target] + [getattr(d, "heads", getattr(d, "net", None)) for d in drafters.values()]:
        if module is not None:
            attach_kernels(module)
    print(f"{args.model}, context {args.context}, {args.threads} thread(s)")
    print("| drafter | draft step (ms) | target step (ms) | c |\n|---|---:|---:|---:|")
    for name, drafter in drafters.items():
        cost = calibrate_costs(target, drafter, gamma_max=1, context_len=args.context, budget_s=args.budget)
        print(f"| {name} | {1000 * cost.draft_step_s:.1f} | {1000 * cost.target_step_s:.1f} | {cost.c:.3f} |",
              flush=True)


if __name__ == "__main__":
    main()
