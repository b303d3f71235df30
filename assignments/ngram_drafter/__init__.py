"""Assignment 4: write an n-gram drafter (prompt lookup) (README.md here; instructor.md: notes)."""

import torch

from ..definition import Assignment, Check, Failed
from ..forms import Bool, Int, List, Record, Samples, Tokens, Tuple
from ..greedy_speculative import VOCAB, check_speculated, check_tokens, plain_tokens, serve_target, served_reference
from ..probing import PROMPT, follows, load, lossless_reference, sample_counts, seeded, whole_number
from ..serving import served_model

NGRAM = "spec_decoding.drafters.drafter.NGramDrafter.propose"

# (what the case shows, tokens, num_tokens asked, max_ngram, the drafter's own num_tokens cap)
CASES = [
    ("the last 3 tokens occurred earlier: propose what followed them", [1, 2, 3, 4, 5, 9, 1, 2, 3], 2, 3, None),
    ("the suffix occurs twice earlier: propose what followed the MOST RECENT occurrence",
     [1, 2, 7, 1, 2, 8, 1, 2], 1, 2, None),
    ("no earlier match of the last max_ngram tokens: fall back to shorter n-grams (n = max_ngram, then "
     "smaller, down to 1)", [5, 6, 7, 9, 6, 7], 3, 3, None),
    ("a longer n-gram matches: it wins over a more recent match of a shorter one",
     [3, 8, 1, 4, 6, 8, 2, 4, 3, 8], 2, 2, None),
    ("nothing matches: propose nothing", [1, 2, 3, 4], 3, 3, None),
    ("fewer tokens follow the match than asked for: propose those there are", [1, 2, 3, 1, 2], 5, 2, None),
    ("the drafter's own num_tokens caps the proposal", [1, 2, 3, 4, 5, 1, 2], 4, 2, 1),
    ("num_tokens = 0: propose nothing", [1, 2, 3, 1, 2], 0, 2, None),
    ("a one-token sequence has nothing earlier to match", [5], 3, 3, None),
    ("the suffix itself is not an earlier occurrence (a run of one token)", [7, 7, 7], 2, 2, None),
]


def lookup_inputs(seed):
    cases = [list(case) for case in CASES]
    if seed:  # the hidden inputs: the same cases with the tokens renamed
        rename = torch.randperm(50, generator=seeded(seed)).tolist()
        for case in cases:
            case[1] = [rename[t] for t in case[1]]
    return {"cases": cases}


def lookup_form(inputs, ref):
    proposal = List(Int(0, 2**31 - 1, "a token id"), at_most=64, what="tokens")
    return Tuple(tuple(Record({"tokens": proposal, "q_is_none": Bool()}) for _ in inputs["cases"]), what="cases")


def lookup_probe(inputs, data):
    from spec_decoding.drafters import NGramDrafter

    out = []
    for _, tokens, num_tokens, max_ngram, cap in inputs["cases"]:
        proposal, q = NGramDrafter(max_ngram=max_ngram, num_tokens=cap).propose(list(tokens), num_tokens)
        out.append({"tokens": [whole_number(t, "propose()'s token") for t in proposal], "q_is_none": q is None})
    return out


def lookup_judge(inputs, ref, got):
    for (what, tokens, num_tokens, max_ngram, cap), mine, want in zip(inputs["cases"], got, ref, strict=True):
        call = f"NGramDrafter(max_ngram={max_ngram}, num_tokens={cap}).propose({tokens}, {num_tokens})"
        if mine["tokens"] != want["tokens"]:
            raise Failed(f"{call} proposed {mine['tokens']}, expected {want['tokens']}: {what}")
        if not mine["q_is_none"]:
            raise Failed(f"{call} returned a q: the proposal is deterministic (a point mass), so return None "
                         f"for q and the generator uses point masses (see the class docstring)")


def greedy_inputs(seed):
    last = 0 if seed == 0 else 1 + (seed - 1) % 99  # the hidden inputs' never the visible one's
    return {"prompt": PROMPT + PROMPT[:4] + [last], "max_gen": 24, "gamma": 4}


def greedy_probe(inputs, data):
    """Greedy speculative decoding with the student's drafter, on the grader's served target
    (assignments/greedy_speculative: the grader counts its forwards)."""
    from spec_decoding import NGramDrafter, speculative_sampling_greedy

    result = speculative_sampling_greedy(served_model(data), NGramDrafter(max_ngram=3), inputs["prompt"],
                                         inputs["max_gen"], inputs["gamma"])
    return plain_tokens(result)


def greedy_reference(inputs, data):
    """The served target's greedy output, and the forwards the instructor's drafter takes, under a
    secret target that continues the prompt's repetition often enough for those forwards to be
    told from plain decoding's (greedy_speculative.served_reference, beats_plain)."""
    from spec_decoding import NGramDrafter

    return served_reference(inputs, data, [inputs], lambda: NGramDrafter(max_ngram=3), beats_plain=True)


def greedy_form(inputs, ref):
    return Tokens(len(ref["tokens"][0]), VOCAB)


def greedy_judge(inputs, ref, got, served):
    check_tokens(got, ref["tokens"][0], "greedy speculative decoding with your drafter", hidden=False)
    check_speculated(ref, served, "greedy speculative decoding with your drafter on a prompt that repeats itself",
                     hidden=False)


def lossless_inputs(seed):
    return {"prompt": [1, 2, 3, 1, 2], "n_tokens": 3, "samples": 500, "gamma": 3, "seed": seed}


def lossless_probe(inputs, data):
    from spec_decoding import NGramDrafter, SamplingParams, speculative_sampling

    target, g = load(data, "vocab_target"), seeded(inputs["seed"])
    return [[whole_number(t, "the generator's token") for t in
             speculative_sampling(target, NGramDrafter(max_ngram=2), inputs["prompt"], inputs["n_tokens"],
                                  inputs["gamma"], sampling=SamplingParams(temperature=1.0, generator=g)).tokens]
            for _ in range(inputs["samples"])]


def lossless_form(inputs, ref):
    return Samples(inputs, round(len(ref) ** (1 / inputs["n_tokens"])))


def lossless_judge(inputs, ref, got):
    follows(sample_counts(inputs, ref, got), ref, {},
            f"speculative sampling with your drafter: {inputs['samples']} samples of {inputs['n_tokens']} tokens do "
            f"not follow the target's exactly enumerated distribution",
            "a deterministic proposal is a point mass: return None for q (the generator then uses q(x) = 1), "
            "never a q the tokens were not drawn from")


ASSIGNMENT = Assignment(
    name="ngram_drafter",
    functions=(NGRAM,),
    readme="assignments/ngram_drafter/README.md",
    # Points follow the idea, the lookup: a drafter that proposes nothing earns only the end-to-end
    # sampling check (lossless whatever is drafted), 1 of 8 (ngram_greedy's secret target always
    # lets the lookup save forwards); one that repeats the last token may also pass ngram_greedy
    # when the target's output runs into a one-token loop, 2 of 8.
    checks=(
        Check("ngram_lookup", (NGRAM,), lookup_inputs, lookup_probe, lookup_judge, lookup_form, points=6,
              about="propose() on sequences made to show each rule"),
        Check("ngram_greedy", (NGRAM,), greedy_inputs, greedy_probe, greedy_judge, greedy_form, reference=greedy_reference,
              serve=serve_target, about="the grader counts the served target's forwards"),
        Check("ngram_lossless", (NGRAM,), lossless_inputs, lossless_probe, lossless_judge, lossless_form,
              visible=False,
              reference=lossless_reference, timeout=120),
    ),
)
