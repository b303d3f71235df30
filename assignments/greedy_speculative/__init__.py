"""Assignment 2: greedy speculative decoding (README.md here; instructor.md: the notes)."""

import torch

from ..definition import Assignment, Check, Failed, as_floats
from ..forms import Int, List, Real, Record, Text, Tokens, Tuple
from ..probing import (PROMPT, counting_forwards, first_difference, function, load, max_difference, tokens_of,
                       whole_number)
from ..serving import TargetServer, ask, secret_target, served_model

GREEDY = "spec_decoding.algorithms.greedy.speculative_sampling_greedy"
VOCAB = 100  # the served target's (references.make_data)


# ---- the served target ------------------------------------------------------------------------------
# Every check here runs the student's loop on a target served by the grader (assignments/serving.py):
# a target whose later blocks are re-drawn from a secret seed, so the child can neither compute
# its logits itself nor count its forwards; the grader counts them. The draft (data/draft) shares
# the target's first blocks, so it agrees with it most of the time.

def served_reference(inputs, data, runs: list[dict], draft="draft", secret: int | None = None,
                     count_forwards: bool = True, needs_a_rejection: bool = False,
                     beats_plain: bool = False) -> dict:
    """The grader's: a secret (fresh unless given), the served target's own greedy output for each
    run ({"prompt", "max_gen", "gamma", "eos_id"?}) and (count_forwards) the target forwards the
    instructor's speculative loop takes for all of them (counted here, on the model itself).
    draft: a checkpoint of the data folder, or a function making a fresh drafter for each run.

    A fresh secret is drawn again until the check can see the mistakes it is for:
    needs_a_rejection: until the instructor's loop, in some run, rejects a draft token in a round
    that another round follows. A loop that keeps every draft token runs exactly as the
    instructor's until the first rejection, and a loop that never rolls its caches back feeds
    stale tokens only in the round after one: under a secret with which the draft agrees all the
    way (for some prompts one grading in four) both would pass.
    beats_plain: until plain decoding (one forward a token) is over allowed_forwards: under a secret
    where drafting saves few forwards (one in eight for the n-gram drafter) it would pass."""
    import secrets

    from spec_decoding import autoregressive_generate
    from spec_decoding.algorithms.greedy import speculative_sampling_greedy
    from spec_decoding.result import FROM_CORRECTION

    for _ in range(SECRET_TRIES):
        chosen = secrets.randbits(62) if secret is None else secret
        target = secret_target(data, chosen)
        tokens, forwards, rejected = [], 0, 0
        for run in runs:
            tokens.append(autoregressive_generate(target, run["prompt"], run["max_gen"], eos_id=run.get("eos_id")).tokens)
            if not (count_forwards or needs_a_rejection or beats_plain):
                continue
            drafter = load(data, draft) if isinstance(draft, str) else draft()
            with counting_forwards(target) as calls:
                result = speculative_sampling_greedy(target, drafter, run["prompt"], run["max_gen"], run["gamma"],
                                                     eos_id=run.get("eos_id"))
            forwards += calls[0]
            rejected += FROM_CORRECTION in result.stats.token_sources[:-1]  # a round came after it
        reference = {"secret": chosen, "tokens": tokens, "forwards": forwards, "runs": len(runs)}
        if secret is not None or ((rejected or not needs_a_rejection) and
                                  (not beats_plain or allowed_forwards(reference) < sum(map(len, tokens)))):
            return reference
    raise RuntimeError(f"no secret target in {SECRET_TRIES} let these runs show a mistake (a draft token rejected "
                       f"before the last round: {needs_a_rejection}; plain decoding over the allowance: "
                       f"{beats_plain}): {runs}")


# served_reference draws at most this many secrets (for the inputs here, each fails to serve with odds
# between a few in a thousand and one in two)
SECRET_TRIES = 40


def serve_target(inputs, reference, data):
    """What the grader serves these checks: the secret target (and, for the stopping check, the
    eos token, which only the secret target's output decides)."""
    return TargetServer(secret_target(data, reference["secret"]), facts={"eos_id": reference.get("eos_id")})


def allowed_forwards(reference) -> int:
    """Target forwards a speculative loop may take: the instructor's, one more per generation (an
    honest loop may run the prompt on its own first) and a quarter more (other round structures).
    Plain decoding takes one per token: far more with this draft."""
    return reference["forwards"] + reference["runs"] + reference["forwards"] // 4


def check_speculated(reference, served, what: str, hidden: bool) -> None:
    forwards = served.get("forwards", 0)
    if forwards <= allowed_forwards(reference):
        return
    about = "far more than a speculative loop needs with this draft" if hidden else (
        f"a speculative loop needs about {reference['forwards']} with this draft")
    raise Failed(f"{what}: the output is the target's, but the target ran {forwards} forward passes; {about}. "
                 f"Draft gamma tokens, then score them all in ONE target forward per round (plain decoding runs "
                 f"one forward per token)")


def _generate(target, data, draft_name, prompt, max_gen, gamma, **kwargs):
    draft = load(data, draft_name)
    return function(GREEDY)(target, draft, prompt, max_gen, gamma, **kwargs)


def plain_tokens(result) -> list[int]:
    return [whole_number(t, "a generated token") for t in tokens_of(result)]


def check_tokens(got, want, what: str, hidden: bool) -> None:
    """Failed if the output differs from the target's greedy output; a hidden check says where,
    never what was expected."""
    if not (isinstance(got, list) and all(type(t) is int for t in got)):
        raise Failed(f"{what}: the output is not a list of token ids")
    problem = first_difference(got, want)
    if problem and hidden:
        i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        problem = f"differs from the target's own greedy output from token {i} on ({len(got)} tokens)"
    if problem:
        raise Failed(f"{what}: the output {problem}")


# ---- the output is the target's greedy output ------------------------------------------------------

def prompt_of(seed: int) -> list[int]:
    """The visible inputs' prompt (seed 0), or the hidden inputs' (never the visible one). The
    served target is drawn afresh for every grade, so its outputs differ from grade to grade
    whatever the prompt. (Random prompts were tried: on some, the draft agrees with nearly every
    secret target, and no secret shows a rejected draft token.)"""
    return PROMPT if seed == 0 else PROMPT[1 + seed % 2:]


def equals_inputs(seed):
    return {"prompt": prompt_of(seed), "max_gen": 30, "gammas": [1, 3, 5] if seed == 0 else [2, 4, 6]}


def equals_runs(inputs):
    return [{"prompt": inputs["prompt"], "max_gen": inputs["max_gen"], "gamma": g} for g in inputs["gammas"]]


def equals_form(inputs, ref):
    """Per gamma: exactly the reference's number of tokens, and the sources on_tokens reported (any
    number: they only explain a wrong token)."""
    sources = List(Text(32), at_most=8 * inputs["max_gen"], what="sources")
    return Tuple(tuple(Record({"tokens": Tokens(len(want), VOCAB), "sources": sources}) for want in ref["tokens"]),
                 what="gammas")


def tokens_form(inputs, ref):
    return Tokens(len(ref["tokens"][0]), VOCAB)


def equals_probe(inputs, data, draft="draft"):
    """The output for each gamma, and where each token came from (on_tokens' sources: only to
    explain a wrong token)."""
    from spec_decoding import Observers

    target, out = served_model(data), []
    for gamma in inputs["gammas"]:
        sources = []
        result = _generate(target, data, draft, inputs["prompt"], inputs["max_gen"], gamma,
                           observers=Observers(on_tokens=lambda tokens, where: sources.extend(str(s) for s in where)))
        out.append({"tokens": plain_tokens(result), "sources": sources})
    return out


def equals_reference(inputs, data):
    return served_reference(inputs, data, equals_runs(inputs), needs_a_rejection=True)


def check_target_saw_the_prompt(inputs, served):
    """A cache not advanced: every forward the served target answered scores tokens after the
    prompt (its cache holds the sequence so far); one that saw none of it was called without the
    cache, or with a new, empty one."""
    prompt = inputs["prompt"]
    for tokens, last in served.get("requests", []):
        if tokens[:len(prompt)] != prompt:
            raise Failed(f"the target scored {last} token(s) after a sequence of {len(tokens) - last} that is not the "
                         f"prompt and the tokens accepted so far: its KV cache was not advanced (the target called "
                         f"without target_cache, or with a new one), so it never held the prompt. Feed each round's "
                         f"new tokens through target_cache (target_forward does: tokens[target_cache.length:] and "
                         f"the draft)")


def equals_judge(inputs, ref, got, served, what="with a draft that mostly agrees", hidden=False):
    check_target_saw_the_prompt(inputs, served)
    for gamma, run, want in zip(inputs["gammas"], got, ref["tokens"], strict=True):
        try:
            check_tokens(run["tokens"], want, f"gamma={gamma}, {what}", hidden)
        except Failed as failure:
            i = next((i for i, (a, b) in enumerate(zip(run["tokens"], want)) if a != b), None)
            source = run["sources"][i] if i is not None and i < len(run["sources"]) else None
            why = {"draft": " (a draft token the target's argmax disagrees with was kept: keep draft tokens "
                            "only while each equals the target's argmax after the tokens before it)",
                   "correction": " (the target's own token is wrong: after n accepted draft tokens it is the "
                                 "argmax of row n of the target's logits)",
                   "bonus": " (the bonus token is wrong: after all draft tokens are accepted it is the argmax "
                            "of the target's last row)"}.get(source, "")
            raise Failed(f"{failure}{why}") from None
    if not hidden:
        check_speculated(ref, served, f"gammas {inputs['gammas']}", hidden)


def unrelated_probe(inputs, data):
    return equals_probe(inputs, data, draft="unrelated")


def unrelated_reference(inputs, data):
    # the forwards are not judged here (see unrelated_judge): not counted
    return served_reference(inputs, data, equals_runs(inputs), "unrelated", count_forwards=False)


def unrelated_judge(inputs, ref, got, served):
    # nearly every draft token is rejected: a speculative loop runs about as many target forwards
    # as plain decoding, so only the output is judged
    equals_judge(inputs, ref, got, served, "with an unrelated draft (nearly every draft token rejected)", hidden=True)


# ---- speculation happened ---------------------------------------------------------------------------

def speculates_inputs(seed):
    return {"prompt": prompt_of(seed), "max_gen": 30, "gamma": 4 + seed % 3}


def speculates_probe(inputs, data):
    return plain_tokens(_generate(served_model(data), data, "draft", inputs["prompt"], inputs["max_gen"], inputs["gamma"]))


def speculates_reference(inputs, data):
    return served_reference(inputs, data, [inputs])


def speculates_judge(inputs, ref, got, served):
    check_tokens(got, ref["tokens"][0], f"gamma={inputs['gamma']}", hidden=False)
    check_speculated(ref, served, f"gamma={inputs['gamma']}, {inputs['max_gen']} tokens", hidden=False)


# ---- caches after every round -----------------------------------------------------------------------

def caches_inputs(seed):
    return {"prompt": prompt_of(seed), "max_gen": 24, "gamma": 3}


def _key_digest(keys: torch.Tensor) -> list[float]:
    """One number per position from the last layer's keys [1, n_head, L, head_dim]."""
    weights = torch.linspace(0.5, 1.5, keys.shape[1] * keys.shape[3]).view(1, keys.shape[1], 1, keys.shape[3])
    return as_floats((keys.float() * weights).sum(dim=(0, 1, 3)))


def caches_probe(inputs, data):
    """The output, and the draft model's cache at the start of every round (before a forward on a
    cache that was rolled back) and at the end: its length and its last layer's keys, which must
    be what a fresh forward over the accepted tokens gives. (Diagnostics only: the verdict rests
    on the grader's own counts. The target's cache is judged from what it was asked to score.)"""
    draft = load(data, "draft")
    seen, snapshots, end = {}, [], [0]

    def snapshot(cache):
        snapshots.append({"length": cache.length, "digest": _key_digest(cache.keys[-1][:, :, :cache.length])})

    def before_forward(module, args):
        if len(args) > 1 and args[1] is not None:
            seen["draft"] = args[1]
            if 0 < args[1].length < end[0]:  # rolled back since the last forward: a new round
                snapshot(args[1])
            end[0] = args[1].length + args[0].shape[1]
    draft.register_forward_pre_hook(before_forward)
    result = function(GREEDY)(served_model(data), draft, inputs["prompt"], inputs["max_gen"], inputs["gamma"])
    if "draft" in seen:
        snapshot(seen["draft"])
    return {"tokens": plain_tokens(result), "snapshots": snapshots}


def caches_reference(inputs, data):
    reference = served_reference(inputs, data, [inputs], needs_a_rejection=True)
    draft = load(data, "draft")
    cache = draft.new_kv_cache()
    with torch.inference_mode():
        draft(torch.tensor([inputs["prompt"] + reference["tokens"][0]]), cache)
    return reference | {"draft_digest": _key_digest(cache.keys[-1][:, :, :cache.length])}


def caches_form(inputs, ref):
    snapshot = Record({"length": Int(0, 1024), "digest": List(Real(), at_most=1024, what="positions")})
    return Record({"tokens": Tokens(len(ref["tokens"][0]), VOCAB),
                   "snapshots": List(snapshot, at_most=4 * inputs["max_gen"] + 4, what="snapshots")})


def caches_judge(inputs, ref, got, served):
    want = inputs["prompt"] + ref["tokens"][0]
    for tokens, last in served.get("requests", []):
        context = tokens[:len(tokens) - last + 1]  # what the first scored position follows
        if context != want[:len(context)]:
            raise Failed("the target was asked to score draft tokens after a sequence holding tokens that were "
                         "never accepted: its KV cache still held rejected draft tokens. Roll back the target's "
                         "cache AND the drafter after every round (roll_back does both; the bug zoo's 'cache "
                         "not rolled back')")
    mine = inputs["prompt"] + got["tokens"]
    agree = next((i for i, (a, b) in enumerate(zip(mine, want)) if a != b), min(len(mine), len(want)))
    for i, snap in enumerate(got["snapshots"]):
        length = min(snap["length"], agree)  # compare where the sequence is the reference's
        if max_difference(snap["digest"][:length], ref["draft_digest"][:length]) > 1e-3:
            raise Failed(f"the draft's KV cache, at the start of a round (snapshot {i + 1}), does not hold what a fresh forward "
                         f"over the accepted tokens gives: rejected draft tokens are still in it. Roll back the "
                         f"drafter after every round too (roll_back does both)")
    check_tokens(got["tokens"], ref["tokens"][0], f"gamma={inputs['gamma']}", hidden=True)
    check_speculated(ref, served, f"gamma={inputs['gamma']}", hidden=True)


# ---- stopping ---------------------------------------------------------------------------------------

def stopping_inputs(seed):
    return {"prompt": prompt_of(seed), "max_gens": [1, 2, 3, 5, 8], "gamma": 3, "eos_at": 6 + seed % 20}


def stopping_runs(inputs, eos_id=None):
    runs = [{"prompt": inputs["prompt"], "max_gen": m, "gamma": inputs["gamma"]} for m in inputs["max_gens"]]
    return runs + [{"prompt": inputs["prompt"], "max_gen": 30, "gamma": inputs["gamma"], "eos_id": eos_id}]


def stopping_probe(inputs, data):
    target = served_model(data)
    lengths = [len(plain_tokens(_generate(target, data, "draft", inputs["prompt"], m, inputs["gamma"])))
               for m in inputs["max_gens"]]
    eos_id = ask({"fact": "eos_id"})["value"]  # the served target's token at eos_at: only the grader knows it
    return {"lengths": lengths,
            "eos": plain_tokens(_generate(target, data, "draft", inputs["prompt"], 30, inputs["gamma"], eos_id=eos_id))}


def stopping_reference(inputs, data):
    """eos_id: the served target's greedy token at position eos_at (generation stops at its first
    occurrence, which may come earlier)."""
    import secrets

    from spec_decoding import autoregressive_generate

    secret = secrets.randbits(62)
    greedy = autoregressive_generate(secret_target(data, secret), inputs["prompt"], 30).tokens
    eos_id = greedy[inputs["eos_at"]]
    return served_reference(inputs, data, stopping_runs(inputs, eos_id), secret=secret) | {"eos_id": eos_id}


def stopping_form(inputs, ref):
    return Record({"lengths": List(Int(0, 10_000), len(inputs["max_gens"]), what="max_gens"),
                   "eos": Tokens(None, VOCAB, at_most=1024)})


def stopping_judge(inputs, ref, got, served):
    for max_gen, n in zip(inputs["max_gens"], got["lengths"], strict=True):
        if n != max_gen:
            raise Failed(f"with max_gen={max_gen} the output has {n} tokens"
                         + (" (the bug zoo's 'bonus token past max_gen': a round never drafts more tokens "
                            "than are left; round_gamma does it)" if n > max_gen else ""))
    want = ref["tokens"][-1]
    if got["eos"] != want:
        after = len(got["eos"]) > len(want) and got["eos"][:len(want)] == want
        raise Failed(f"with eos_id={ref['eos_id']} the output is {got['eos']}, expected {want}"
                     + (" (the bug zoo's 'tokens after eos': stop at the first eos, keep it, drop the rest "
                        "of the round; take_tokens does it)" if after else ""))
    check_speculated(ref, served, f"max_gen {inputs['max_gens']} and 30 with eos", hidden=False)


# What a run that crashed or hung usually means here (the messages name the mistake; the
# verdict is the same): the drafter or the target fed tokens its cache had already seen, a cache
# never fed, or a round that adds no token.
HINTS = (
    (r"idx has no tokens|idx must be a LongTensor .* got \(1, 0\)|IndexError: list index out of range",
     "the caches ran ahead of the accepted tokens: a forgotten roll_back(target_cache, drafter, "
     "len(tokens)) at the end of a round (step 4), so the next round found nothing new to feed, or "
     "fed tokens that were never accepted"),
    (r"truncate\(\d+\): length must be between 0 and the current length",
     "the target's KV cache was not advanced: the target was called without target_cache (or with a "
     "new one), so at the end of the round roll_back found it shorter than the accepted tokens. Feed "
     "each round's new tokens through target_cache (target_forward does: tokens[target_cache.length:] "
     "and the draft)"),
    (r"room for",
     "the caches ran ahead of the accepted tokens (a forgotten or misplaced roll_back), or a "
     "cache made too small for prompt + max_gen"),
    (r"did not finish within",
     "a round that adds no token loops forever: the target's own token (the correction, or the "
     "bonus when every draft token was kept) must be appended every round, also when gamma is 0"),
)


ASSIGNMENT = Assignment(
    name="greedy_speculative",
    functions=(GREEDY,),
    # Siblings that would do the work if called: the sampling loop (at a tiny temperature it is
    # greedy), the token tree (a chain of 1-wide levels is this loop), the tree's greedy verify.
    # And the batched loop, with its one-row greedy verdict (the accept rule word for word).
    removed=("spec_decoding.algorithms.speculative.speculative_sampling", "spec_decoding.algorithms.tree.tree_speculative_sampling",
             "spec_decoding.algorithms.tree.verify_tree_greedy", "spec_decoding.algorithms.batched.greedy_verdict",
             "spec_decoding.algorithms.batched.batched_speculative_sampling"),
    dropped=("notebooks/02_parallel_verification.*",),
    readme="assignments/greedy_speculative/README.md",
    # Every check runs on the grader's served target and (but for the unrelated draft, where a
    # speculative loop saves nothing) asks for a speculative number of target forwards: plain
    # decoding earns the unrelated-draft check, 1 of 8. The stopping check's short runs (max_gen 1
    # to 8, an early eos) leave plain decoding within the forward allowance now and then, so it is
    # worth 1 point and greedy_speculates 3: plain decoding still earns at most 2 of 8.
    checks=(
        Check("greedy_equals_target", (GREEDY,), equals_inputs, equals_probe, equals_judge, equals_form, points=2,
              reference=equals_reference, serve=serve_target, hints=HINTS),
        Check("greedy_speculates", (GREEDY,), speculates_inputs, speculates_probe, speculates_judge, tokens_form,
              points=3,
              reference=speculates_reference, serve=serve_target, hints=HINTS,
              about="the grader counts the target's forwards: about max_gen / (accepted + 1) of them, not max_gen"),
        Check("greedy_unrelated_draft", (GREEDY,), equals_inputs, unrelated_probe, unrelated_judge, equals_form,
              visible=False, reference=unrelated_reference, serve=serve_target, hints=HINTS),
        Check("greedy_caches", (GREEDY,), caches_inputs, caches_probe, caches_judge, caches_form, visible=False,
              reference=caches_reference, serve=serve_target, hints=HINTS),
        Check("greedy_stopping", (GREEDY,), stopping_inputs, stopping_probe, stopping_judge, stopping_form, points=1,
              reference=stopping_reference, serve=serve_target, hints=HINTS),
    ),
)
