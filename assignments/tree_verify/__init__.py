"""Assignment 5: verify a token tree, the multi-draft rejection step (README.md here;
instructor.md: the notes)."""

import torch

from ..definition import Assignment, Check, Failed, as_floats
from ..forms import Int, List, Maybe, Samples, Tuple
from ..probing import (follows, function, load, lossless_reference, outcomes, random_distributions, sample_counts,
                       seeded, whole_number)

MULTI = "spec_decoding.algorithms.rejection.multi_draft_rejection_sampling"
RESIDUAL = "spec_decoding.algorithms.rejection.residual_distribution"
VOCAB, ROUNDS = 6, 4000
HINT = ("try the children in turn: accept x_i with probability min(1, r(x_i)/q(x_i)), r starting at p and "
        "becoming norm(max(0, r - q)) after each rejection; if all are rejected draw from the final r")


def node_inputs(seed, children=3):
    return {"p_seed": 800 + seed, "q_seed": 900 + seed, "children": children, "rounds": ROUNDS,
            "children_seed": 950 + seed, "seed": 1000 + seed}


def node_tables(inputs):
    return (random_distributions(inputs["p_seed"], 1, VOCAB)[0].float(),
            random_distributions(inputs["q_seed"], 1, VOCAB, sharpness=1.0)[0].float())


def children_of(inputs) -> list[list[int]]:
    """Every round's children, [rounds][children], drawn independently from q with their own
    generator: the probe hands them to the student's step; the grader draws the same ones."""
    q, g = node_tables(inputs)[1], seeded(inputs["children_seed"])
    return torch.multinomial(q, inputs["rounds"] * inputs["children"], replacement=True,
                             generator=g).view(inputs["rounds"], inputs["children"]).tolist()


def node_probe(inputs, data):
    """Run the student's step at one node once per round; return what it decided, raw:
    [accepted child or None, next token or None] per round. It counts nothing."""
    step = function(MULTI)
    p, q = node_tables(inputs)
    g = seeded(inputs["seed"])
    out = []
    for children in children_of(inputs):
        verdict = step(p, q, children, g)
        accepted, token = verdict.accepted, verdict.next_token
        out.append([None if accepted is None else whole_number(accepted, "the verdict's accepted"),
                    None if token is None else whole_number(token, "the verdict's next_token")])
    return out


def node_counts(inputs, got) -> dict:
    """The raw outcomes counted here against the children drawn here: the joint law of (which
    child was accepted, or none, [b + 1]; the token the node outputs, [V]), and `which` alone."""
    b = inputs["children"]
    joint, which = [[0] * VOCAB for _ in range(b + 1)], [0] * (b + 1)
    for children, (accepted, token) in zip(children_of(inputs), outcomes(got, inputs["rounds"], 2, "the step"),
                                           strict=True):
        if accepted is not None:
            if not 0 <= accepted < b or token is not None:
                raise Failed(f"the verdict says child {accepted} was accepted and next_token={token}: an accepted "
                             f"child is an index in 0..{b - 1}, and next_token is None then")
            out, row = children[accepted], accepted
        else:
            if token is None or not 0 <= token < VOCAB:
                raise Failed(f"every child was rejected but next_token={token}: draw it from the residual "
                             f"(a token id below {VOCAB})")
            out, row = token, b
        joint[row][out] += 1
        which[row] += 1
    return {"joint": sum(joint, []), "which": which}


def node_form(inputs, ref):
    """[accepted child or null, next token or null] for each of the rounds (their ranges are checked,
    with a hint, as they are counted: node_counts)."""
    verdict = Tuple((Maybe(Int(what="a child's index")), Maybe(Int(what="a token id"))),
                    what="values (accepted child, next token)")
    return List(verdict, inputs["rounds"], what="rounds")


def lossless_form(inputs, ref):
    return Samples(inputs, round(len(ref) ** (1 / inputs["n_tokens"])))


def node_reference(inputs, data):
    """The exact joint law of (accepted child or none, output token), the law of which child, and
    those of the classic mistakes, computed with the instructor's residual. The grader's alone:
    make strips it from the copy."""
    residual = function(RESIDUAL)
    p, q = (t.double() for t in node_tables(inputs))
    b = inputs["children"]

    def law(target_after_rejection):
        """Child i is tried against r_i (r_0 = p, r_i+1 = target_after_rejection(r_i)); rows: child
        i accepted with its token, then all rejected with the token drawn from the final r."""
        rows, r, reached = [], p, 1.0
        for _ in range(b):
            rows.append(reached * torch.minimum(r, q))
            reached = reached * (1 - torch.minimum(r, q).sum())
            r = target_after_rejection(r)
        rows.append(reached * r)
        return torch.stack(rows)

    right = law(lambda r: residual(r, q))
    naive = torch.stack([(1 - torch.minimum(p, q).sum()) ** i * torch.minimum(p, q) for i in range(b)]
                        + [(1 - torch.minimum(p, q).sum()) ** b * residual(p, q)])
    only = torch.zeros(b + 1, VOCAB, dtype=torch.float64)
    first, rejected = only.clone(), only.clone()
    first[0], rejected[b] = q, p
    return {"joint": as_floats(right.reshape(-1)), "which": as_floats(right.sum(-1)), "mistakes": {
        "every child is tested against the unchanged p: after a rejection the target must become "
        "norm(max(0, r - q)) (a token the draft likes otherwise gets b chances)": as_floats(naive.reshape(-1)),
        "the first child is always accepted (the draft's q comes out)": as_floats(first.reshape(-1)),
        "every child is rejected and the token drawn from p (the output follows p, but nothing is gained)":
            as_floats(rejected.reshape(-1))}}


def output_judge(inputs, ref, got):
    follows(node_counts(inputs, got)["joint"], ref["joint"], ref["mistakes"],
            f"which child is accepted ({inputs['children']} children), and the token the node outputs, do not "
            f"follow SpecInfer's exact joint law", HINT)


def rejected_judge(inputs, ref, got):
    follows(node_counts(inputs, got)["which"], ref["which"], {},
            f"how often child 1, 2, ... or none of the {inputs['children']} is accepted does not follow SpecInfer's "
            f"rule", HINT)


def lossless_inputs(seed):
    return {"prompt": [1, 2, 3], "n_tokens": 3, "samples": 500, "branching": [2, 2], "seed": seed}


def lossless_probe(inputs, data):
    from spec_decoding import SamplingParams, tree_speculative_sampling

    target, draft, g = load(data, "vocab_target"), load(data, "vocab_draft"), seeded(inputs["seed"])
    return [[whole_number(t, "the generator's token") for t in
             tree_speculative_sampling(target, draft, inputs["prompt"], inputs["n_tokens"], tuple(inputs["branching"]),
                                       SamplingParams(temperature=1.0, generator=g)).tokens]
            for _ in range(inputs["samples"])]


def lossless_judge(inputs, ref, got):
    follows(sample_counts(inputs, ref, got), ref, {},
            f"token-tree sampling (branching {inputs['branching']}) with your step: {inputs['samples']} samples of "
            f"{inputs['n_tokens']} tokens do not follow the target's exactly enumerated distribution", HINT)


ASSIGNMENT = Assignment(
    name="tree_verify",
    functions=(MULTI,),
    # The chain's step is this step's building block (one child, target r): it would answer it.
    removed=("spec_decoding.algorithms.rejection.modified_rejection_sampling",),
    # Notebook 05 proves the rule and tests a naive variant next to it.
    dropped=("notebooks/05_token_trees.*",),
    readme="assignments/tree_verify/README.md",
    # Points follow the idea: "reject every child, draw from p" gives the right tokens with the
    # wrong joint law, and earns only the end-to-end check (1 of 8).
    checks=(
        Check("multi_draft_output", (MULTI,), node_inputs, node_probe, output_judge, node_form, points=3,
              reference=node_reference, statistical=True,
              about="3 children: (which accepted, token) follows the exact law"),
        Check("multi_draft_one_child", (MULTI,), lambda seed: node_inputs(seed, children=1), node_probe,
              output_judge, node_form, points=2, reference=node_reference, statistical=True),
        Check("multi_draft_all_rejected", (MULTI,), lambda seed: node_inputs(seed, children=4), node_probe,
              rejected_judge, node_form, points=2, visible=False, reference=node_reference, statistical=True),
        Check("tree_lossless", (MULTI,), lossless_inputs, lossless_probe, lossless_judge, lossless_form,
              visible=False,
              reference=lossless_reference, timeout=120, statistical=True),
    ),
)
