"""Assignment 4: write an n-gram drafter (prompt lookup) (README.md here; instructor.md: notes)."""

import random

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
    """The visible cases (seed 0), or cases drawn for this seed (drawn_cases): not the visible
    ones relabelled, so no table of the visible answers, however it renames tokens, answers them."""
    if seed == 0:
        return {"cases": [list(case) for case in CASES]}
    return {"cases": drawn_cases(random.Random(f"ngram_drafter/{seed}"))}


def canonical(case) -> tuple:
    """A case up to renaming its tokens (each token by the order of its first appearance): what a
    renaming-proof table of answers would be keyed by."""
    _, tokens, num_tokens, max_ngram, cap = case
    order = {}
    return tuple(order.setdefault(t, len(order)) for t in tokens), num_tokens, max_ngram, cap


VISIBLE_FORMS = {canonical(case) for case in CASES}
RANDOM_CASES = 3  # after one case drawn for each rule: sequences drawn at random


def drawn_cases(r: random.Random) -> list:
    """One case for each rule CASES shows (its words, in its order), each built afresh from random
    lengths, positions and tokens (every token but the repeated n-grams distinct, so only the rule's
    own match is there), then RANDOM_CASES sequences drawn at random over a few tokens. A case whose
    form equals a visible case's up to renaming (canonical) is drawn again."""
    cases = []
    for i, (what, *_) in enumerate(CASES):
        while True:
            case = [what, *_rule_case(i, r)]
            if canonical(case) not in VISIBLE_FORMS:
                break
        cases.append(case)
    while len(cases) < len(CASES) + RANDOM_CASES:
        alphabet = r.sample(range(100), r.randint(2, 5))
        tokens = [r.choice(alphabet) for _ in range(r.randint(2, 16))]
        case = ["a sequence drawn at random: every rule above applies", tokens, r.randint(1, 5), r.randint(1, 4),
                r.choice([None, None, r.randint(1, 4)])]
        if canonical(case) not in VISIBLE_FORMS:
            cases.append(case)
    return cases


def _rule_case(rule: int, r: random.Random) -> list:
    """[tokens, num_tokens, max_ngram, cap] showing CASES[rule]'s rule, drawn with `r`."""
    pool = r.sample(range(100), 100)
    fresh = lambda n: [pool.pop() for _ in range(n)]  # noqa: E731  (tokens used nowhere else)
    m, k = r.randint(1, 4), r.randint(1, 4)
    if rule == 0:  # the last 3 tokens occurred earlier
        x = fresh(3)
        return [fresh(r.randint(0, 3)) + x + fresh(r.randint(k, k + 2)) + fresh(r.randint(0, 2)) + x, k, 3, None]
    if rule == 1:  # two earlier occurrences: the most recent one's followers
        x = fresh(m)
        first, second = fresh(r.randint(k, k + 2)), fresh(r.randint(k, k + 2))
        return [fresh(r.randint(0, 2)) + x + first + x + second + x, k, m, None]
    if rule == 2:  # no match of max_ngram tokens, a shorter one matches
        m = r.randint(2, 4)
        j = r.randint(1, m - 1)
        x = fresh(j)
        return [fresh(r.randint(0, 2)) + x + fresh(r.randint(k, k + 2)) + fresh(m - j) + x, k, m, None]
    if rule == 3:  # a longer n-gram earlier wins over a more recent match of its last token
        m = r.randint(2, 4)
        x = fresh(m)
        return [fresh(r.randint(0, 2)) + x + fresh(r.randint(k, k + 2)) + fresh(1) + x[-1:] + fresh(r.randint(k, k + 2))
                + fresh(r.randint(0, 2)) + x, k, m, None]
    if rule == 4:  # nothing matches
        return [fresh(r.randint(2, 9)), k, m, None]
    if rule == 5:  # fewer tokens follow the match than asked for
        x, follow = fresh(m), fresh(r.randint(0, 2))
        return [fresh(r.randint(0, 2)) + x + follow + x, len(follow) + m + r.randint(1, 3), m, None]
    if rule == 6:  # the drafter's own cap
        x, cap = fresh(m), r.randint(1, 3)
        return [fresh(r.randint(0, 2)) + x + fresh(cap + r.randint(1, 3)) + x, cap + r.randint(1, 3), m, cap]
    if rule == 7:  # num_tokens = 0
        x = fresh(m)
        return [fresh(r.randint(0, 2)) + x + fresh(r.randint(1, 3)) + x, 0, m, None]
    if rule == 8:  # one token
        return [fresh(1), k, m, None]
    return [fresh(1) * r.randint(2, 6), k, r.randint(1, 4), None]  # a run of one token


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


def recording_drafter(calls: list):
    """An NGramDrafter(max_ngram=3) (the copy's: in the probe, the student's) that appends
    [how many tokens it was given, what it proposed] to `calls` at each propose()."""
    from spec_decoding import NGramDrafter

    class Recorded(NGramDrafter):
        def propose(self, tokens, num_tokens, *args, **kwargs):
            proposal, q = super().propose(tokens, num_tokens, *args, **kwargs)
            calls.append([len(tokens), [whole_number(t, "propose()'s token") for t in proposal]])
            return proposal, q

    return Recorded(max_ngram=3)


def greedy_probe(inputs, data):
    """Greedy speculative decoding with the student's drafter, on the grader's served target
    (assignments/greedy_speculative: the grader counts its forwards); the output and every
    proposal the drafter made."""
    from spec_decoding import speculative_sampling_greedy

    calls = []
    result = speculative_sampling_greedy(served_model(data), recording_drafter(calls), inputs["prompt"],
                                         inputs["max_gen"], inputs["gamma"])
    return {"tokens": plain_tokens(result), "proposals": calls}


def greedy_reference(inputs, data):
    """The served target's greedy output, the forwards the instructor's drafter takes and every
    proposal it makes, under a secret target that continues the prompt's repetition often enough
    for those forwards to be told from plain decoding's (greedy_speculative.served_reference,
    beats_plain)."""
    calls = []

    def drafter():
        calls.clear()  # a fresh drafter for each secret tried: the chosen one's proposals are kept
        return recording_drafter(calls)

    reference = served_reference(inputs, data, [inputs], drafter, beats_plain=True)
    return {**reference, "proposals": [list(call) for call in calls]}


def greedy_form(inputs, ref):
    proposal = List(Int(0, 2**31 - 1, "a token id"), at_most=inputs["gamma"], what="tokens")
    calls = List(Tuple((Int(0, 4096, "a length"), proposal), what="a call"), at_most=len(ref["proposals"]) + 64,
                 what="propose() calls")
    return Record({"tokens": Tokens(len(ref["tokens"][0]), VOCAB), "proposals": calls})


def greedy_judge(inputs, ref, got, served):
    """The target's output; then each proposal the drafter made, against the n-gram lookup's on
    the same tokens (a drafter that drafts any other way, a model found from its caller included,
    fails here, whatever forwards it saves); then the forwards the grader counted."""
    what = "greedy speculative decoding with your drafter"
    check_tokens(got["tokens"], ref["tokens"][0], what, hidden=False)
    prompt = len(inputs["prompt"])
    for i, (mine, want) in enumerate(zip(got["proposals"], ref["proposals"]), 1):
        if mine != want:
            raise Failed(f"{what}: propose() call {i} (given the prompt and {want[0] - prompt} generated tokens) "
                         f"proposed {mine[1]}, expected {want[1]}: the drafter proposes what followed the most recent "
                         f"earlier occurrence of the sequence's end (the n-gram lookup), nothing else")
    if len(got["proposals"]) != len(ref["proposals"]):
        raise Failed(f"{what}: propose() was called {len(got['proposals'])} times, expected "
                     f"{len(ref['proposals'])} (one call per round)")
    check_speculated(ref, served, what + " on a prompt that repeats itself", hidden=False)


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
              reference=lossless_reference, timeout=120, statistical=True),
    ),
)
