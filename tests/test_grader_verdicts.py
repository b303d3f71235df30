"""The grader owns every verdict, and points reflect the idea.

- Shortcuts that skip a function's core idea (plain decoding, never accepting, always rejecting,
  a drafter that proposes nothing or repeats the last token) each score at most 25% of their
  assignment; honest alternative solutions (other random-number usage, other loop structures,
  NumPy numbers) score 100%. Both run through the real grader in
  test_assignments.test_ready_made_assignment (on its stripped copy, references and zygote:
  `grade_variants` below), the variants' texts are here.
- Attacks from the student's process: replacing json.dumps to substitute ideal values, plain
  decoding that clears the forward hooks once used to count target calls: neither earns more
  than a shortcut (the grader counts raw outcomes itself, and serves the target itself).
- Every seed 0..10,000 gives valid inputs to every check (the data builders, no student code),
  others are refused with a message; hidden checks print no expected values; the leak check
  finds a reference computation left in a copy.
"""

import ast
import importlib
import json
import textwrap
from pathlib import Path

import pytest

from assignments.definition import AssignmentError, Failed
from assignments.make import _tokens, find_leaks, reference_functions, resolve
from assignments.references import MAX_SEED, VISIBLE_SEED, failing_checks, make_data, references
from assignments.registry import ASSIGNMENTS
from assignments.serving import serve_here

ROOT = Path(__file__).resolve().parents[1]


def with_body(source: str, qualname: str, body: str) -> str:
    """The source with the function `qualname`'s body (after its docstring) replaced by `body`
    (written unindented; indented here to the function's body)."""
    from assignments.make import _definitions

    node = _definitions(ast.parse(source))[qualname]
    lines = source.splitlines(keepends=True)
    first = node.body[1] if ast.get_docstring(node) and len(node.body) > 1 else node.body[0]
    indent = " " * first.col_offset
    lines[first.lineno - 1:node.end_lineno] = [textwrap.indent(textwrap.dedent(body).strip("\n") + "\n", indent)]
    return "".join(lines)


# ------------------------------------------------------------------------------------------------
# The variants: {assignment: [(what, file, qualname, body)]}, each body replacing the reference's
# ------------------------------------------------------------------------------------------------

REJECTION = "spec_decoding/algorithms/rejection.py"
SHORTCUTS = {
    "rejection_sampling": [
        ("never accept, draw from p", REJECTION, "modified_rejection_sampling",
         "return Verdict(0, int(sample(target_probs[0], generator)), [], None)"),
        # the attack: a constant verdict, and json.dumps replaced in the child by one that
        # substitutes ideal values (counts of the exact law, or per-round outcomes that follow p)
        ("constant verdict, json.dumps replaced", REJECTION, "modified_rejection_sampling", """
            import json, torch as _torch
            if not getattr(json, "_forged", False):
                real = json.dumps
                def forged(obj, *args, **kwargs):
                    try:
                        from assignments.rejection_sampling import round_reference, tables
                        values = obj["values"]
                        if isinstance(values, list) and values and isinstance(values[0], list):
                            p = tables({"p_seed": 500, "draft": "random", "q_seed": 600})[0]
                            draws = _torch.multinomial(p[0].float(), len(values), replacement=True)
                            obj = {"values": [[0, int(t)] for t in draws]}
                        obj = {"values": round_reference(None, None)}  # stripped: raises
                    except Exception:
                        pass
                    return real(obj, *args, **kwargs)
                json.dumps, json._forged = forged, True
            return Verdict(0, 0, [], None)
         """),
    ],
    "tree_verify": [
        ("always reject, draw from p", REJECTION, "multi_draft_rejection_sampling",
         "return MultiDraftVerdict(None, int(sample(target_probs, generator)), [], [], target_probs)"),
    ],
    "greedy_speculative": [
        ("plain decoding", "spec_decoding/algorithms/greedy.py", "speculative_sampling_greedy", """
            from .autoregressive import autoregressive_generate
            return autoregressive_generate(target, prefix, max_gen, eos_id=eos_id, observers=observers)
         """),
        # the attack: plain decoding that removes the forward hooks the old check counted with
        ("plain decoding that clears the forward hooks", "spec_decoding/algorithms/greedy.py", "speculative_sampling_greedy", """
            from .autoregressive import autoregressive_generate
            for model in (target, draft):
                model._forward_pre_hooks.clear()
                model._forward_hooks.clear()
            return autoregressive_generate(target, prefix, max_gen, eos_id=eos_id, observers=observers)
         """),
    ],
    "ngram_drafter": [
        ("proposes nothing", "spec_decoding/drafters/drafter.py", "NGramDrafter.propose", "return [], None"),
        ("repeats the last token", "spec_decoding/drafters/drafter.py", "NGramDrafter.propose", """
            if self.num_tokens is not None:
                num_tokens = min(num_tokens, self.num_tokens)
            return [tokens[-1]] * num_tokens, None
         """),
    ],
}

HONEST = {
    "rejection_sampling": [
        ("all uniforms drawn first, divisions, multinomial", REJECTION, [("modified_rejection_sampling", """
            g = len(draft_tokens)
            uniforms = torch.rand(g, generator=generator).tolist() if g else []
            for i, x in enumerate(draft_tokens):
                if uniforms[i] < min(1.0, float(target_probs[i, x] / draft_probs[i, x])):
                    continue
                residual = residual_distribution(target_probs[i], draft_probs[i])
                return Verdict(i, int(torch.multinomial(residual, 1, generator=generator)), uniforms[:i + 1], residual)
            return Verdict(g, int(torch.multinomial(target_probs[g], 1, generator=generator)), uniforms, None)
         """), ("residual_distribution", """
            difference = torch.where(target_probs > draft_probs, target_probs - draft_probs,
                                     torch.zeros_like(target_probs))
            if float(difference.sum()) <= 0:
                return target_probs
            return difference / difference.sum()
         """)]),
        ("Bernoulli draws, inverse-CDF sampling", REJECTION, [("modified_rejection_sampling", """
            def draw(probs):
                u = torch.rand((), generator=generator, dtype=torch.float64)
                cdf = torch.cumsum(probs.double(), 0)
                return min(int(torch.searchsorted(cdf, u * cdf[-1], right=True)), len(probs) - 1)
            for i, x in enumerate(draft_tokens):
                ratio = torch.clamp(target_probs[i, x] / draft_probs[i, x], max=1.0)
                if not bool(torch.bernoulli(ratio, generator=generator)):
                    residual = residual_distribution(target_probs[i], draft_probs[i])
                    return Verdict(i, draw(residual), [], residual)
            return Verdict(len(draft_tokens), draw(target_probs[len(draft_tokens)]), [], None)
         """)]),
    ],
    "tree_verify": [
        ("uniforms first, a while loop", REJECTION, [("multi_draft_rejection_sampling", """
            uniforms = torch.rand(len(draft_tokens), generator=generator).tolist()
            r, i = target_probs.clone(), 0
            while i < len(draft_tokens):
                x = draft_tokens[i]
                if uniforms[i] <= float(r[x] / draft_probs[x]):
                    return MultiDraftVerdict(i, None, uniforms[:i + 1], [], r)
                left = torch.clamp(r - draft_probs, min=0)
                r = left / left.sum() if float(left.sum()) > 0 else r
                i += 1
            return MultiDraftVerdict(None, int(torch.multinomial(r, 1, generator=generator)), uniforms, [], r)
         """)]),
    ],
    "greedy_speculative": [
        ("its own loop on the model API: no helpers, prompt and draft in one first forward",
         "spec_decoding/algorithms/greedy.py", [("speculative_sampling_greedy", """
            tokens, out = [int(t) for t in prefix], []
            target_cache, draft_cache = target.new_kv_cache(), draft.new_kv_cache()
            while len(out) < max_gen:
                g = max(0, min(gamma, max_gen - len(out) - 1, target.config.n_positions - len(tokens) - 1))
                proposal = []
                for _ in range(g):
                    seen = (tokens + proposal)[draft_cache.length:]
                    proposal.append(int(draft(torch.tensor([seen]), draft_cache)[0, -1].argmax()))
                scored = target(torch.tensor([(tokens + proposal)[target_cache.length:]]), target_cache)[0, -(g + 1):]
                choice = scored.argmax(-1).tolist()
                n = 0
                while n < g and proposal[n] == choice[n]:
                    n += 1
                new = proposal[:n] + [choice[n]]
                if eos_id in new:
                    new = new[:new.index(eos_id) + 1]
                if observers and observers.on_tokens:
                    observers.on_tokens(new, ["draft"] * n + ["bonus" if n == g else "correction"])
                tokens += new
                out += new
                target_cache.truncate(min(target_cache.length, len(tokens) - 1))
                draft_cache.truncate(min(draft_cache.length, len(tokens) - 1))
                if eos_id in new:
                    break
            return out[:max_gen]
         """)]),
    ],
    "ngram_drafter": [
        ("a table of every n-gram's last position", "spec_decoding/drafters/drafter.py", [("NGramDrafter.propose", """
            limit = num_tokens if self.num_tokens is None else min(num_tokens, self.num_tokens)
            for n in range(min(self.max_ngram, len(tokens) - 1), 0, -1):
                last_seen = {}
                for start in range(len(tokens) - n):  # every n-gram but the suffix itself
                    last_seen[tuple(tokens[start:start + n])] = start
                start = last_seen.get(tuple(tokens[-n:]))
                if start is not None and limit > 0:
                    return list(tokens[start + n:start + n + limit]), None
            return [], None
         """)]),
    ],
    "gamma_cost_model": [
        ("NumPy numbers everywhere", "spec_decoding/policies/theory.py", [("best_gamma", """
            import numpy as np
            gammas = np.array(list(gammas))
            costs = np.array([1.0 if verify_cost is None else verify_cost(int(g)) for g in gammas])
            speedups = np.array([predicted_speedup(alpha, int(g), c, float(k)) for g, k in zip(gammas, costs)])
            return gammas[int(np.argmax(speedups))]  # a NumPy integer
         """), ("expected_tokens_by_position", """
            import numpy as np
            return np.float64(1.0) + np.cumprod(np.asarray(alphas, dtype=np.float64)).sum()
         """)]),
    ],
}


# ------------------------------------------------------------------------------------------------
# Attacks on what the code sends back: each scores 0
# ------------------------------------------------------------------------------------------------

# Appended to a student's file: the child's json.dumps sends every list as [] (the judges once
# compared with zip(got, ref), which stops at the shorter list: 10/10 on gamma_cost_model).
EMPTIED_JSON = """

import json as _json  # the attack: every list sent back becomes []
_real_dumps = _json.dumps


def _emptied(value):
    if isinstance(value, list):
        return []
    if isinstance(value, dict):
        return {key: _emptied(item) for key, item in value.items()}
    return value


_json.dumps = lambda value, *args, **kwargs: _real_dumps(_emptied(value), *args, **kwargs)
"""
# {assignment: (file the json attack goes into, [(file, qualname, body)]: functions returning constants)}
EMPTY_LISTS = {
    "gamma_cost_model": ("spec_decoding/policies/theory.py", [
        ("spec_decoding/policies/theory.py", "expected_tokens_per_round", "return 1.0"),
        ("spec_decoding/policies/theory.py", "predicted_speedup", "return 1.0"),
        ("spec_decoding/policies/theory.py", "best_gamma", "return 1"),
        ("spec_decoding/policies/theory.py", "expected_tokens_by_position", "return 1.0"),
        ("spec_decoding/policies/costs.py", "CostModel.round_seconds", "return 1.0")]),
    "ngram_drafter": ("spec_decoding/drafters/drafter.py", [("spec_decoding/drafters/drafter.py", "NGramDrafter.propose",
                                                      "return [], None")]),
    # a "loop" that never calls the target
    "greedy_speculative": ("spec_decoding/algorithms/greedy.py", [("spec_decoding/algorithms/greedy.py", "speculative_sampling_greedy",
                                                        "return []")]),
}
# kv_cache: tensors of the right shape, all NaN (|NaN - x| > tolerance is False: NaN once passed)
NAN_TENSORS = [
    ("gpt2/kv_cache.py", "KVCache.update", """
        shape = (k.shape[0], k.shape[1], self.length + k.shape[2], k.shape[3])
        return torch.full(shape, float("nan")), torch.full(shape, float("nan"))"""),
    ("gpt2/kv_cache.py", "KVCache.truncate", 'self.length = float("nan")'),
    ("gpt2/model.py", "CausalSelfAttention.forward", 'return torch.full_like(x, float("nan"))'),
]

# A lookup table of the visible answers: each function replaced by one that answers from what the
# instructor's code returned on the visible inputs (shipped with every copy), and raises otherwise.
LOOKUP = """

def _lookup_key(values):
    import torch

    if isinstance(values, torch.Tensor):
        return ("tensor", tuple(values.shape), tuple(round(float(x), 4) for x in values.detach().reshape(-1).tolist()))
    if isinstance(values, (list, tuple, range)):
        return tuple(_lookup_key(v) for v in values)
    if isinstance(values, (int, float, str, bool)) or values is None:
        return values
    return type(values).__name__  # a model, a cache, a callable: by its kind


def _lookup_answer(qualname, arguments):
    import base64
    import pickle

    table = pickle.loads(base64.b64decode(_LOOKUP_TABLE))
    me = arguments.pop("self", None)
    entry = table.get((qualname, _lookup_key(list(arguments.values()))))
    if entry is None:
        raise KeyError(f"{qualname}: not in my table of the visible answers")
    kind, value, length = entry
    if length is not None:
        me.length = length
    if kind == "raise":
        raise ValueError(value)
    return value
"""
LOOKUP_ASSIGNMENTS = ("gamma_cost_model", "ngram_drafter", "kv_cache")


def lookup_table_texts(kit, visible_refs) -> dict:
    """The reference files with every function of the assignment answering from a table recorded
    here: the visible checks' probes run on the instructor's code, on the visible inputs."""
    import base64
    import inspect
    import pickle

    import torch

    from assignments.serving import serve_here

    helpers = {}
    exec(LOOKUP, helpers)
    table, originals = {}, {}

    def detached(value):
        if isinstance(value, torch.Tensor):
            return value.detach().clone()
        return type(value)(detached(v) for v in value) if isinstance(value, tuple) else value

    def recording(qualname, original):
        signature = inspect.signature(original)

        def wrapper(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = dict(bound.arguments)
            me = arguments.pop("self", None)
            key = (qualname, helpers["_lookup_key"](list(arguments.values())))
            try:
                value = original(*args, **kwargs)
            except ValueError as error:
                table[key] = ("raise", str(error), getattr(me, "length", None))
                raise
            length = getattr(me, "length", None)
            table[key] = ("return", detached(value), length if type(length) is int else None)
            return value
        return wrapper

    for dotted in kit.assignment.functions:
        attribute = dotted.rsplit(".", 1)[1]
        target = resolve(dotted)
        module = importlib.import_module(target.file[:-3].replace("/", "."))
        owner = module
        for part in target.qualname.split(".")[:-1]:
            owner = getattr(owner, part)
        originals[(owner, attribute)] = getattr(owner, attribute)
        setattr(owner, attribute, recording(target.qualname, originals[(owner, attribute)]))
    try:
        for check in kit.assignment.checks:
            if check.name in visible_refs:
                entry = visible_refs[check.name]
                server = check.serve(entry["inputs"], entry["reference"], kit.data) if check.serve else None
                serve_here(server)
                try:
                    with torch.inference_mode():
                        check.probe(entry["inputs"], kit.data)
                finally:
                    serve_here(None)
    finally:
        for (owner, attribute), original in originals.items():
            setattr(owner, attribute, original)
    encoded = base64.b64encode(pickle.dumps(table)).decode()
    texts = kit.reference()
    for dotted in kit.assignment.functions:
        target = resolve(dotted)
        texts[target.file] = with_body(texts[target.file], target.qualname,
                                       f"return _lookup_answer({target.qualname!r}, dict(locals()))")
    for file in {resolve(dotted).file for dotted in kit.assignment.functions}:
        texts[file] += LOOKUP + f"\n_LOOKUP_TABLE = {encoded!r}\n"
    return texts


def attacks_score_nothing(kit) -> None:
    """Run on test_assignments' kit: the issue's attacks on what the code sends back each score 0
    in the official grade (hidden inputs): every list sent back emptied with constant functions;
    NaN tensors of the right shape; a lookup table of the visible answers, which (the control)
    does pass the visible checks on the visible inputs, as the student's own `check` runs them."""
    from assignments.references import VISIBLE_SEED, references

    name = kit.assignment.name
    if name in EMPTY_LISTS:
        json_file, bodies = EMPTY_LISTS[name]
        texts = kit.reference()
        for file, qualname, body in bodies:
            texts[file] = with_body(texts[file], qualname, body)
        texts[json_file] += EMPTIED_JSON
        report = kit.grade(texts)
        assert report.points == 0, (name, "empty lists", [(r.check, r.message) for r in report.results if r.passed])
    if name == "kv_cache":
        texts = kit.reference()
        for file, qualname, body in NAN_TENSORS:
            texts[file] = with_body(texts[file], qualname, body)
        report = kit.grade(texts)
        assert report.points == 0, [(r.check, r.message) for r in report.results if r.passed]
        assert any("nan is not a finite number" in r.message for r in report.results), report.results
    if name in LOOKUP_ASSIGNMENTS:
        visible = [c for c in kit.assignment.checks if c.visible]
        visible_refs = references(kit.assignment, kit.data, VISIBLE_SEED, visible)
        texts = lookup_table_texts(kit, visible_refs)
        control = kit.grade(texts, refs=visible_refs)
        assert control.points == sum(c.points for c in visible), (name, [(r.check, r.message) for r in control.results])
        report = kit.grade(texts)
        assert report.points == 0, (name, "lookup table", [(r.check, r.message) for r in report.results if r.passed])


def shortcut_texts(kit, file, qualname, body) -> dict:
    """The reference solution with one function replaced (its siblings stay right: the shortcut
    alone decides what it earns)."""
    texts = kit.reference()
    texts[file] = with_body(texts[file], qualname, body)
    return texts


class Decided(Exception):
    """A shortcut's grade can no longer exceed its bound, whatever the checks not run yet give."""


def grade_variants(kit) -> None:
    """Run on test_assignments' kit: every shortcut of the assignment scores at most 25% of its
    points, every honest alternative 100%."""
    from assignments.grade import Report

    name, total = kit.assignment.name, kit.assignment.points
    for what, file, qualname, body in SHORTCUTS.get(name, []):
        def decided(report):
            """Stops the grading once the points earned plus all the points of the checks left are
            at most 25%: those checks could not change the verdict, so they are not run."""
            left = total - sum(r.max_points for r in report.results)
            if report.points + left <= 0.25 * total:
                raise Decided

        report = Report(name, list(kit.assignment.functions))
        try:
            kit.grade(shortcut_texts(kit, file, qualname, body), report=report, on_result=decided)
        except Decided:
            pass
        earned = {r.check: r.points for r in report.results if r.passed}
        assert report.points + total - sum(r.max_points for r in report.results) <= 0.25 * total, (
            name, what, report.points, total, earned)
    for what, file, bodies in HONEST.get(name, []):
        texts = kit.reference()
        for qualname, body in bodies:
            texts[file] = with_body(texts[file], qualname, body)
        report = kit.grade(texts)
        assert report.points == total, (name, what, [(r.check, r.message) for r in report.results if not r.passed])
    attacks_score_nothing(kit)


def test_the_variants_are_what_they_say():
    """Each variant replaces an existing function's body and stays valid Python, and each
    assignment the issue names has its shortcut and its honest alternative."""
    assert {"rejection_sampling", "tree_verify", "greedy_speculative", "ngram_drafter"} <= set(SHORTCUTS)
    assert set(SHORTCUTS) <= set(HONEST)
    for name in HONEST:
        for _, file, bodies in HONEST[name]:
            text = (ROOT / file).read_text()
            for qualname, body in bodies:
                changed = with_body(text, qualname, body)
                ast.parse(changed)
                assert changed != text and textwrap.dedent(body).strip().splitlines()[0] in changed
    for name in SHORTCUTS:
        for _, file, qualname, body in SHORTCUTS[name]:
            ast.parse(with_body((ROOT / file).read_text(), qualname, body))


# ------------------------------------------------------------------------------------------------
# Seeds
# ------------------------------------------------------------------------------------------------

NO_INPUTS = {"bug_named"}  # what it judges, BUG.txt, takes no inputs


@pytest.mark.parametrize("name", list(ASSIGNMENTS))  # one test each: the workers share them
def test_every_seed_gives_valid_inputs_to_every_check(tmp_path, name):
    """Seeds 0..MAX_SEED through every check's input builder (no student code). Most builders take
    the seed only into random generators' seeds (valid for any seed: their references are computed
    at a few); the others wrap it into a small set of inputs: for each distinct one the reference
    is computed, and (but for the served greedy checks) the instructor's code is judged on it. The
    seeds that crashed before (greedy_speculative >= 24, ngram_drafter >= 100, gamma_cost_model's
    probabilities above 1) are among them."""
    data = make_data(tmp_path / "data")
    assignment = ASSIGNMENTS[name]
    for check in assignment.checks:
        distinct = {}
        # repr, not json.dumps: a builder makes its dict in one order, and repr is several times faster
        visible = repr(check.make_inputs(VISIBLE_SEED))
        for seed in range(MAX_SEED + 1):
            inputs = repr(check.make_inputs(seed))
            # hidden inputs are never the visible ones (a lookup table of those earns nothing),
            # but where a check has no inputs (find_the_bug's name: it is per copy)
            assert seed == VISIBLE_SEED or inputs != visible or check.name in NO_INPUTS, (check.name, seed)
            distinct.setdefault(inputs, seed)
        if len(distinct) > 60:  # the seed only seeds random generators: their reference at a few seeds
            for seed in (0, 1, 4999, MAX_SEED):
                inputs = check.make_inputs(seed)
                reference = json.loads(json.dumps((check.reference or check.probe)(inputs, data)))
                if check.serve is None and not {"rounds", "samples"} & set(inputs):  # judged where cheap
                    refs = {check.name: {"inputs": inputs, "reference": reference}}
                    assert not failing_checks(assignment, data, refs), (check.name, seed)
            continue
        for seed in sorted(distinct.values()):  # the seed is wrapped: every distinct input
            inputs = check.make_inputs(seed)
            reference = json.loads(json.dumps((check.reference or check.probe)(inputs, data)))
            if check.serve is None:  # and judged (a served check's generations cost more: its reference ran)
                refs = {check.name: {"inputs": inputs, "reference": reference}}
                assert not failing_checks(assignment, data, refs), (check.name, seed)


def test_seeds_outside_the_tested_range_are_refused(tmp_path):
    assignment = ASSIGNMENTS["gamma_cost_model"]
    for seed in (-1, MAX_SEED + 1):
        with pytest.raises(AssignmentError, match=f"--seed {seed}: give a seed between 0 and {MAX_SEED}"):
            references(assignment, tmp_path, seed)


def test_an_official_grade_runs_every_check_on_hidden_inputs(tmp_path):
    """references at a hidden seed give every check, the visible ones included, that seed's
    inputs; the visible seed is refused for an official grade, and without a seed a fresh one is
    drawn. (Before, the visible checks re-ran the inputs shipped with the copy: a lookup table of
    their answers scored 7 of 8 on ngram_drafter.)"""
    from assignments.references import draw_seed, official_seed

    assignment = ASSIGNMENTS["gamma_cost_model"]
    refs = references(assignment, tmp_path, 7)
    for check in assignment.checks:
        assert refs[check.name]["inputs"] == check.make_inputs(7) != check.make_inputs(VISIBLE_SEED), check.name
    with pytest.raises(AssignmentError, match=f"--seed {VISIBLE_SEED} gives the visible inputs"):
        official_seed(VISIBLE_SEED)
    assert official_seed(7) == 7
    drawn = {official_seed(None) for _ in range(50)}
    assert len(drawn) > 1 and all(1 <= seed <= MAX_SEED for seed in drawn | {draw_seed()})


def test_a_seed_the_reference_fails_is_refused_with_the_reason(tmp_path, monkeypatch):
    """grade refuses a seed where the instructor's own solution fails a check (say, a chi-square
    test at its 1e-3 false-failure rate): it would fail every student who computes as it does."""
    from assignments.references import refuse_a_failing_seed

    assignment = ASSIGNMENTS["gamma_cost_model"]
    refs = references(assignment, tmp_path, 3, [assignment.check("tokens_per_round")])
    refs["tokens_per_round"]["reference"][0][0] += 1  # a reference its own solution cannot match
    with pytest.raises(AssignmentError, match=r"(?s)at seed 3 the reference solution itself fails 1 check.*"
                                              r"tokens_per_round.*choose another --seed"):
        refuse_a_failing_seed(assignment, tmp_path, refs, 3)


def test_the_reference_check_runs_each_shared_run_once(tmp_path, monkeypatch):
    """failing_checks (what grade and the exports verify first) runs the instructor's step once
    per distinct run, as the grader runs one child for it: rejection_sampling's five round checks
    are three runs (random q, q = p, a point mass), read five ways; and every check is judged."""
    import assignments.rejection_sampling as rs

    assignment = ASSIGNMENTS["rejection_sampling"]
    data = make_data(tmp_path / "data")
    refs = references(assignment, data, 3)
    steps, function = [], rs.function
    monkeypatch.setattr(rs, "function", lambda name: steps.append(name) or function(name))
    judged, judge = [], rs.follows
    monkeypatch.setattr(rs, "follows", lambda *args: judged.append(args) or judge(*args))
    assert failing_checks(assignment, data, refs) == {}
    assert steps.count(rs.REJECTION) == 3
    # first token twice (random q, a point mass), second token, acceptance, bonus; the samples end to end
    assert len(judged) == 6


# ------------------------------------------------------------------------------------------------
# What the checks say, and what the copy holds
# ------------------------------------------------------------------------------------------------

def _perturbed(values):
    """The values with every number changed: a wrong answer of the right shape."""
    if isinstance(values, bool) or values is None:
        return values
    if isinstance(values, int):
        return values + 1
    if isinstance(values, float):
        return values * 1.37 + 0.123
    if isinstance(values, str):
        return values + " (changed)"
    if isinstance(values, list):
        return [_perturbed(v) for v in values]
    if isinstance(values, dict):
        return {k: _perturbed(v) for k, v in values.items()}
    return values


def _numbers(values) -> set[str]:
    """How the reference's numbers would print: ints of two digits or more (small ones are
    everywhere: gamma=4), floats as repr and rounded to 2 places."""
    if isinstance(values, bool) or values is None or isinstance(values, str):
        return set()
    if isinstance(values, int):
        return {str(values)} if abs(values) >= 10 else set()
    if isinstance(values, float):
        return {repr(values), f"{round(values, 2)}"} - {"0.0", "1.0"}
    items = values.values() if isinstance(values, dict) else values
    return set().union(*(_numbers(v) for v in items)) if items else set()


def test_hidden_checks_print_no_expected_values(tmp_path):
    """Each hidden check judges a wrong answer (the instructor's values, every number changed): it
    fails, and its message shows neither the word "expected" nor any of the reference's numbers
    or token lists (resubmitting would collect them)."""
    data = make_data(tmp_path / "data")
    for assignment in ASSIGNMENTS.values():
        hidden = [c for c in assignment.checks if not c.visible]
        refs = references(assignment, data, 1, hidden)
        for check in hidden:
            inputs, reference = refs[check.name]["inputs"], refs[check.name]["reference"]
            for key, small in (("rounds", 200), ("samples", 50)):  # fewer draws: the verdict is the same
                if key in inputs:
                    inputs[key] = small

            server = check.serve(inputs, reference, data) if check.serve else None
            serve_here(server)
            try:
                got = _perturbed(json.loads(json.dumps(check.probe(inputs, data))))
            finally:
                serve_here(None)
            with pytest.raises(Failed) as failure:
                check.judge(inputs, reference, got, *([server.record()] if server else []))
            message = str(failure.value)
            assert "expected" not in message.replace("expected_tokens", ""), (check.name, message)
            if len(json.dumps(reference)) < 5000:  # not the exact laws' tables: any number could be theirs
                shown = {n for n in _numbers(reference) if n in message} - _numbers(inputs)
                assert not shown, (check.name, shown, message)
            tokens = reference.get("tokens") if isinstance(reference, dict) else None
            for run in tokens or []:
                assert str(run[:2])[1:-1] not in message, (check.name, message)


def test_the_copy_holds_no_reference_computation_and_the_leak_check_finds_one(tmp_path):
    """Every check's reference computation is stripped from the copy like a student's function
    (tests/test_assignments.py's the_copy_holds_no_answer checks the copies), and its body left
    anywhere in a copy is found by the leak check."""
    names = reference_functions()
    assert {"assignments.rejection_sampling.round_reference", "assignments.probing.lossless_reference",
            "assignments.tree_verify.node_reference", "assignments.greedy_speculative.served_reference"} <= set(names)
    target = resolve("assignments.rejection_sampling.round_reference")
    copy = tmp_path / "copy"
    (copy / "spec_decoding").mkdir(parents=True)
    source = ast.get_source_segment((ROOT / target.file).read_text(), target.node)
    (copy / "spec_decoding" / "helpers.py").write_text(
        "from assignments.rejection_sampling import *\n\n\n" + source.replace("def round_reference", "def exact_laws"))
    leaks = find_leaks({target.name: _tokens(target.node.body)}, copy, skip=set())
    assert [(leak.function, leak.where) for leak in leaks] == [(target.name, "spec_decoding/helpers.py:exact_laws")]


@pytest.mark.parametrize("check", ["greedy_equals_target", "greedy_caches"])
def test_the_served_target_always_makes_the_draft_lose_a_token(tmp_path, monkeypatch, check):
    """greedy_equals_target checks that a rejected draft token is not kept, greedy_caches that the
    caches are rolled back after one. Under a secret target with which the draft agrees all the
    way, a loop that keeps every draft token, or never rolls back, gives the right output (one
    grading in four passed greedy_caches so at the hidden seed): their references draw secrets
    until the instructor's loop rejects a draft token before its last round. Here, one run (at
    gamma 1 for the first) under a secret found to agree: the reference moves on to another."""
    import secrets

    from assignments import greedy_speculative
    from assignments.probing import PROMPT, load
    from assignments.serving import secret_target
    from spec_decoding.algorithms.greedy import speculative_sampling_greedy

    data = make_data(tmp_path / "data")
    if check == "greedy_equals_target":
        inputs, run = {"prompt": PROMPT, "max_gen": 30, "gammas": [1]}, {"prompt": PROMPT, "max_gen": 30, "gamma": 1}
    else:
        inputs = run = greedy_speculative.caches_inputs(2)
    draft = load(data, "draft")

    def rejected(secret):
        stats = speculative_sampling_greedy(secret_target(data, secret), draft, run["prompt"], run["max_gen"],
                                            run["gamma"]).stats
        return stats.tokens_drafted - stats.tokens_accepted

    agreeing = next(s for s in range(500) if rejected(s) == 0)
    drawn = iter([agreeing, agreeing] + list(range(10_000, 10_040)))
    monkeypatch.setattr(secrets, "randbits", lambda bits: next(drawn))
    chosen = ASSIGNMENTS["greedy_speculative"].check(check).reference(inputs, data)["secret"]
    assert chosen >= 10_000 and rejected(chosen) > 0


def test_the_ngram_checks_target_always_lets_the_lookup_save_forwards(tmp_path, monkeypatch):
    """ngram_greedy passes a drafter whose target forwards stay within the allowance: under about
    one secret target in eight the instructor's drafter saved so few that plain decoding (a drafter
    proposing nothing: one forward a token) was within it too. Its reference moves past such a
    secret."""
    import secrets

    from assignments.greedy_speculative import allowed_forwards
    from assignments.ngram_drafter import greedy_inputs, greedy_reference
    from assignments.probing import counting_forwards
    from assignments.serving import secret_target
    from spec_decoding import NGramDrafter, speculative_sampling_greedy

    data = make_data(tmp_path / "data")
    inputs = greedy_inputs(0)

    def plain_passes(secret):
        target = secret_target(data, secret)
        with counting_forwards(target) as calls:
            speculative_sampling_greedy(target, NGramDrafter(max_ngram=3), inputs["prompt"], inputs["max_gen"],
                                        inputs["gamma"])
        return allowed_forwards({"forwards": calls[0], "runs": 1}) >= inputs["max_gen"]

    weak = next(s for s in range(300) if plain_passes(s))
    drawn = iter([weak] + list(range(10_000, 10_040)))
    monkeypatch.setattr(secrets, "randbits", lambda bits: next(drawn))
    chosen = greedy_reference(inputs, data)
    assert chosen["secret"] >= 10_000 and not plain_passes(chosen["secret"])


def _renamed(tokens, order=None):
    """tokens with each renamed by the order of its first appearance, and the renaming."""
    order = {} if order is None else order
    return tuple(order.setdefault(t, len(order)) for t in tokens), order


def test_no_renaming_proof_table_of_the_visible_cases_answers_ngram_lookups_hidden_cases():
    """ngram_lookup's hidden cases are drawn afresh, not the visible ones with their tokens
    renamed: a table of the visible answers keyed by each case up to renaming (its answer renamed
    back), proposing nothing for a case it does not know, scores what proposing nothing scores
    (0) at every seed tried; on the visible inputs (the control) it scores full. (The hidden cases
    were the visible ones renamed: such a table passed them.)"""
    from assignments.forms import read
    from assignments.ngram_drafter import lookup_inputs

    check = ASSIGNMENTS["ngram_drafter"].check("ngram_lookup")
    visible = lookup_inputs(VISIBLE_SEED)
    answers = check.probe(visible, None)  # the instructor's drafter, in this process
    table = {}
    for (_, tokens, num_tokens, max_ngram, cap), answer in zip(visible["cases"], answers):
        shape, order = _renamed(tokens)
        table[shape, num_tokens, max_ngram, cap] = [order[t] for t in answer["tokens"]]

    def looked_up(inputs):
        values = []
        for _, tokens, num_tokens, max_ngram, cap in inputs["cases"]:
            shape, order = _renamed(tokens)
            back = {v: k for k, v in order.items()}
            known = table.get((shape, num_tokens, max_ngram, cap))
            values.append({"tokens": [back[t] for t in known] if known is not None else [], "q_is_none": True})
        return values

    def passes(inputs, values):
        reference = check.probe(inputs, None)
        try:
            check.judge(inputs, reference, read(check.form(inputs, reference), values))
            return True
        except Failed:
            return False

    assert passes(visible, looked_up(visible))
    for seed in range(1, 301):
        inputs = lookup_inputs(seed)
        nothing = [{"tokens": [], "q_is_none": True} for _ in inputs["cases"]]
        assert not passes(inputs, nothing), seed
        assert not passes(inputs, looked_up(inputs)), seed
        assert passes(inputs, check.probe(inputs, None)), seed


def _drafted_by_the_draft_model(self, tokens, num_tokens, *args, **kwargs):
    """The issue's attack on ngram_greedy: no lookup, the data folder found on the caller's stack,
    its draft model's greedy tokens proposed (the target agrees with them most of the time)."""
    import inspect

    import torch

    from assignments.probing import load

    frame = inspect.currentframe()
    while frame is not None and "data" not in frame.f_locals:
        frame = frame.f_back
    draft, out, proposal = load(frame.f_locals["data"], "draft"), list(tokens), []
    with torch.no_grad():
        for _ in range(num_tokens):
            proposal.append(int(draft(torch.tensor([out]))[0, -1].argmax()))
            out.append(proposal[-1])
    return proposal, None


@pytest.mark.parametrize("drafter", ["the instructor's lookup", "the draft model"])
def test_ngram_greedy_fails_a_drafter_that_drafts_with_a_model(tmp_path, monkeypatch, drafter):
    """ngram_greedy judges each proposal against the n-gram lookup's on the same tokens: a
    propose() that drafts with the draft model it finds on its caller's stack gives the target's
    output with fewer forwards than the lookup (it passed, and ngram_drafter with it) and now
    fails, naming the call; the instructor's drafter (the control) passes. In this process, on the
    grader's own server, as failing_checks runs the reference."""
    from assignments.forms import read
    from spec_decoding.drafters import NGramDrafter

    check = ASSIGNMENTS["ngram_drafter"].check("ngram_greedy")
    data = make_data(tmp_path / "data")
    inputs = check.make_inputs(3)
    reference = json.loads(json.dumps(check.reference(inputs, data)))
    if drafter == "the draft model":
        monkeypatch.setattr(NGramDrafter, "propose", _drafted_by_the_draft_model)
    server = check.serve(inputs, reference, data)
    serve_here(server)
    try:
        values = json.loads(json.dumps(check.probe(inputs, data)))
    finally:
        serve_here(None)
    got = read(check.form(inputs, reference), values)
    if drafter == "the instructor's lookup":
        check.judge(inputs, reference, got, server.record())
        return
    with pytest.raises(Failed, match=r"propose\(\) call \d+ .* proposed .*expected .*the n-gram lookup"):
        check.judge(inputs, reference, got, server.record())


STATISTICAL = {name: [c.name for c in a.checks if c.statistical] for name, a in ASSIGNMENTS.items()}


def test_the_statistical_checks_are_those_that_test_draws_and_their_second_draw_is_independent():
    """Every check judged by a chi-square test is marked statistical (and no exact one): its
    references hold a second draw whose inputs share no generator seed with the first's, and at
    no seed is a second draw's seed a first draw's (the visible inputs' included)."""
    from assignments.references import second_seed

    assert STATISTICAL == {
        "rejection_sampling": ["first_token", "bonus_token", "acceptance_rate", "second_token", "point_mass_draft",
                               "lossless"],
        "tree_verify": ["multi_draft_output", "multi_draft_one_child", "multi_draft_all_rejected", "tree_lossless"],
        "ngram_drafter": ["ngram_lossless"], "find_the_bug": ["bug_fixed"],
        "kv_cache": [], "greedy_speculative": [], "gamma_cost_model": []}
    firsts = set(range(MAX_SEED + 1))
    assert not firsts & {second_seed(seed) for seed in firsts}
    for name, checks in STATISTICAL.items():
        for check in map(ASSIGNMENTS[name].check, checks):
            for seed in (0, 1, 77, MAX_SEED):
                first, second = check.make_inputs(seed), check.make_inputs(second_seed(seed))
                seeds = lambda inputs: {v for k, v in inputs.items() if k.endswith("seed")}  # noqa: E731
                assert seeds(first) and not seeds(first) & seeds(second), (check.name, first, second)


def _judging(check, verdicts: dict, calls: list):
    """check with a judge that raises verdicts[which draw] (None: passes), counting its calls."""
    from dataclasses import replace

    from assignments.references import second_seed

    def judge(inputs, reference, got, *served):
        draw = "second" if inputs == check.make_inputs(second_seed(1)) else "first"
        calls.append(draw)
        if verdicts[draw] is not None:
            raise verdicts[draw](f"the {draw} draw's verdict")

    return replace(check, judge=judge)


@pytest.mark.parametrize("first, second, fails", [
    ("Unlikely", None, False), ("Unlikely", "Unlikely", True), ("Unlikely", "Failed", True), ("Failed", None, True),
])
def test_a_statistical_failure_is_judged_again_on_the_second_draw(tmp_path, first, second, fails):
    """The reference check (failing_checks, in this process) as a student is judged: an Unlikely
    first draw is judged again on the second draw and fails only if that fails too, with both
    messages; an exact failure (Failed) is final, the second draw never judged."""
    from dataclasses import replace

    from assignments.definition import Unlikely

    kinds = {"Unlikely": Unlikely, "Failed": Failed, None: None}
    assignment = ASSIGNMENTS["rejection_sampling"]
    calls = []
    check = _judging(assignment.check("bonus_token"), {"first": kinds[first], "second": kinds[second]}, calls)
    data = make_data(tmp_path / "data")
    refs = references(assignment, data, 1, [assignment.check("bonus_token")])
    failures = failing_checks(replace(assignment, checks=(check,)), data, refs)
    assert calls == (["first", "second"] if first == "Unlikely" else ["first"])
    assert bool(failures) == fails
    if first == "Unlikely" and fails:
        assert failures["bonus_token"] == ("the first draw's verdict; a second, independent draw failed too: "
                                           "the second draw's verdict")


def test_a_grade_passes_a_check_whose_second_draw_passes(tmp_path):
    """Through the sandbox (grade_tree): the instructor's rejection.py graded on bonus_token with
    a judge that finds the first draw unlikely: the second draw is run in its own child and
    judged, the check passes with both draws counted and says the first was unlikely; where the
    second is unlikely too it fails with both messages. (Before, the first draw decided.)"""
    from dataclasses import replace

    from assignments.definition import Unlikely
    from assignments.grade import Zygote, grade_tree
    from assignments.make import make

    assignment = ASSIGNMENTS["rejection_sampling"]
    data = make_data(tmp_path / "data")
    make(list(assignment.functions), tmp_path / "copy", assignment=assignment.name, ship_visible=False)
    refs = references(assignment, data, 1, [assignment.check("bonus_token")])
    files = {resolve(f).file: ROOT / resolve(f).file for f in assignment.functions}
    with Zygote(tmp_path / "copy") as zygote:
        for second, passed in ((None, True), (Unlikely, False)):
            calls = []
            check = _judging(assignment.check("bonus_token"), {"first": Unlikely, "second": second}, calls)
            report = grade_tree(replace(assignment, checks=(check,)), tmp_path / "copy", files, data, refs,
                                zygote=zygote)
            (result,) = report.results
            assert calls == ["first", "second"] and result.draws == 2 and result.passed == passed
            assert result.points == (check.points if passed else 0)
            assert ("ok on a second, independent draw (the first was unlikely: the first draw's verdict)"
                    if passed else "a second, independent draw failed too: the second draw's verdict") in result.message


def test_the_guides_false_failure_rates_are_alpha_squared_per_statistical_check():
    """docs/instructor_guide.md states, per assignment, the checks judged on two draws and the
    rate at which a correct solution fails one of them: exactly the checks marked statistical,
    and their count times alpha squared (the draws are independent: the test above)."""
    from spec_decoding.checks import P_VALUE_THRESHOLD

    guide = (ROOT / "docs" / "instructor_guide.md").read_text()
    table = guide[guide.index("| assignment | statistical checks (two draws each)"):]
    rows = {}
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        name, checks, rate = (cell.strip() for cell in line.strip("|").split("|"))
        rows[name] = ([c.strip() for c in checks.split("(")[0].split(",")], rate)
    assert {name: checks for name, (checks, _) in rows.items()} == {n: c for n, c in STATISTICAL.items() if c}
    for name, (checks, rate) in rows.items():
        per_million = round(len(checks) * P_VALUE_THRESHOLD ** 2 * 1e6)
        assert rate == f"about {per_million} in 1,000,000", (name, rate)


def test_a_planted_bug_fails_both_draws_and_the_reference_neither(tmp_path):
    """The guide's power table, one cell: with the bug zoo's "resample from p" planted in this
    process, first_token fails the instructor's code on both draws (the message says so) at
    two seeds; without it, it passes."""
    from spec_decoding.checks.bug_zoo import BUGS

    assignment = ASSIGNMENTS["rejection_sampling"]
    check = assignment.check("first_token")
    data = make_data(tmp_path / "data")
    for seed in (1, 2):
        refs = references(assignment, data, seed, [check])
        assert "retry" in refs["first_token"]
        assert failing_checks(assignment, data, refs) == {}
        with BUGS["resample from p"].planted():
            failed = failing_checks(assignment, data, refs)
        assert "a second, independent draw failed too" in failed["first_token"], failed


def _is_tokens(value) -> bool:
    return isinstance(value, list) and len(value) > 0 and all(type(v) is int for v in value)


def _canonical(value, order: dict):
    """`value` up to renaming the token ids in it (the integers of its lists of integers, each
    by the order of its first appearance; a count or a length stays itself): what a
    renaming-proof lookup table keys a case by."""
    if _is_tokens(value):
        return tuple(("token", order.setdefault(v, len(order))) for v in value)
    if isinstance(value, list):
        return tuple(_canonical(v, order) for v in value)
    if isinstance(value, dict):
        return tuple((key, _canonical(v, order)) for key, v in sorted(value.items()))
    return value


def _mapped(value, renaming: dict):
    """`value` (an answer) with each integer that `renaming` maps replaced by its image."""
    if isinstance(value, bool) or not isinstance(value, (int, list, dict)):
        return value
    if isinstance(value, int):
        return renaming.get(value, value)
    if isinstance(value, list):
        return [_mapped(v, renaming) for v in value]
    return {key: _mapped(v, renaming) for key, v in value.items()}


@pytest.mark.parametrize("name", [n for n, a in ASSIGNMENTS.items() if any(c.visible and not c.serve for c in a.checks)])
def test_a_renaming_proof_table_of_every_visible_check_scores_nothing_hidden(tmp_path, name):
    """Every visible check (but the served ones, whose target is a secret drawn per grade): a
    table of the values the instructor's code sends on the visible inputs, keyed by the inputs up
    to renaming their integers, answers hidden inputs (seeds 1 and 2) only where their form is a
    visible one's; its answer, renamed back, then fails the hidden judge. Elsewhere it has no
    entry, and answers nothing (a do-nothing submission)."""
    from assignments.forms import read

    data = make_data(tmp_path / "data")
    for check in (c for c in ASSIGNMENTS[name].checks if c.visible and not c.serve):
        visible = check.make_inputs(VISIBLE_SEED)
        order = {}
        key = _canonical(visible, order)
        answer = json.loads(json.dumps(check.probe(visible, data)))  # what the copy's shipped answers give
        for seed in (1, 2):
            hidden, found = check.make_inputs(seed), {}
            if _canonical(hidden, found) != key:
                continue  # no entry: the table answers nothing
            back = {order_index: value for value, order_index in found.items()}
            renamed = _mapped(answer, {value: back[index] for value, index in order.items()})
            reference = json.loads(json.dumps((check.reference or check.probe)(hidden, data)))
            with pytest.raises(Failed):
                check.judge(hidden, reference, read(check.form(hidden, reference), renamed))
