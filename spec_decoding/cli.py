"""What the two command-line scripts share (spec_decoding_generate.py and benchmark.py): the types
of their arguments, and building a drafter from its name.

A drafter is named on a command line as KIND or KIND:N, e.g. model, ngram:3, layerskip:6, or
KIND:DIR for a drafter trained for the target and read from a folder (medusa:DIR, eagle:DIR, made
by python -m offline.train_drafter). A new kind of drafter is added once, to DRAFTER_KINDS below:
both scripts then accept it.
"""

import argparse
import math
from dataclasses import asdict, dataclass
from typing import Callable

from gpt2 import GPT2
from gpt2.speed import kernel_cache
from .calibration import calibrate_costs
from .contracts import check_positive_int
from .drafters import Drafter, LayerSkipDrafter, ModelDrafter, NGramDrafter
from .drafters.feature_files import load_feature_drafter
from .drafters.token_tree import parse_branching
from .policies.costs import CostModel, describe_model
from .policies.gamma import POLICY_NAMES


# ---------------------------------------------------------------- argument types (argparse's type=)

def positive_int(text: str) -> int:
    """A whole number >= 1."""
    try:
        value = int(text)
        check_positive_int("value", value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1") from None
    return value


def non_negative_int(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0")
    return int(text)


def temperature(text: str) -> float:
    """A temperature: a finite number >= 0 (0 means greedy)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a temperature >= 0 (0 means greedy)")
    return value


def probability(text: str) -> float:
    """top-p: a number in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a probability in (0, 1]")
    return value


def gamma_value(text: str):
    """Draft tokens per round (a whole number >= 1), or a policy name (auto, heuristic)."""
    if text in POLICY_NAMES:
        return text
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1, "
                                         f"{' or '.join(POLICY_NAMES)}") from None


def branching(text: str) -> tuple[int, ...]:
    """A token tree, "2,2,1" -> (2, 2, 1): children per node at each depth."""
    try:
        return parse_branching(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# ---------------------------------------------------------------- drafters by name

@dataclass(frozen=True)
class DrafterKind:
    """A kind of drafter the command lines know."""

    build: Callable[[int | str | None, GPT2, GPT2 | None], Drafter]  # (N or DIR, target, draft model) -> drafter
    describe: Callable[[int | str | None], str]  # N or DIR -> what it is, for the scripts' output
    number: str | None = None  # what N means in KIND:N (None: the kind takes no number)
    folder: str | None = None  # what DIR means in KIND:DIR (None: the kind reads no folder)
    default: int | None = None  # N when KIND is given alone (None with a number: N is required)
    needs_draft_model: bool = False  # whether the scripts must load --draft for it
    drafts_trees: bool = False  # whether it drafts token trees (--tree): a draft model, or propose_tree


DRAFTER_KINDS = {
    "model": DrafterKind(build=lambda n, target, draft: ModelDrafter(draft),
                         describe=lambda n: "a smaller model (--draft)", needs_draft_model=True,
                         drafts_trees=True),
    "ngram": DrafterKind(build=lambda n, target, draft: NGramDrafter(max_ngram=n),
                         describe=lambda n: f"prompt lookup, n-grams of up to {n} tokens",
                         number="the longest n-gram looked up", default=3),
    "layerskip": DrafterKind(build=lambda n, target, draft: LayerSkipDrafter(target, n),
                             describe=lambda n: f"the target's first {n} blocks",
                             number="how many of the target's blocks draft"),
    "medusa": DrafterKind(build=lambda folder, target, draft: load_feature_drafter(folder, target, "medusa"),
                          describe=lambda folder: f"Medusa heads on the target's features, from {folder}",
                          folder="the heads' folder (python -m offline.train_drafter --kind medusa)",
                          drafts_trees=True),
    "eagle": DrafterKind(build=lambda folder, target, draft: load_feature_drafter(folder, target, "eagle"),
                         describe=lambda folder: f"an EAGLE-style drafter on the target's features, from {folder}",
                         folder="the drafter's folder (python -m offline.train_drafter --kind eagle)"),
}

def spec_help() -> str:
    """How to name a drafter, said from DRAFTER_KINDS (a new kind needs no edit here)."""
    forms, meanings = [], []
    for name, kind in DRAFTER_KINDS.items():
        if kind.folder is not None:
            forms.append(f"{name}:DIR")
            meanings.append(f"{name}:DIR: {kind.folder}")
        elif kind.number is not None:
            forms += [name, f"{name}:N"] if kind.default else [f"{name}:N"]
            meanings.append(f"{name}:N: {kind.number}")
        else:
            forms.append(name)
    return f"use {', '.join(forms)} ({'; '.join(meanings)}), N a whole number >= 1"


def drafter_spec(text: str) -> str:
    """KIND or KIND:N -> the canonical name (ngram is ngram:3). argparse's type= for drafters."""
    kind, _, number = text.partition(":")
    found = DRAFTER_KINDS.get(kind)
    if found is not None and found.folder is not None:
        if not number:
            raise argparse.ArgumentTypeError(f"{text!r} needs a folder: {kind}:DIR, DIR being {found.folder}")
        return text
    if found is not None and found.number is None and not number:
        return kind
    if found is not None and found.number is not None:
        if number.isdigit() and int(number) >= 1:
            return f"{kind}:{int(number)}"
        if not number and found.default is not None:
            return f"{kind}:{found.default}"
    raise argparse.ArgumentTypeError(f"{text!r} is not a drafter: {spec_help()}")


def drafter_choice(text: str) -> str:
    """spec_decoding_generate.py's --drafter: a kind's name (its N comes from an option of its own,
    --ngram, --draft-layers), or KIND:DIR for a kind read from a folder."""
    found = DRAFTER_KINDS.get(text.partition(":")[0])
    if found is not None and found.folder is not None:
        return drafter_spec(text)
    if text in DRAFTER_KINDS:
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is not a drafter: use " + ", ".join(
        f"{k}:DIR" if v.folder is not None else k for k, v in DRAFTER_KINDS.items()))


def split_drafter_spec(spec: str) -> tuple[str, int | str | None]:
    """A canonical name (drafter_spec) -> (kind, N or DIR or None)."""
    kind, _, argument = spec.partition(":")
    if DRAFTER_KINDS[kind].folder is not None:
        return kind, argument
    return kind, int(argument) if argument else None


def needs_draft_model(spec: str) -> bool:
    """Whether the drafter a canonical name stands for drafts with the --draft model."""
    return DRAFTER_KINDS[split_drafter_spec(spec)[0]].needs_draft_model


def drafts_trees(spec: str) -> bool:
    """Whether the drafter a canonical name (or a bare kind) stands for can draft token trees."""
    return DRAFTER_KINDS[split_drafter_spec(spec)[0]].drafts_trees


def tree_drafters() -> str:
    """The kinds that draft token trees, for error messages: "model, medusa:DIR"."""
    return ", ".join(f"{name}:DIR" if kind.folder is not None else name
                     for name, kind in DRAFTER_KINDS.items() if kind.drafts_trees)


def describe_drafter(spec: str) -> str:
    kind, number = split_drafter_spec(spec)
    return DRAFTER_KINDS[kind].describe(number)


def make_drafter(spec: str, target: GPT2, draft: GPT2 | None = None) -> Drafter:
    """The drafter a canonical name stands for. draft: the loaded draft model (kinds that need one).
    The drafter's own ValueError when it cannot be built (e.g. layerskip:K with K too large)."""
    kind, number = split_drafter_spec(spec)
    return DRAFTER_KINDS[kind].build(number, target, draft)


# ---------------------------------------------------------------- costs kept on this machine

def kept_costs(target: GPT2, draft, gamma_max: int = 8) -> CostModel:
    """The pair's CostModel on this machine, for gamma="auto": calibrated the first time (one line
    on stderr says so, and where it is kept), then read from the kernel cache
    (gpt2/speed/kernel_cache.py), kept under this machine, its threads and the two models as
    describe_model names them (shape, format, device). So every run of the scripts on this machine
    decides gamma="auto" from the same costs, and a seed reproduces a sampled run; `python -m
    gpt2.speed.kernel_report --remeasure` (or another machine) measures them again, and the gammas
    may then differ."""
    what = {"target": describe_model(target), "draft": describe_model(draft), "gamma_max": gamma_max,
            "measures": "forwards, catch-up, sampling, sampled round"}  # a CostModel kept before sampling was timed is measured again
    kept, _ = kernel_cache.decide_once(
        "gamma costs", what, lambda: asdict(calibrate_costs(target, draft, gamma_max)),
        "this pair's per-call costs for gamma=\"auto\" (a few seconds)")
    return CostModel(**kept)
