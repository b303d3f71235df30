#!/usr/bin/env python
"""Generate text with speculative decoding: a small GPT-2 drafts, a large GPT-2 verifies.

    python spec_decoding_generate.py --prompt "The meaning of life is" --max-gen 60
    python spec_decoding_generate.py --drafter ngram --ngram 3       # prompt lookup, no draft model
    python spec_decoding_generate.py --drafter layerskip --draft-layers 6   # the target's first 6 blocks
    python spec_decoding_generate.py --target DIR --drafter medusa:DIR2   # heads from offline.train_drafter
    python spec_decoding_generate.py --temperature 0.8 --top-p 0.95 --seed 0 --compare-baseline
    python spec_decoding_generate.py --target /path/to/gpt2-large --draft /path/to/gpt2   # offline
    python spec_decoding_generate.py --json > result.json
    python spec_decoding_generate.py --tree 2,2,1   # a token tree instead of a chain of --gamma
    python spec_decoding_generate.py --gamma auto   # gamma chosen each round (costs measured once per machine)
    python spec_decoding_generate.py --prompts-file prompts/default.txt   # one prompt a line, batched

Each round the draft (default gpt2, 124M parameters) proposes --gamma tokens, one forward pass
each, and the target (default gpt2-large, 774M) scores all of them in a single forward pass. With
--temperature 0 (the default) the output is exactly the target's own greedy output; with sampling
it follows the target's distribution exactly. Only the speed changes. --drafter picks what proposes
the tokens (spec_decoding/drafters/drafter.py): a second model (model, the default), prompt lookup (ngram:
copy what followed the last n tokens earlier in the text), the target's own first blocks
(layerskip), or a drafter reading the target's features (medusa:DIR, eagle:DIR: docs/feature_drafters.md).
--gamma auto chooses each round's draft length from the costs measured once on this machine (and
kept) and the acceptance so far (0: no drafting while it does not pay); --gamma heuristic uses
transformers' schedule (spec_decoding/policies/gamma.py).

On a terminal the text is coloured by where each token came from (set NO_COLOR to turn that off);
piped, it is plain text. --json prints one JSON object instead.

--prompts-file decodes every line of a file (blank lines skipped) as one batch
(spec_decoding/algorithms/batched.py): each prompt gets exactly the output it would get alone; the stats are
printed per prompt and summed. It takes the model drafter and a fixed --gamma.
"""

import os
import signal
import sys

if __name__ == "__main__":  # Ctrl-C while the libraries below import: a quiet exit, not their traceback
    # os._exit, not sys.exit: the signal may land inside torch's C++ import code, where a Python
    # exception aborts the process; nothing is open yet that needs closing.
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))

import argparse
import codecs
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from gpt2 import EOT_ID, CheckpointError, encode, get_tokenizer, load_gpt2
from gpt2.speed import load_accelerated, speed_line
from gpt2.speed.compiled import COMPILE_FLAGS
from gpt2.speed.device import DTYPES, dtype_note, note_once, resolve_device, resolve_dtype
from gpt2.loading import TRAIN_PAIR_COMMAND, check_local_checkpoint, peek_config
from gpt2.speed.machine_load import busy_note, load_average
from spec_decoding import (CostModel, HeuristicGamma, Observers, SamplingParams, autoregressive_generate,
                           speculative_sampling, tree_speculative_sampling)
from spec_decoding.algorithms.batched import MAX_BATCH_SIZE, batched_autoregressive_generate, batched_speculative_sampling
from spec_decoding.algorithms.decoding import check_drafter
from spec_decoding import cli
from spec_decoding.drafters import ModelDrafter
from spec_decoding.policies.gamma import DEFAULT_GAMMA_MAX
from spec_decoding.presentation.loops import LOOP_MARK, loop_share, looped
from spec_decoding.presentation.trace_page import is_trace_page, write_html
from spec_decoding.presentation.colours import SOURCE_COLOURS
from spec_decoding.result import (FROM_BONUS, FROM_CORRECTION, FROM_DRAFT, FROM_DRAFT_BRANCH, FROM_TARGET,
                                  STOP_CONTEXT_FULL, STOP_EOS, STOP_MAX_GEN)

if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)  # from here on, main() says "interrupted"

DEFAULT_PROMPT = ("In a shocking finding, scientists discovered a herd of unicorns living in a "
                  "remote, previously unexplored valley in the Andes Mountains.")

DEFAULT_HTML = "runs/trace.html"  # --html with no FILE
# ANSI escape codes: the colour of a token says where it came from (the names: SOURCE_COLOURS, as
# on the trace page). Purple is one of the 256 colours most terminals have (no basic ANSI purple).
RESET, BOLD = "\033[0m", "\033[1m"
ANSI = {"green": "\033[32m", "yellow": "\033[33m", "cyan": "\033[36m", "magenta": "\033[35m",
        "purple": "\033[38;5;135m"}
COLOURS = {source: ANSI[name] for source, name in SOURCE_COLOURS.items()}
LEGEND = (f"{COLOURS[FROM_DRAFT]}draft token accepted{RESET}  "
          f"{COLOURS[FROM_CORRECTION]}target's correction{RESET}  "
          f"{COLOURS[FROM_BONUS]}bonus token{RESET}  "
          f"{COLOURS[FROM_TARGET]}target's own token (nothing drafted){RESET}")
TREE_LEGEND = f"{COLOURS[FROM_DRAFT_BRANCH]}accepted from a side branch of the tree{RESET}"
STOP_REASONS = {STOP_MAX_GEN: "reached --max-gen", STOP_EOS: "the model wrote <|endoftext|>",
                STOP_CONTEXT_FULL: "the context window is full"}


class UsageError(Exception):
    """A problem the user can fix: e.g. the tokenizer's files missing from the package."""


# ---------------------------------------------------------------------------------------------
# Command line


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Speculative decoding with GPT-2: a small draft model proposes tokens, a "
                    "large target model verifies them.",
        epilog="Models: gpt2, gpt2-medium, gpt2-large, gpt2-xl, a hub repo id 'owner/name', a "
               "folder with config.json + model.safetensors, or a .safetensors file. Offline (no "
               f"hub), train a small pair first: {TRAIN_PAIR_COMMAND} (about 10 minutes on the 2-core "
               "Intel Xeon it was measured on; on a busy machine add --threads 1), then pass --target runs/trained_pair/target --draft runs/trained_pair/draft.")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="the text to continue")
    parser.add_argument("--drafter", type=cli.drafter_choice, default="model",
                        help="what proposes the draft tokens: model (--draft, the default), ngram "
                             "(prompt lookup, no second model), layerskip (the target's first "
                             "--draft-layers blocks), or medusa:DIR / eagle:DIR (trained for the "
                             "target by python -m offline.train_drafter)")
    parser.add_argument("--draft", default="gpt2", help="the small model (default: gpt2; --drafter model)")
    parser.add_argument("--ngram", type=cli.positive_int, metavar="N",
                        help="--drafter ngram: the longest n-gram looked up (default: 3)")
    parser.add_argument("--draft-layers", type=cli.positive_int, metavar="K",
                        help="--drafter layerskip: how many of the target's blocks draft "
                             "(default: a quarter of them)")
    parser.add_argument("--target", default="gpt2-large", help="the large model (default: gpt2-large)")
    parser.add_argument("--gamma", type=cli.gamma_value, default=4,
                        help="draft tokens proposed per round (default: 4), or auto (chosen each "
                             "round from the measured costs and the acceptance so far) or heuristic")
    parser.add_argument("--gamma-max", type=cli.positive_int, default=DEFAULT_GAMMA_MAX,
                        help=f"the most draft tokens per round for auto/heuristic (default: {DEFAULT_GAMMA_MAX})")
    parser.add_argument("--cost-model", metavar="FILE",
                        help="--gamma auto: the per-call costs, a JSON file (read if it exists, else "
                             "written there; default: those kept for this machine, measured once)")
    parser.add_argument("--tree", type=cli.branching, metavar="B1,B2,...",
                        help="draft a token tree instead of a chain: children per node at each depth, "
                             "e.g. 2,2,1 (10 nodes, verified in one target forward); replaces --gamma; "
                             "with --drafter model or medusa:DIR")
    parser.add_argument("--max-gen", type=cli.positive_int, default=100,
                        help="maximum number of new tokens (default: 100)")
    parser.add_argument("--temperature", type=cli.temperature, default=0.0,
                        help="0 is greedy (the default); > 0 samples")
    parser.add_argument("--top-k", type=cli.positive_int, help="sample among the k most likely tokens")
    parser.add_argument("--top-p", type=cli.probability,
                        help="sample among the most likely tokens holding this much probability")
    parser.add_argument("--seed", type=int,
                        help="random seed: the same seed, models and options on the same machine give "
                             "the same tokens (--gamma auto: while its costs, kept per machine, are "
                             "not remeasured)")
    parser.add_argument("--threads", type=cli.positive_int, metavar="N",
                        help="CPU threads for PyTorch (default: its own choice, one per core); on a "
                             "busy machine 1 is often faster")
    parser.add_argument("--device", default="auto",
                        help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps")
    parser.add_argument("--dtype", choices=["auto", *DTYPES], default="auto",
                        help="auto (default: per model, the format measured fastest on this CPU for "
                             "its shapes: float32, float16 weights or bfloat16, see python -m "
                             "gpt2.speed.kernel_report; bfloat16/float16 on a GPU), float32, bfloat16 or float16")
    parser.add_argument("--quantize", choices=["int8", "fp16", "w8a8"],
                        help="formats made at load time: int8 (weights per channel), fp16 (float16 weights, float32 math), "
                             "w8a8 (int8's weights, each layer's inputs rounded to int8 in blocks)")
    parser.add_argument("--draft-quantize", choices=["int8", "fp16", "w8a8"],
                        help="the draft's format, as --quantize (the target keeps --quantize)")
    parser.add_argument("--compile", choices=list(COMPILE_FLAGS), default="off",
                        help="the compiled decode path (gpt2/speed/compiled.py; CPU or CUDA): on; graph, the step as "
                             "one CUDA graph (gpt2/speed/cuda_graph.py; a GPU); fused: on a CPU every block in one call "
                             "to C (gpt2/speed/native_step.py; int8 and w8a8 weights), on a GPU the graph with five "
                             "Triton kernels a block (gpt2/speed/fused_step.py); auto (fused, else compiled, on a CPU, "
                             "graph on a GPU, only where it measures faster here); or off (default)")
    parser.add_argument("--plain", action="store_true",
                        help="run the models as gpt2/model.py is written (float32, nn.Linear, no kernels "
                             "chosen here); without it the scripts take gpt2.speed's step, said in the load lines")
    parser.add_argument("--compare-baseline", action="store_true",
                        help="also run the target alone and report the speedup")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (tokens, text, stats) and nothing else")
    parser.add_argument("--html", metavar="FILE", nargs="?", const=DEFAULT_HTML,
                        help="also write every round (drafts, p, q, draws, verdicts) as a web page, "
                             f"to FILE or, with no FILE, to {DEFAULT_HTML} (runs/ is git-ignored)")
    parser.add_argument("--force", action="store_true", help="let --html replace an existing file")
    parser.add_argument("--prompts-file", metavar="FILE",
                        help="decode every line of FILE (one prompt a line) together as one batch, "
                             "instead of --prompt")
    args = parser.parse_args(argv)
    if args.prompts_file:
        args.prompts = read_prompts_file(parser, args)
    if args.html:
        html_path = Path(args.html).expanduser()
        if html_path.exists() and not args.force:
            if not is_trace_page(html_path):
                parser.error(f"--html {html_path} already exists and is not a trace page an earlier run "
                             f"wrote; pass --force to replace it, or give another name")
            print(f"note: replacing {html_path}, the trace page an earlier run wrote", file=sys.stderr)
        if args.html == DEFAULT_HTML:
            html_path.parent.mkdir(exist_ok=True)  # runs/: the ignored folder every default output goes to
        if not html_path.parent.is_dir():
            parser.error(f"--html {html_path}: the folder {html_path.parent} does not exist")
    if not args.prompt:
        parser.error("--prompt is empty: give some text to continue")
    if args.plain and (args.quantize or args.draft_quantize or args.compile != "off"):
        parser.error("--plain runs gpt2/model.py as written (float32, nn.Linear); --quantize, "
                     "--draft-quantize and --compile are speed options: leave them out, or drop --plain")
    if args.cost_model and args.gamma != "auto":
        parser.error("--cost-model is for --gamma auto")
    if args.temperature == 0 and (args.top_k or args.top_p):
        print("note: --top-k and --top-p only apply when sampling (--temperature > 0)", file=sys.stderr)
    if args.drafter != "ngram" and args.ngram is not None:
        print("note: --ngram only applies with --drafter ngram", file=sys.stderr)
    if args.drafter != "layerskip" and args.draft_layers is not None:
        print("note: --draft-layers only applies with --drafter layerskip", file=sys.stderr)
    if args.tree and not cli.drafts_trees(args.drafter):
        parser.error(f"--tree needs a drafter that drafts token trees ({cli.tree_drafters()}), "
                     f"not --drafter {args.drafter}")
    return args


def read_prompts_file(parser, args) -> list[str]:
    """--prompts-file: its non-blank lines; usage errors for what batching does not support."""
    unsupported = [name for name, used in (("--tree", args.tree), ("--html", args.html),
                                           ("--drafter " + args.drafter, args.drafter != "model"),
                                           ("--gamma " + str(args.gamma), not isinstance(args.gamma, int)))
                   if used]
    if unsupported:
        parser.error(f"--prompts-file decodes a batch with the model drafter and a fixed --gamma; "
                     f"drop {', '.join(unsupported)}")
    path = Path(args.prompts_file).expanduser()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        parser.error(f"--prompts-file {path}: cannot read it ({e})")
    prompts = [line.strip() for line in lines if line.strip()]
    if not prompts:
        parser.error(f"--prompts-file {path} holds no prompts: write one prompt per line")
    if len(prompts) > MAX_BATCH_SIZE:
        parser.error(f"--prompts-file {path} holds {len(prompts)} prompts; one batch takes at most "
                     f"{MAX_BATCH_SIZE}: split the file")
    return prompts


def encode_prompt(prompt: str) -> list[int]:
    try:
        return encode(prompt)
    except RuntimeError as e:  # the tokenizer's files are missing or changed; the message says what to do
        raise UsageError(str(e)) from None


def check_before_loading(prompt_ids: list[int], args) -> None:
    """What can be checked before any weights load, reading at most config.json: a local --target or
    --draft path that is missing or names a folder of models, and a prompt longer than a model's
    context window (where its config is cheap to read: gpt2.loading.peek_config)."""
    names = [("target", args.target)] + ([("draft", args.draft)] if args.drafter == "model" else [])
    for role, name in names:
        try:
            check_local_checkpoint(name)
        except CheckpointError as e:  # say which of the two models failed
            raise CheckpointError(f"--{role} {name}: {e}") from None
    for role, name in names:
        config = peek_config(name)
        if config is not None and len(prompt_ids) >= config.n_positions:
            raise UsageError(
                f"--prompt has {len(prompt_ids)} tokens, but the {role}'s context window ({name}: "
                f"n_positions={config.n_positions}) holds {config.n_positions}. Shorten the prompt "
                f"to fewer than {config.n_positions} tokens, to leave room for the new ones.")


# ---------------------------------------------------------------------------------------------
# Models


def load_model(role: str, name: str, device: torch.device, dtype: str, quantize=None, compile="off",
               plain: bool = False):
    """The model as gpt2/model.py reads it (load_gpt2), then, unless plain, the speed step
    (gpt2.speed.load_accelerated: the same load, read into the format and kernels that run it
    fastest here). dtype: a --dtype choice; "auto" is decided per model, measured on its shapes
    here (gpt2.speed.device.auto_format)."""
    print(f"Loading {role} {name} ({device}{', ' + quantize if quantize else ''}) ...",
          file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        if plain:
            model = load_gpt2(name, device=device, dtype="float32" if dtype == "auto" else dtype)
        else:
            model = load_accelerated(name, device=device, dtype=dtype, quantize=quantize,
                                     compile=COMPILE_FLAGS[compile])
    except CheckpointError as e:  # say which of the two models failed
        raise CheckpointError(f"--{role} {name}: {e}") from None
    print(f"  {model.num_parameters() / 1e6:.0f}M parameters, "
          f"{str(model.wpe.weight.dtype).removeprefix('torch.')}, {time.perf_counter() - start:.1f} s; "
          f"{kernels_line(model)}", file=sys.stderr, flush=True)
    return model


def kernels_line(model) -> str:
    """What runs the model: gpt2/model.py as written, or the speed step's format and kernels."""
    return speed_line(model) + ("" if "plain" in speed_line(model)[:5] else "; --plain runs gpt2/model.py as written")


def make_drafter(args, target, device: torch.device, dtype: str):
    """(drafter, a line saying what it is) for --drafter; only a drafter that needs it loads --draft."""
    number = {"ngram": args.ngram, "layerskip": args.draft_layers}.get(args.drafter)
    if args.drafter == "layerskip" and number is None:
        number = max(1, target.config.n_layer // 4)  # the default: a quarter of the target's blocks
    spec = cli.drafter_spec(args.drafter if number is None else f"{args.drafter}:{number}")
    if cli.needs_draft_model(spec):
        draft = load_model("draft", args.draft, device, dtype, args.draft_quantize, args.compile, args.plain)
        return cli.make_drafter(spec, target, draft), f"{spec} {args.draft}"
    try:
        drafter = cli.make_drafter(spec, target)
    except ValueError as e:
        raise ValueError(f"--drafter {spec}: {e}") from None
    return drafter, f"{spec} ({cli.describe_drafter(spec)})"


@torch.inference_mode()
def warm_up(model) -> None:
    """One small forward pass, so the timings measure decoding and not one-time setup (the first
    forward allocates memory and, on a GPU, loads its kernels)."""
    model(torch.tensor([[EOT_ID]], device=model.wpe.weight.device))


def run_baseline(args, what: str, generate):
    """--compare-baseline: generate() with the target alone (None without the option)."""
    if not args.compare_baseline:
        return None
    print(f"Running the baseline: {what}, one token per forward pass ...", file=sys.stderr, flush=True)
    return generate()


@dataclass
class SpeedComparison:
    """Tokens per second of speculative decoding and of the target alone, timed in turns (spec,
    target, spec, target, ...), neither streaming to the screen: each pair saw the same machine,
    so a busy spell slows both sides alike. The speed-up is the fastest run of each side against
    the other's (other programs only ever add time, so the fastest run is the closest to what the
    code costs); the pairs' own ratios give its spread."""
    speculative: list[float]
    target_alone: list[float]
    load: tuple[float | None, float | None]  # the load average before and after

    @property
    def ratios(self) -> list[float]:
        return [s / b if b else 0.0 for s, b in zip(self.speculative, self.target_alone)]

    @property
    def speedup(self) -> float:
        return max(self.speculative) / max(self.target_alone) if max(self.target_alone) else 0.0

    def unreliable(self) -> str | None:
        """Why the figure should be taken as rough (pairs far apart, or the machine's cores taken),
        or None."""
        low, high = min(self.ratios), max(self.ratios)
        loads = [x for x in self.load if x is not None]
        cores = os.cpu_count() or 1
        busy = [f"load average up to {max(loads):.1f} on {cores} cores"] if loads and max(loads) > cores else []
        apart = [f"the pairs' speed-ups ranged {low:.2f}x-{high:.2f}x"] if low and high / low > 1 + SPREAD_MARGIN else []
        if not busy + apart:
            return None
        return (f"note: other programs were running ({'; '.join(busy + apart)}): take the speed-up as "
                f"rough; on a quieter machine, or with --threads 1, it steadies")

    def lines(self) -> list[str]:
        pairs = len(self.ratios)
        return [f"timed in turns ({pairs} pairs): speculative {max(self.speculative):.1f} tokens/s, "
                f"target alone {max(self.target_alone):.1f} tokens/s (the fastest run of each)",
                f"speedup:                {self.speedup:.2f}x (the pairs: {min(self.ratios):.2f}x-{max(self.ratios):.2f}x)"]

    def to_dict(self) -> dict:
        return {"pairs": len(self.ratios), "speculative_tokens_per_second": self.speculative,
                "target_alone_tokens_per_second": self.target_alone, "speedups": self.ratios,
                "load_average": list(self.load)}


# --compare-baseline: pairs of timed runs (speculative, then the target alone) behind the speed-up,
# and the spread of the pairs' speed-ups (max / min) beyond which the figure is called rough.
BASELINE_PAIRS = 3
SPREAD_MARGIN = 0.15


def compare_speeds(args, speculative_tps, target_alone_tps) -> SpeedComparison | None:
    """--compare-baseline: each of speculative_tps() and target_alone_tps() (one run, its tokens
    per second) BASELINE_PAIRS times, in turns (None without the option)."""
    if not args.compare_baseline:
        return None
    print(f"Timing speculative decoding and the target alone in turns, {BASELINE_PAIRS} times each ...",
          file=sys.stderr, flush=True)
    before = load_average()
    speculative, alone = [], []
    for _ in range(BASELINE_PAIRS):
        speculative.append(speculative_tps())
        alone.append(target_alone_tps())
    comparison = SpeedComparison(speculative, alone, (before, load_average()))
    if note := comparison.unreliable():
        print(note, file=sys.stderr, flush=True)
    return comparison


def make_generator(seed, device: torch.device) -> torch.Generator:
    """A random number generator: seeded if --seed was given, from the OS's entropy otherwise."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


# ---------------------------------------------------------------------------------------------
# Output


class TokenPrinter:
    """Prints tokens as the generator hands them over (its on_tokens callback), coloured by source.

    A token is a string of bytes, not always of whole characters: one emoji or accented letter
    can be split over two tokens. The incremental UTF-8 decoder holds back an unfinished
    character until its last byte arrives, so the printed text is exactly decode(all tokens).
    """

    def __init__(self, out, colour: bool):
        self.out = out
        self.colour = colour
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.tokenizer = get_tokenizer()

    def __call__(self, tokens: list[int], sources: list[str]) -> None:
        for token, source in zip(tokens, sources):
            text = self.utf8.decode(self.tokenizer.decode_single_token_bytes(token))
            self.write(text, COLOURS.get(source, ""))
        self.out.flush()

    def write(self, text: str, colour: str = "") -> None:
        if self.colour and colour and text:
            text = colour + text + RESET
        self.out.write(text)

    def finish(self) -> None:
        """Print what is left of an unfinished character (as U+FFFD, like decode does)."""
        self.write(self.utf8.decode(b"", final=True))
        self.out.write("\n")
        self.out.flush()


def use_colour() -> bool:
    """Colour on a terminal only, and never when NO_COLOR is set (https://no-color.org)."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def start_printing(prompt: str, tree: bool = False) -> TokenPrinter:
    """Print the legend (in colour mode) and the prompt; return the printer for the new tokens."""
    colour = use_colour()
    if colour:
        print(LEGEND + ("  " + TREE_LEGEND if tree else "") + "\n")
    printer = TokenPrinter(sys.stdout, colour)
    printer.write(prompt, BOLD)
    return printer


def sampling_of(args, generator) -> SamplingParams:
    """--temperature, --top-k and --top-p, drawing with `generator`."""
    return SamplingParams(args.temperature, args.top_k, args.top_p, generator)


def gamma_of(args, cost_model: CostModel | None):
    """--gamma as the generators take it: a number, the CostModel AutoGamma decides from (auto),
    or HeuristicGamma, each bounded by --gamma-max."""
    if args.gamma == "auto":
        return cost_model.up_to(args.gamma_max)
    if args.gamma == "heuristic":
        return HeuristicGamma(args.gamma_max)
    return args.gamma


def get_cost_model(args, target, draft) -> CostModel | None:
    """--gamma auto: the CostModel from --cost-model FILE if it exists, else the one kept for
    this pair on this machine (measured the first time; written to FILE if one was named)."""
    if args.gamma != "auto":
        return None
    if args.cost_model and os.path.exists(args.cost_model):
        cost_model = CostModel.load(args.cost_model)
        cost_model.check_models(target, draft)
        if cost_model.gamma_max < args.gamma_max:
            raise UsageError(f"--cost-model {args.cost_model} was measured up to gamma {cost_model.gamma_max}, "
                             f"less than --gamma-max {args.gamma_max}: pass --gamma-max "
                             f"{cost_model.gamma_max}, or delete the file to measure again")
    else:
        cost_model = cli.kept_costs(target, draft, args.gamma_max)
        if args.cost_model:
            cost_model.save(args.cost_model)
    print(cost_model, file=sys.stderr, flush=True)
    return cost_model


def print_stats(stats, gamma, baseline=None, drafter: str = "model", tree=None, tokens=None,
                comparison: SpeedComparison | None = None) -> None:
    """gamma: draft tokens per round, or auto/heuristic (with a tree: its depth); tokens: the
    generated ones, to say when they looped (spec_decoding/presentation/loops.py)."""
    rate = stats.acceptance_rate
    by_position = " ".join("-" if r is None else f"{r:.0%}" for r in stats.acceptance_by_position)
    most = gamma if isinstance(gamma, int) else max(stats.gamma_by_round, default=0)
    lines = [
        "",
        "--- speculative decoding ---",
        f"drafter:                {drafter}",
        f"tokens generated:       {stats.tokens_generated} (stopped: {STOP_REASONS.get(stats.stop_reason, stats.stop_reason)})",
        f"acceptance rate:        {'-' if rate is None else f'{rate:.1%}'} of {stats.tokens_drafted} drafted "
        f"tokens were accepted (by position: {by_position})",
        f"alpha (theory):         {'-' if stats.alpha is None else f'{stats.alpha:.1%}'} of "
        f"{stats.tokens_accepted + stats.rejections} judged tokens were accepted (drafts after a "
        f"round's first rejection are never judged)",
        f"tokens per target call: {stats.tokens_per_target_call:.2f} (at most {'depth' if tree else 'gamma'} + 1 = {most + 1})",
        f"gamma of each round:    {' '.join(map(str, stats.gamma_by_round))}"
        + ("" if isinstance(gamma, int) else f" (--gamma {gamma})") + gamma_zero_note(stats.gamma_by_round, gamma),
        f"target / draft calls:   {stats.target_calls} / {stats.draft_calls}",
        *([f"tree nodes per call:    {stats.nodes_per_target_call:.1f} (tree {','.join(map(str, tree))}; "
           f"{stats.token_sources.count(FROM_DRAFT_BRANCH)} tokens from side branches)"] if tree else []),
        f"speed:                  {stats.tokens_per_second:.1f} tokens/s ({stats.seconds:.2f} s)",
    ]
    if baseline is not None:
        lines.append(f"baseline (target alone): {baseline.stats.tokens_per_second:.1f} tokens/s "
                     f"({baseline.stats.seconds:.2f} s, {baseline.stats.target_calls} target calls)")
        lines += comparison.lines() if comparison else [f"speedup:                {speedup(stats, baseline.stats):.2f}x"]
    if tokens is not None and looped(tokens):  # the acceptance above measures the loop
        lines.append(f"{LOOP_MARK} ({loop_share(tokens):.0%} of the tokens repeat one n-gram, which "
                     f"both models predict: spec_decoding/presentation/loops.py)")
    print("\n".join(lines))


def gamma_zero_note(gamma_by_round: list[int], gamma) -> str:
    """Why a round drafted nothing (gamma 0: a plain target step), if one did."""
    if 0 not in gamma_by_round:
        return ""
    room = "max_gen or the context window left room for only one more token"
    if isinstance(gamma, int):
        return f"\n                        (0: a plain target step, nothing drafted: {room})"
    return (f"\n                        (0: a plain target step, nothing drafted: the policy judged "
            f"drafting not worth it, or {room})")


def speedup(stats, baseline_stats) -> float:
    """How many times faster than the target alone, in tokens per second."""
    if baseline_stats.tokens_per_second == 0:
        return 0.0
    return stats.tokens_per_second / baseline_stats.tokens_per_second


def describe_baseline_match(result, baseline, temperature: float) -> str:
    if temperature > 0:
        return ("(sampling: both runs follow the target's distribution but use the random numbers "
                "differently, so their texts differ)")
    if result.tokens == baseline.tokens:
        return "greedy: identical tokens to the target alone, as speculative decoding promises"
    first = next((i for i, (a, b) in enumerate(zip(result.tokens, baseline.tokens)) if a != b),
                 min(len(result.tokens), len(baseline.tokens)))
    return (f"greedy: the tokens differ from the target alone's from token {first} on. Scoring "
            f"tokens in one batch or one at a time rounds differently, which can flip a near-tie "
            f"(more likely in float16/bfloat16).")


def to_json(args, device: torch.device, dtype: torch.dtype, seed: int, prompt_ids, result,
            baseline=None, drafter: str = "model", comparison: SpeedComparison | None = None) -> str:
    report = {
        "prompt": args.prompt,
        "prompt_tokens": prompt_ids,
        "drafter": drafter,
        "draft": args.draft if args.drafter == "model" else None,
        "target": args.target,
        "settings": {"gamma": args.gamma, "gamma_max": args.gamma_max, "tree": args.tree, "max_gen": args.max_gen, "temperature": args.temperature,
                     "top_k": args.top_k, "top_p": args.top_p, "seed": seed,
                     "device": str(device),
                     "dtype": str(dtype).removeprefix("torch.")},
        "tokens": result.tokens,
        "text": get_tokenizer().decode(result.tokens),
        "stats": result.stats.to_dict(),
        "loop_share": loop_share(result.tokens), "looped": looped(result.tokens),
    }
    if baseline is not None:
        report["baseline"] = {"tokens": baseline.tokens,
                              "text": get_tokenizer().decode(baseline.tokens),
                              "stats": baseline.stats.to_dict()}
        report["speedup"] = comparison.speedup if comparison else speedup(result.stats, baseline.stats)
        if comparison:
            report["speed_comparison"] = comparison.to_dict()
        report["identical_to_baseline"] = result.tokens == baseline.tokens
    return json.dumps(report, indent=2, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------
# Main


def generate_batch(args, device: torch.device) -> None:
    """--prompts-file: every prompt decoded together (spec_decoding.algorithms.batched), stats per prompt
    and summed."""
    prompt_ids = [encode_prompt(p) for p in args.prompts]
    target = load_model("target", args.target, device, args.dtype, args.quantize, args.compile, args.plain)
    draft = load_model("draft", args.draft, device, args.dtype, args.draft_quantize, args.compile, args.plain)
    check_drafter(target, ModelDrafter(draft))
    warm_up(target)
    warm_up(draft)
    generator = make_generator(args.seed, device)
    seed = generator.initial_seed()
    print(f"Decoding {len(prompt_ids)} prompts as one batch ...", file=sys.stderr, flush=True)
    result = batched_speculative_sampling(target, draft, prompt_ids, args.max_gen, args.gamma,
                                          sampling_of(args, generator), EOT_ID)
    baseline = run_baseline(args, "the target alone, batched", lambda: batched_autoregressive_generate(
        target, prompt_ids, args.max_gen, sampling_of(args, make_generator(seed, device)), EOT_ID))
    comparison = compare_speeds(
        args, lambda: batched_speculative_sampling(target, draft, prompt_ids, args.max_gen, args.gamma,
                                                   sampling_of(args, make_generator(seed, device)),
                                                   EOT_ID).tokens_per_second,
        lambda: batched_autoregressive_generate(target, prompt_ids, args.max_gen,
                                                sampling_of(args, make_generator(seed, device)), EOT_ID).tokens_per_second)
    decode = get_tokenizer().decode
    if args.json:
        rows = [{"prompt": p, "prompt_tokens": ids, "tokens": row.tokens, "text": decode(row.tokens),
                 "stats": row.stats.to_dict()}
                for p, ids, row in zip(args.prompts, prompt_ids, result.rows)]
        report = {"draft": args.draft, "target": args.target, "rows": rows,
                  "settings": {"gamma": args.gamma, "max_gen": args.max_gen, "temperature": args.temperature,
                               "top_k": args.top_k, "top_p": args.top_p, "seed": seed, "device": str(device),
                               "dtype": str(target.wpe.weight.dtype).removeprefix("torch.")},
                  "summed": {"tokens_generated": result.tokens_generated, "seconds": result.seconds,
                             "tokens_per_second": result.tokens_per_second, "alpha": result.alpha,
                             "target_forwards": result.target_forwards, "draft_forwards": result.draft_forwards}}
        if baseline is not None:
            report["baseline"] = {"tokens": baseline.tokens, "seconds": baseline.seconds,
                                  "tokens_per_second": baseline.tokens_per_second}
            report["speedup"] = comparison.speedup
            report["speed_comparison"] = comparison.to_dict()
            report["identical_to_baseline"] = result.tokens == baseline.tokens
        print(json.dumps(report, indent=2, ensure_ascii=False))
        return
    for i, (prompt, row) in enumerate(zip(args.prompts, result.rows)):
        s = row.stats
        alpha = "-" if s.alpha is None else f"{s.alpha:.0%}"
        print(f"--- prompt {i}: {len(row.tokens)} tokens, stopped: "
              f"{STOP_REASONS.get(s.stop_reason, s.stop_reason)}, alpha {alpha}, "
              f"{s.tokens_per_target_call:.2f} tokens per target call ---")
        print(prompt + BOLD + decode(row.tokens) + RESET if use_colour() else prompt + decode(row.tokens))
    alpha = "-" if result.alpha is None else f"{result.alpha:.1%}"
    print(f"\n--- batched speculative decoding, {len(result.rows)} prompts ---\n"
          f"tokens generated (sum): {result.tokens_generated}\n"
          f"alpha (all rows):       {alpha}\n"
          f"target / draft forwards (batched): {result.target_forwards} / {result.draft_forwards}\n"
          f"speed (sum over rows):  {result.tokens_per_second:.1f} tokens/s ({result.seconds:.2f} s)")
    if baseline is not None:
        print(f"baseline (target alone, batched): {baseline.tokens_per_second:.1f} tokens/s "
              f"({baseline.seconds:.2f} s)\n" + "\n".join(comparison.lines()))
        if args.temperature == 0:
            same = sum(a == b for a, b in zip(result.tokens, baseline.tokens))
            print(f"greedy: {same} of {len(result.rows)} prompts identical to the target alone")


def generate(args) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    if note := busy_note("--threads 1"):
        print(note, file=sys.stderr, flush=True)
    device = resolve_device(args.device)
    if args.dtype != "auto":  # said once, before the loads (which would say it too)
        note_once(dtype_note(resolve_dtype(args.dtype, device), device), sys.stderr)
    if args.prompts_file:
        return generate_batch(args, device)
    prompt_ids = encode_prompt(args.prompt)
    check_before_loading(prompt_ids, args)
    # The target first: it is the big download, and the likelier one to fail.
    target = load_model("target", args.target, device, args.dtype, args.quantize, args.compile, args.plain)
    drafter, drafter_line = make_drafter(args, target, device, args.dtype)
    check_drafter(target, drafter)  # before anything runs: a wrong pair fails with the reason
    warm_up(target)
    if isinstance(drafter, ModelDrafter):
        warm_up(drafter.model)
    generator = make_generator(args.seed, device)
    # --seed, or the random one (printed with the trace and in the JSON): with the same models,
    # options and machine (for --gamma auto: its costs kept there, cli.kept_costs), it
    # reproduces this run.
    seed = generator.initial_seed()

    cost_model = None if args.tree else get_cost_model(args, target, drafter)

    printer = None if args.json else start_printing(args.prompt, tree=bool(args.tree))
    observers = Observers(on_tokens=printer, trace=bool(args.html))
    if args.tree:
        result = tree_speculative_sampling(target, drafter, prompt_ids, args.max_gen, args.tree,
                                           sampling_of(args, generator), EOT_ID, observers)
    else:
        result = speculative_sampling(target, drafter, prompt_ids, args.max_gen, gamma_of(args, cost_model),
                                      sampling_of(args, generator), EOT_ID, observers)
    if printer:
        printer.finish()
    if args.html:
        write_html(result.trace, Path(args.html).expanduser(),
                   pair=f"target: {args.target}; drafter: {drafter_line}; seed {seed}")
        print(f"Wrote the round-by-round trace to {args.html}", file=sys.stderr)

    # The same seed; for sampling the texts still differ, as the two use their random numbers
    # differently. Both follow the target's distribution.
    baseline = run_baseline(args, "the target alone", lambda: autoregressive_generate(
        target, prompt_ids, args.max_gen, sampling_of(args, make_generator(seed, device)), EOT_ID))

    def speculative_again() -> float:  # the same run, not streamed: timed as the baseline is
        sampling = sampling_of(args, make_generator(seed, device))
        if args.tree:
            again = tree_speculative_sampling(target, drafter, prompt_ids, args.max_gen, args.tree, sampling, EOT_ID)
        else:
            again = speculative_sampling(target, drafter, prompt_ids, args.max_gen, gamma_of(args, cost_model),
                                         sampling, EOT_ID)
        return again.stats.tokens_per_second

    comparison = compare_speeds(args, speculative_again, lambda: autoregressive_generate(
        target, prompt_ids, args.max_gen, sampling_of(args, make_generator(seed, device)), EOT_ID).stats.tokens_per_second)

    if args.json:
        print(to_json(args, device, target.wpe.weight.dtype, seed, prompt_ids, result, baseline, drafter_line,
                      comparison))
    else:
        print_stats(result.stats, len(args.tree) if args.tree else args.gamma, baseline, drafter_line, args.tree,
                    result.tokens, comparison)
        if baseline is not None:
            print(describe_baseline_match(result, baseline, args.temperature))


def main(argv=None) -> int:
    args = parse_args(argv)  # exits with code 2 on a bad argument
    try:
        generate(args)
    except (CheckpointError, UsageError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
