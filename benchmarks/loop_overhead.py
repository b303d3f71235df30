"""The generators' own time per token, with the models taken out: what plain decoding and a
speculative loop cost beyond their forward passes.

    python -m benchmarks.loop_overhead                # 50,257-token vocabulary, temperature 1
    python -m benchmarks.loop_overhead --quick        # smoke run

Why: where a step is short (a small pair, or a GPU replaying CUDA graphs: gpt2/speed/cuda_graph.py)
the Python around the forwards decides whether speculation, or `gamma="auto"` settled on plain
steps, keeps up with plain decoding. Here both models are stubs whose forward returns ready
logits, so what is timed is the loop: sampling, the rejection step, the policy, the bookkeeping.

Rows, each per output token (medians over --repeats, the loops in turns):
  - plain decoding (autoregressive_generate);
  - speculative_sampling with a policy that never drafts: every round a plain target step;
  - speculative_sampling with `gamma="auto"` (AutoGamma) on costs where drafting cannot pay: its
    plain steps and occasional probes, what auto runs once drafting stopped paying;
  - speculative_sampling at each --gammas with a draft whose logits are the target's, so every
    draft token is accepted: the loop's cost per token where speculation works best.
"""

import argparse
import time

import torch

from gpt2.config import GPT2Config
from gpt2.kv_cache import KVCache
from gpt2.model import GPT2
from spec_decoding import autoregressive_generate, SamplingParams, speculative_sampling
from spec_decoding.policies.costs import CostModel
from spec_decoding.policies.gamma import AutoGamma, GammaPolicy

from .common import add_output_options, machine_info, markdown_table, median, write_results


class StubModel(GPT2):
    """A GPT2 as the generators see it (config, device, cache, forward) whose forward does no
    work: every position's logits are one row drawn once, and the cache advances."""

    def __init__(self, vocab_size: int, seed: int, max_rows: int = 16):
        torch.nn.Module.__init__(self)  # none of GPT2's layers
        self.config = GPT2Config(n_layer=1, n_head=1, n_embd=8, n_positions=1024, vocab_size=vocab_size)
        self.wpe = torch.nn.Embedding(1, 1)  # where the generators look for the device and dtype
        row = torch.randn(1, 1, vocab_size, generator=torch.Generator().manual_seed(seed))
        self.logits = row.expand(1, max_rows, vocab_size).contiguous()
        self.features = torch.zeros(1, max_rows, self.config.n_embd)

    def new_kv_cache(self, batch_size=1, max_len=None, extra_slots=0, n_layer=None) -> KVCache:
        return KVCache(1, batch_size, 1, (max_len or self.config.n_positions) + extra_slots, 1)

    def forward(self, idx, cache=None, num_last_logits=None, return_features=False, **more):
        T = idx.shape[1]
        if cache is not None:
            cache.advance(T)
        logits = self.logits[:, :T][:, -(num_last_logits or T):]
        return (logits, self.features[:, :T]) if return_features else logits


class NeverDraft(GammaPolicy):
    """Every round a plain target step (gamma 0)."""
    gamma_max = 1

    def next_gamma(self) -> int:
        return 0


def seconds_per_token(run) -> float:
    t0 = time.perf_counter()
    tokens = len(run().tokens)
    return (time.perf_counter() - t0) / tokens


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=50257, help="vocabulary size (sampling's cost grows with it)")
    p.add_argument("--max-gen", type=int, default=256)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--gammas", type=int, nargs="*", default=[4])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    add_output_options(p, "loop_overhead", "vocabulary 1000, 32 tokens, 3 repeats")
    args = p.parse_args(argv)
    if args.quick:
        args.vocab, args.max_gen, args.repeats = 1000, 32, 3
    torch.set_num_threads(args.threads)
    target, draft = StubModel(args.vocab, seed=0), StubModel(args.vocab, seed=0)  # q = p: all accepted
    prompt = [1, 2, 3]

    def seeded() -> SamplingParams:
        return SamplingParams(args.temperature, generator=torch.Generator().manual_seed(0))

    loops = {"plain decoding": lambda: autoregressive_generate(target, prompt, args.max_gen, seeded()),
             "speculative, plain rounds only": lambda: speculative_sampling(target, draft, prompt, args.max_gen,
                                                                            NeverDraft(), seeded())}
    # auto where drafting cannot pay: the draft costs a target step, so even an accepted token
    # does not repay it; it takes plain steps, with a probe now and then
    cannot_pay = CostModel(target="stub", draft="stub", draft_step_s=1e-3,
                           target_score_s=[1e-3 * (1 + 0.02 * k) for k in range(9)])
    loops["speculative, auto (drafting cannot pay)"] = lambda: speculative_sampling(
        target, draft, prompt, args.max_gen, AutoGamma(cannot_pay), seeded())
    for g in args.gammas:
        loops[f"speculative, gamma {g}"] = (lambda g=g: speculative_sampling(target, draft, prompt, args.max_gen,
                                                                             g, seeded()))
    for run in loops.values():  # warm-up
        run()
    times = {name: [] for name in loops}
    for _ in range(args.repeats):  # in turns: machine noise hits every loop alike
        for name, run in loops.items():
            times[name].append(seconds_per_token(run))
    plain = median(times["plain decoding"])
    rows = [[name, f"{median(t) * 1e6:.1f}", f"{(median(t) - plain) * 1e6:+.1f}"] for name, t in times.items()]
    md = (f"The generators' own time per output token, models stubbed out (vocabulary {args.vocab}, "
          f"temperature {args.temperature}, {args.max_gen} tokens, {args.threads} thread(s), medians of "
          f"{args.repeats}):\n\n" + markdown_table(["loop", "us per token", "beside plain decoding"], rows) + "\n")
    print("\n" + md)
    write_results(args.out, {"machine": machine_info(), "args": {k: str(v) for k, v in vars(args).items()},
                             "seconds_per_token": times}, md)


if __name__ == "__main__":
    main()
