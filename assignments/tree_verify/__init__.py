"""Assignment 5: verify a token tree, the multi-draft rejection step (README.md here;
instructor.md: the notes)."""

import torch

from ..definition import Assignment, Check, Failed, as_floats
from ..probing import function, load, lossless_reference, random_distributions, seeded
from ..rejection_sampling import _named

MULTI = "spec_decoding.rejection.multi_draft_rejection_sampling"
RESIDUAL = "spec_decoding.rejection.residual_distribution"
VOCAB, ROUNDS = 6, 4000
HINT = ("try the children in turn: accept x_i with probability min(1, r(x_i)/q(x_i)), r starting at p and "
        "becoming norm(max(0, r - q)) after each rejection; if all are rejected draw from the final r")


def node_inputs(seed, children=3):
    return {"p_seed": 800 + seed, "q_seed": 900 + seed, "children": children, "rounds": ROUNDS, "seed": 1000 + seed}


def node_tables(inputs):
    return (random_distributions(inputs["p_seed"], 1, VOCAB)[0].float(),
            random_distributions(inputs["q_seed"], 1, VOCAB, sharpness=1.0)[0].float())


def node_probe(inputs, data):
    """Run the student's step at one node `rounds` times, children drawn independently from q;
    count the token it outputs and which child (or none) was accepted."""
    step = function(MULTI)
    p, q = node_tables(inputs)
    g, b = seeded(inputs["seed"]), inputs["children"]
    out, which = [0] * VOCAB, [0] * (b + 1)
    for _ in range(inputs["rounds"]):
        children = torch.multinomial(q, b, replacement=True, generator=g).tolist()
        verdict = step(p, q, children, g)
        accepted, token = verdict.accepted, verdict.next_token
        if accepted is not None:
            if not (isinstance(accepted, int) and 0 <= accepted < b) or token is not None:
                raise TypeError(f"the verdict says child {accepted!r} was accepted and next_token={token!r}: an "
                                f"accepted child is an index in 0..{b - 1}, and next_token is None then")
            out[children[accepted]] += 1
            which[accepted] += 1
        else:
            if token is None or not 0 <= int(token) < VOCAB:
                raise TypeError(f"every child was rejected but next_token={token!r}: draw it from the residual")
            out[int(token)] += 1
            which[b] += 1
    return {"out": out, "which": which}


def node_reference(inputs, data):
    """The exact output (p), the chance that every child is rejected, and what the classic
    mistakes give, computed with the instructor's residual."""
    residual = function(RESIDUAL)
    p, q = (t.double() for t in node_tables(inputs))
    b = inputs["children"]
    r, all_rejected = p, 1.0
    for _ in range(b):
        all_rejected *= 1 - torch.minimum(r, q).sum().item()
        r = residual(r, q)
    beta = torch.minimum(p, q).sum()
    naive = sum((1 - beta) ** i for i in range(b)) * torch.minimum(p, q) + (1 - beta) ** b * residual(p, q)
    return {"p": as_floats(p), "all_rejected": all_rejected, "mistakes": {
        "every child is tested against the unchanged p: after a rejection the target must become "
        "norm(max(0, r - q)) (a token the draft likes otherwise gets b chances)": as_floats(naive),
        "the first child is always accepted (the draft's q comes out)": as_floats(q)}}


def output_judge(inputs, ref, got):
    _named(got["out"], ref["p"], ref["mistakes"],
           f"the token a node outputs ({inputs['children']} children) does not follow p", hint=HINT)


def rejected_judge(inputs, ref, got):
    rounds, expected = sum(got["which"]), ref["all_rejected"]
    rate = got["which"][-1] / rounds
    sd = (expected * (1 - expected) / rounds) ** 0.5
    if abs(rate - expected) > 5 * sd + 1e-9:
        raise Failed(f"all {inputs['children']} children were rejected {rate:.3f} of the time; SpecInfer's rule gives "
                     f"{expected:.3f} (child i is accepted with min(1, r(x)/q(x)), r updated after each rejection)")


def lossless_inputs(seed):
    return {"prompt": [1, 2, 3], "n_tokens": 3, "samples": 500, "branching": [2, 2], "seed": seed}


def lossless_probe(inputs, data):
    from spec_decoding import tree_speculative_sampling
    from spec_decoding.checks import counts_of

    target, draft, g = load(data, "vocab_target"), load(data, "vocab_draft"), seeded(inputs["seed"])
    samples = [tree_speculative_sampling(target, draft, inputs["prompt"], inputs["n_tokens"], tuple(inputs["branching"]),
                                         temperature=1.0, generator=g).tokens for _ in range(inputs["samples"])]
    return counts_of(samples, target.config.vocab_size, inputs["n_tokens"]).tolist()


def lossless_judge(inputs, ref, got):
    _named(got, ref, {}, f"token-tree sampling (branching {inputs['branching']}) with your step: "
                         f"{inputs['samples']} samples of {inputs['n_tokens']} tokens do not follow the target's "
                         f"exactly enumerated distribution", hint=HINT)


ASSIGNMENT = Assignment(
    name="tree_verify",
    functions=(MULTI,),
    # The chain's step is this step's building block (one child, target r): it would answer it.
    removed=("spec_decoding.rejection.modified_rejection_sampling",),
    # Notebook 05 proves the rule and tests a naive variant next to it.
    dropped=("notebooks/05_token_trees.*",),
    readme="assignments/tree_verify/README.md",
    checks=(
        Check("multi_draft_output", (MULTI,), node_inputs, node_probe, output_judge, points=3,
              reference=node_reference, about="3 children: the node's token follows p (chi-square)"),
        Check("multi_draft_one_child", (MULTI,), lambda seed: node_inputs(seed, children=1), node_probe,
              output_judge, reference=node_reference),
        Check("multi_draft_all_rejected", (MULTI,), lambda seed: node_inputs(seed, children=4), node_probe,
              rejected_judge, visible=False, reference=node_reference),
        Check("tree_lossless", (MULTI,), lossless_inputs, lossless_probe, lossless_judge, points=2, visible=False,
              reference=lossless_reference, timeout=120),
    ),
)
