"""Assignment 2: greedy speculative decoding (README.md here; instructor.md: the notes)."""

import torch

from ..definition import Assignment, Check, Failed, as_floats
from ..probing import PROMPT, counting_forwards, first_difference, function, load, max_difference, tokens_of

GREEDY = "spec_decoding.greedy.speculative_sampling_greedy"


def _generate(data, draft_name, prompt, max_gen, gamma, **kwargs):
    target = load(data, "target")
    draft = load(data, draft_name)  # a separate instance even when it is the target's checkpoint
    return function(GREEDY)(target, draft, prompt, max_gen, gamma, **kwargs)


def target_greedy(prompt, max_gen, data, eos_id=None):
    """The reference: the target's own greedy output (plain decoding, the instructor's code)."""
    from spec_decoding import autoregressive_generate

    return autoregressive_generate(load(data, "target"), prompt, max_gen, eos_id=eos_id).tokens


# ---- the output is the target's greedy output ------------------------------------------------------

def equals_inputs(seed):
    return {"prompt": PROMPT[seed % 3:], "max_gen": 30, "gammas": [1, 3, 5] if seed == 0 else [2, 4, 6]}


def equals_probe(inputs, data, draft="draft"):
    """The output for each gamma, and where each token came from (on_tokens' sources)."""
    out = []
    for gamma in inputs["gammas"]:
        sources = []
        result = _generate(data, draft, inputs["prompt"], inputs["max_gen"], gamma,
                           on_tokens=lambda tokens, where: sources.extend(str(s) for s in where))
        out.append({"tokens": tokens_of(result), "sources": sources})
    return out


def equals_reference(inputs, data):
    return target_greedy(inputs["prompt"], inputs["max_gen"], data)


def equals_judge(inputs, ref, got, what="with a draft that mostly agrees"):
    for gamma, run in zip(inputs["gammas"], got):
        problem = first_difference(run["tokens"], ref)
        if problem:
            i = next((i for i, (a, b) in enumerate(zip(run["tokens"], ref)) if a != b), None)
            source = run["sources"][i] if i is not None and i < len(run["sources"]) else None
            why = {"draft": " (a draft token the target's argmax disagrees with was kept: keep draft tokens "
                            "only while each equals the target's argmax after the tokens before it)",
                   "correction": " (the target's own token is wrong: after n accepted draft tokens it is the "
                                 "argmax of row n of the target's logits)",
                   "bonus": " (the bonus token is wrong: after all draft tokens are accepted it is the argmax "
                            "of the target's last row)"}.get(source, "")
            raise Failed(f"gamma={gamma}, {what}: the output {problem}{why}")


def unrelated_probe(inputs, data):
    return equals_probe(inputs, data, draft="unrelated")


def unrelated_judge(inputs, ref, got):
    equals_judge(inputs, ref, got, "with an unrelated draft (nearly every draft token rejected)")


# ---- speculation happened ---------------------------------------------------------------------------

def speculates_inputs(seed):
    return {"prompt": PROMPT[seed % 3:], "max_gen": 30, "gamma": 4 + seed}


def speculates_probe(inputs, data):
    """With the draft a copy of the target every draft token is accepted: count the target's
    forward passes and the draft's."""
    target, draft = load(data, "target"), load(data, "target")
    with counting_forwards(target) as target_calls, counting_forwards(draft) as draft_calls:
        result = function(GREEDY)(target, draft, inputs["prompt"], inputs["max_gen"], inputs["gamma"])
    return {"tokens": tokens_of(result), "target_calls": target_calls[0], "draft_calls": draft_calls[0]}


def speculates_reference(inputs, data):
    return target_greedy(inputs["prompt"], inputs["max_gen"], data)


def speculates_judge(inputs, ref, got):
    gamma, max_gen = inputs["gamma"], inputs["max_gen"]
    problem = first_difference(got["tokens"], ref)
    if problem:
        raise Failed(f"gamma={gamma}, with draft == target: the output {problem}")
    rounds = -(-max_gen // (gamma + 1))  # every round gives gamma + 1 tokens
    allowed = rounds + 2  # the prompt's forward, and a little slack
    if got["target_calls"] > allowed:
        raise Failed(f"the target ran {got['target_calls']} forward passes for {max_gen} tokens with a draft "
                     f"identical to it (gamma={gamma}): every draft token should be accepted, so a speculative "
                     f"loop needs about max_gen / (gamma + 1) = {rounds} rounds of ONE target forward each "
                     f"(plus the prompt's). Is the draft used, and are all its tokens scored in one forward?")
    if got["draft_calls"] == 0:
        raise Failed("the draft model was never run: the drafter must propose the tokens the target checks")


# ---- caches after every round -----------------------------------------------------------------------

def caches_inputs(seed):
    return {"prompt": PROMPT[seed % 3:], "max_gen": 24, "gamma": 3}


def _key_digest(keys: torch.Tensor) -> list[float]:
    """One number per position from the last layer's keys [1, n_head, L, head_dim]."""
    weights = torch.linspace(0.5, 1.5, keys.shape[1] * keys.shape[3]).view(1, keys.shape[1], 1, keys.shape[3])
    return as_floats((keys.float() * weights).sum(dim=(0, 1, 3)))


def caches_probe(inputs, data):
    """Before every forward that reuses a cache, and at the end: the cache's length and its last
    layer's keys, for the target and the draft model. Each must hold what a fresh forward over
    the accepted tokens gives."""
    models = {"target": load(data, "target"), "draft": load(data, "draft")}
    seen, snapshots = {}, {"target": [], "draft": []}

    def snapshot(role, cache):
        snapshots[role].append({"length": cache.length,
                                "digest": _key_digest(cache.keys[-1][:, :, :cache.length])})

    def watch(role):
        def before_forward(module, args):
            if len(args) > 1 and args[1] is not None:
                seen[role] = args[1]
                if args[1].length > 0:
                    snapshot(role, args[1])
        models[role].register_forward_pre_hook(before_forward)

    watch("target")
    watch("draft")
    result = function(GREEDY)(models["target"], models["draft"], inputs["prompt"], inputs["max_gen"], inputs["gamma"])
    for role, cache in seen.items():
        snapshot(role, cache)
    return {"tokens": tokens_of(result), "snapshots": snapshots}


def caches_reference(inputs, data):
    tokens = target_greedy(inputs["prompt"], inputs["max_gen"], data)
    digests = {}
    for role in ("target", "draft"):
        model = load(data, role)
        cache = model.new_kv_cache()
        with torch.inference_mode():
            model(torch.tensor([inputs["prompt"] + tokens]), cache)
        digests[role] = _key_digest(cache.keys[-1][:, :, :cache.length])
    return {"tokens": tokens, "digests": digests}


def caches_judge(inputs, ref, got):
    mine, want = inputs["prompt"] + got["tokens"], inputs["prompt"] + ref["tokens"]
    agree = next((i for i, (a, b) in enumerate(zip(mine, want)) if a != b), min(len(mine), len(want)))
    if not got["snapshots"]["target"]:
        raise Failed("the target never ran a forward on a cache it had filled before: reuse its KV cache "
                     "across rounds (target_forward does), rolling it back after each round")
    for role in ("target", "draft"):
        for i, snap in enumerate(got["snapshots"][role]):
            length = min(snap["length"], agree)  # compare where the sequence is the reference's
            if max_difference(snap["digest"][:length], ref["digests"][role][:length]) > 1e-3:
                raise Failed(f"the {role}'s KV cache, at its forward number {i + 2}, does not hold what a fresh "
                             f"forward over the accepted tokens gives: rejected draft tokens are still in it. Roll "
                             f"back the target's cache AND the drafter after every round (roll_back does both; the "
                             f"bug zoo's 'cache not rolled back')")
    problem = first_difference(got["tokens"], ref["tokens"])
    if problem:
        raise Failed(f"the output {problem}")


# ---- stopping ---------------------------------------------------------------------------------------

def stopping_inputs(seed):
    return {"prompt": PROMPT[seed % 3:], "max_gens": [1, 2, 3, 5, 8], "gamma": 3, "eos_at": 6 + seed}


def stopping_probe(inputs, data):
    out = {"lengths": [], "eos": None}
    for max_gen in inputs["max_gens"]:
        out["lengths"].append(len(tokens_of(_generate(data, "draft", inputs["prompt"], max_gen, inputs["gamma"]))))
    eos_id = target_greedy(inputs["prompt"], 30, data)[inputs["eos_at"]]
    out["eos"] = tokens_of(_generate(data, "draft", inputs["prompt"], 30, inputs["gamma"], eos_id=eos_id))
    return out


def stopping_reference(inputs, data):
    tokens = target_greedy(inputs["prompt"], 30, data)
    eos_id = tokens[inputs["eos_at"]]
    return {"lengths": inputs["max_gens"], "eos": tokens[:tokens.index(eos_id) + 1], "eos_id": eos_id}


def stopping_judge(inputs, ref, got):
    for max_gen, n in zip(inputs["max_gens"], got["lengths"]):
        if n != max_gen:
            raise Failed(f"with max_gen={max_gen} the output has {n} tokens"
                         + (" (the bug zoo's 'bonus token past max_gen': a round never drafts more tokens "
                            "than are left; round_gamma does it)" if n > max_gen else ""))
    if got["eos"] != ref["eos"]:
        after = len(got["eos"]) > len(ref["eos"]) and got["eos"][:len(ref["eos"])] == ref["eos"]
        raise Failed(f"with eos_id={ref['eos_id']} the output is {got['eos']}, expected {ref['eos']}"
                     + (" (the bug zoo's 'tokens after eos': stop at the first eos, keep it, drop the rest "
                        "of the round; take_tokens does it)" if after else ""))


ASSIGNMENT = Assignment(
    name="greedy_speculative",
    functions=(GREEDY,),
    # Siblings that would do the work if called: the sampling loop (at a tiny temperature it is
    # greedy), the token tree (a chain of 1-wide levels is this loop), the tree's greedy verify.
    removed=("spec_decoding.speculative.speculative_sampling", "spec_decoding.tree.tree_speculative_sampling",
             "spec_decoding.tree.verify_tree_greedy"),
    dropped=("notebooks/02_parallel_verification.*",),
    readme="assignments/greedy_speculative/README.md",
    checks=(
        Check("greedy_equals_target", (GREEDY,), equals_inputs, equals_probe, equals_judge, points=2,
              reference=equals_reference),
        Check("greedy_speculates", (GREEDY,), speculates_inputs, speculates_probe, speculates_judge, points=2,
              reference=speculates_reference, about="draft == target: all accepted, ~max_gen/(gamma+1) target calls"),
        Check("greedy_unrelated_draft", (GREEDY,), equals_inputs, unrelated_probe, unrelated_judge,
              visible=False, reference=equals_reference),
        Check("greedy_caches", (GREEDY,), caches_inputs, caches_probe, caches_judge, visible=False,
              reference=caches_reference),
        Check("greedy_stopping", (GREEDY,), stopping_inputs, stopping_probe, stopping_judge, points=2,
              reference=stopping_reference),
    ),
)
