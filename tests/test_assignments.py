"""The course assignment kit (assignments/). For each ready-made assignment: the stripped copy
fails, the reference solution passes, planted wrong solutions fail the check meant for them with
a message naming the mistake, shortcuts (delegating to a sibling, plain decoding, a forged
verdict printed at exit) fail; the grader survives debug prints, floods and hangs; the Gradescope
export grades a fake /autograder; `make` strips what would answer the assignment.

Cost: one stripped copy, one set of references and one zygote per assignment, in one test per
assignment (test_ready_made_assignment); each variant is one more temporary tree and a few forks."""

import ast
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from assignments import __main__ as cli
from assignments.registry import ASSIGNMENTS
from assignments.grade import (HIDDEN_SEED, Zygote, check_locally, grade, grade_tree, make_data, references, same_run,
                               student_files)
from assignments.export import autograde, export_gradescope, gradescope_results, gradescope_source
from assignments.make import AssignmentError, _definitions, copy_ignore, make, reference_functions, resolve
from test_grader_verdicts import grade_variants

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_data(tmp_path_factory.mktemp("data"))


def first_draws(refs: dict) -> dict:
    """refs without the statistical checks' second draws."""
    return {name: {key: value for key, value in entry.items() if key != "retry"} for name, entry in refs.items()}


class Kit:
    """One assignment's stripped copy, hidden references and zygote; grades variants."""

    def __init__(self, name, folder: Path, data: Path):
        self.assignment = ASSIGNMENTS[name]
        self.folder, self.data = folder, data
        self.pristine = folder / "pristine"
        make(list(self.assignment.functions), self.pristine, assignment=name, ship_visible=False)
        # the first draws only: what the kit shows fails or passes there (a failing statistical
        # check's second draw is shown by tests/test_grader_verdicts.py; here it would double the
        # sandbox runs of every planted mistake and shortcut)
        self.refs = first_draws(references(self.assignment, data, HIDDEN_SEED))
        self.zygote = Zygote(self.pristine)
        self.count = 0

    def stripped(self, file: str) -> str:
        return (self.pristine / file).read_text()

    def grade(self, texts: dict[str, str], only=None, timeout=None, refs=None, report=None, on_result=None):
        """Grade a submission given as {file: text} (on the hidden references, or `refs`); report
        and on_result as grade_tree's."""
        self.count += 1
        submission = self.folder / f"submission{self.count}"
        for rel, text in texts.items():
            (submission / rel).parent.mkdir(parents=True, exist_ok=True)
            (submission / rel).write_text(text)
        files, notes = student_files(submission, sorted({resolve(f).file for f in self.assignment.functions}))
        return grade_tree(self.assignment, self.pristine, files, self.data, refs or self.refs, only, timeout, notes,
                          zygote=self.zygote, report=report, on_result=on_result)

    def reference(self) -> dict[str, str]:
        return {resolve(f).file: (ROOT / resolve(f).file).read_text() for f in self.assignment.functions}


# find_the_bug plants a bug instead of stripping bodies: tests/test_find_the_bug.py shows its list
@pytest.mark.parametrize("name", [name for name, a in ASSIGNMENTS.items() if not a.plant])
def test_ready_made_assignment(tmp_path, data, name):
    """What each ready-made assignment must show, on one stripped copy, one set of hidden
    references and one zygote (a test per aspect would build them again on every xdist worker):
    the stripped copy fails (even with a forged verdict printed at exit) and the reference
    solution passes; planted mistakes fail their check with a message naming them; shortcuts
    fail; the copy holds no answer; the Gradescope export grades a fake /autograder folder. And
    per assignment: the student's local check (kv_cache), grade --json (greedy_speculative), the
    grader surviving a debug print, a flood of output and a hang (rejection_sampling)."""
    kit = Kit(name, tmp_path / "kit", data)
    try:
        stripped_copy_fails_even_with_a_forged_verdict_and_the_reference_solution_passes(kit)
        planted_mistakes_fail_their_check_with_a_message_naming_them(kit)
        shortcuts_fail(kit)
        sibling_shortcuts_fail(kit)
        grade_variants(kit)  # shortcuts earn at most 25%, honest alternatives 100% (test_grader_verdicts.py)
        the_copy_holds_no_answer(kit)
        gradescope_export_grades_a_fake_autograder_folder(kit, tmp_path / "gradescope")
        if name == "kv_cache":
            the_students_local_check_uses_the_shipped_references(kit, tmp_path / "local")
        if name == "greedy_speculative":
            grade_json(kit, tmp_path / "json")
        if name == "rejection_sampling":
            the_residual_mistake_is_named_by_the_residual_check_too(kit)
            debug_print_flood_and_hang_each_end_in_a_clear_verdict_for_their_check(kit)
    finally:
        kit.zygote.close()


def replaced(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def stub(qualname: str) -> str:
    return f"raise NotImplementedError('{qualname}: your code here (see the docstring)')"


def results_by_check(report):
    return {r.check: r for r in report.results}


# ------------------------------------------------------------------------------------------------
# Stripped copies fail, reference solutions pass
# ------------------------------------------------------------------------------------------------

def stripped_copy_fails_even_with_a_forged_verdict_and_the_reference_solution_passes(kit):
    """The stripped copy, with an atexit hook printing a passing verdict line for every check
    (the old grader read verdicts from stdout, last line wins: that gave ALL PASS), scores 0:
    stdout is only shown. Then the reference solution scores full marks."""
    t = resolve(kit.assignment.functions[0])
    stripped = kit.stripped(t.file)
    line = next(line for line in stripped.splitlines() if line.strip() == stub(t.qualname))
    forged = replaced(stripped, stub(t.qualname), forged_atexit(line[:len(line) - len(line.lstrip())]) + stub(t.qualname))
    report = kit.grade({t.file: forged})
    assert [r.check for r in report.results] == [c.name for c in kit.assignment.checks]
    assert report.points == 0 and not report.passed
    assert all("not implemented yet" in r.message for r in report.results), report.results
    with counted_children() as children:
        solved = kit.grade(kit.reference())
    assert solved.passed, [(r.check, r.message) for r in solved.results if not r.passed]
    assert solved.points == kit.assignment.points == solved.max_points
    assert {c.visible for c in kit.assignment.checks} == {True, False}  # visible and hidden checks
    # Checks that judge the same run (probe and inputs) share one child: rejection_sampling's first
    # token, second token and acceptance rate are three readings of one set of rounds.
    runs = {same_run(c, kit.refs[c.name]["inputs"]) for c in kit.assignment.checks}
    assert children == [len(runs)], children
    if kit.assignment.name == "rejection_sampling":
        assert len(runs) == len(kit.assignment.checks) - 2


@contextlib.contextmanager
def counted_children():
    """[how many check children the grader ran] while in the block."""
    from assignments import grade as grading

    counted, run_child = [0], grading.run_child

    def counting(*args, **kwargs):
        counted[0] += 1
        return run_child(*args, **kwargs)
    grading.run_child = counting
    try:
        yield counted
    finally:
        grading.run_child = run_child


def forged_atexit(indent: str) -> str:
    """Lines that register atexit hooks printing a passing verdict for every check."""
    names = [c.name for a in ASSIGNMENTS.values() for c in a.checks]
    return (f"import atexit, json\n{indent}for name in {names!r}:\n{indent}    atexit.register(print, json.dumps("
            f"{{'check': name, 'passed': True, 'message': 'ok', 'seconds': 0}}))\n{indent}")


# ------------------------------------------------------------------------------------------------
# Planted wrong solutions fail the check meant for them, and the message names the mistake
# ------------------------------------------------------------------------------------------------

PLANTED = {
    "kv_cache": [
        ("gpt2/kv_cache.py", "return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]",
         "return k, v", "kv_update", "it returned only the new positions"),
        ("gpt2/kv_cache.py", "        if not 0 <= length <= self.length:\n            raise ValueError(\n"
                             "                f\"KVCache.truncate({length}): length must be between 0 and the current \"\n"
                             "                f\"length {self.length}\"\n            )\n        self.length = length",
         "        self.length = length", "kv_truncate", "must raise ValueError"),
        ("gpt2/model.py", "y = F.scaled_dot_product_attention(q.to(k.dtype), k, v, attn_mask=attn_mask)",
         "y = F.scaled_dot_product_attention(q.to(k.dtype), k, v, attn_mask=attn_mask, scale=1.0)",
         "attention_forward", "not divided by sqrt(head_dim)"),
    ],
    "greedy_speculative": [
        ("spec_decoding/algorithms/greedy.py", "new_tokens, sources, eos_id, max_gen", "new_tokens, sources, None, max_gen",
         "greedy_stopping", "tokens after eos"),
        ("spec_decoding/algorithms/greedy.py", "while n < len(draft_tokens) and draft_tokens[n] == target_choice[n]:",
         "while n < len(draft_tokens):", "greedy_equals_target", "a draft token the target's argmax disagrees with was kept"),
        # no roll-back: after a rejection the caches run ahead of the tokens, and the drafter's next
        # forward gets no new token (without a rejection before the last round it would pass: the
        # reference's secret makes sure there is one)
        ("spec_decoding/algorithms/greedy.py", "        roll_back(target_cache, drafter, len(tokens))\n", "",
         "greedy_caches", "The usual cause: the caches ran ahead of the accepted tokens: a forgotten roll_back"),
        # a cache not advanced: the target called on the last token and the draft, without its cache
        ("spec_decoding/algorithms/greedy.py",
         "target_logits = target_forward(target, target_cache, tokens, draft_tokens, drafter)",
         "target_logits = target(torch.tensor([tokens[-1:] + draft_tokens]), num_last_logits=len(draft_tokens) + 1)[0]",
         "greedy_equals_target", "KV cache was not advanced"),
    ],
    "rejection_sampling": [
        ("spec_decoding/algorithms/rejection.py", "return residual / total if total > 0 else target_probs",
         "return target_probs", "first_token", "draws from p instead of norm(max(0, p - q))"),
        ("spec_decoding/algorithms/rejection.py", "if r * draft_probs[i, x] < target_probs[i, x]:",
         "if r * target_probs[i, x] < draft_probs[i, x]:", "first_token", "min(1, q/p) instead of min(1, p/q)"),
        ("spec_decoding/algorithms/rejection.py", "return Verdict(g, int(sample(target_probs[g], generator)), uniforms, None)",
         "return Verdict(g, int(sample(target_probs[g - 1], generator)), uniforms, None)", "bonus_token",
         "drawn from row 1 of p"),
    ],
    "ngram_drafter": [
        ("spec_decoding/drafters/drafter.py", "for start in range(len(tokens) - n - 1, -1, -1):",
         "for start in range(0, len(tokens) - n):", "ngram_lookup", "MOST RECENT occurrence"),
        ("spec_decoding/drafters/drafter.py", "for n in range(min(self.max_ngram, len(tokens) - 1), 0, -1):",
         "for n in [min(self.max_ngram, len(tokens) - 1)]:", "ngram_lookup", "fall back to shorter n-grams"),
    ],
    "tree_verify": [
        ("spec_decoding/algorithms/rejection.py",  # SpecInfer's rule without the update: every child against p
         "if r * draft_probs[x] < residual[x]:  # r < residual(x) / q(x), written without dividing\n"
         "            return MultiDraftVerdict(i, None, uniforms, adjusted_p, residual)\n"
         "        residual = residual_distribution(residual, draft_probs)",
         "if r * draft_probs[x] < target_probs[x]:\n"
         "            return MultiDraftVerdict(i, None, uniforms, adjusted_p, residual)\n"
         "        residual = residual_distribution(target_probs, draft_probs)",
         "multi_draft_output", "tested against the unchanged p"),
        ("spec_decoding/algorithms/rejection.py", "if r * draft_probs[x] < residual[x]:", "if True:",
         "multi_draft_output", "the first child is always accepted"),
    ],
    "gamma_cost_model": [
        ("spec_decoding/policies/theory.py", "all_kept *= alpha", "all_kept = alpha", "tokens_by_position",
         "it adds the alphas"),
        ("spec_decoding/policies/costs.py", "return gamma * self.draft_step_s + self.target_score_s[gamma]",
         "return gamma * self.draft_step_s + self.target_score_s[0]", "round_seconds",
         "the target's cost is always one step's"),
    ],
}


def planted_mistakes_fail_their_check_with_a_message_naming_them(kit):
    for file, old, new, check, words in PLANTED[kit.assignment.name]:
        texts = kit.reference()
        texts[file] = replaced(texts[file], old, new)
        result = results_by_check(kit.grade(texts, only=[check]))[check]
        assert not result.passed and words in result.message, (check, result.message)
        assert result.points == 0


def the_residual_mistake_is_named_by_the_residual_check_too(kit):
    texts = kit.reference()
    file = "spec_decoding/algorithms/rejection.py"
    texts[file] = replaced(texts[file], "return residual / total if total > 0 else target_probs", "return target_probs")
    result = results_by_check(kit.grade(texts, only=["residual"]))["residual"]
    assert not result.passed and "returned p itself" in result.message and "resample from p" in result.message


# ------------------------------------------------------------------------------------------------
# Shortcuts fail: delegating to a sibling, plain decoding, a forged verdict printed at exit
# ------------------------------------------------------------------------------------------------

SHORTCUTS = {
    "kv_cache": [
        ("gpt2/kv_cache.py", "KVCache.truncate", "self.keep(length, [])", "kv_truncate", "removed in this assignment"),
    ],
    "greedy_speculative": [
        ("spec_decoding/algorithms/greedy.py", "speculative_sampling_greedy",
         "from .autoregressive import autoregressive_generate\n"
         "    return autoregressive_generate(target, prefix, max_gen, eos_id=eos_id, observers=observers)",
         "greedy_speculates", "the target ran 30 forward passes"),
        ("spec_decoding/algorithms/greedy.py", "speculative_sampling_greedy",
         "from .tree import tree_speculative_sampling\n"
         "    from ..contracts import GREEDY\n"
         "    return tree_speculative_sampling(target, draft, prefix, max_gen, (1,) * gamma, GREEDY, eos_id)",
         "greedy_speculates", "removed in this assignment"),
        ("spec_decoding/algorithms/greedy.py", "speculative_sampling_greedy",
         "from .speculative import speculative_sampling\n"
         "    from ..contracts import SamplingParams\n"
         "    return speculative_sampling(target, draft, prefix, max_gen, gamma, SamplingParams(1e-6), eos_id)",
         "greedy_speculates", "removed in this assignment"),
    ],
    "rejection_sampling": [
        ("spec_decoding/algorithms/rejection.py", "modified_rejection_sampling",
         "from spec_decoding.algorithms.rejection import multi_draft_rejection_sampling\n"
         "    return multi_draft_rejection_sampling(target_probs[0], draft_probs[0], draft_tokens[:1], generator)",
         "first_token", "removed in this assignment"),
    ],
    "tree_verify": [
        ("spec_decoding/algorithms/rejection.py", "multi_draft_rejection_sampling",
         "for i, x in enumerate(draft_tokens):\n"
         "        v = modified_rejection_sampling(target_probs[None].expand(2, -1), draft_probs[None], [x], generator)\n"
         "        if v.n_accepted:\n"
         "            return MultiDraftVerdict(i, None, [], [], target_probs)\n"
         "        target_probs = v.residual\n"
         "    return MultiDraftVerdict(None, int(sample(target_probs, generator)), [], [], target_probs)",
         "multi_draft_output", "removed in this assignment"),
    ],
    "gamma_cost_model": [
        ("spec_decoding/policies/theory.py", "best_gamma",
         "lo = break_even_alpha(c, verify_cost)\n    return max(gammas)",
         "best_gamma_choice", "removed in this assignment"),
    ],
}


# Shortcuts through siblings the copy kept (before they were removed): (file, function, body
# written into the reference solution, the check, words of its verdict). Each scored full marks.
SIBLING_SHORTCUTS = {
    "kv_cache": [
        ("gpt2/kv_cache.py", "KVCache.update", """
            from spec_decoding.algorithms.batched import BatchedKVCache
            rows = BatchedKVCache(self)
            rows.lengths[:] = self.length
            return rows.update(layer, k, v)""", "kv_update", "removed in this assignment"),
        ("gpt2/kv_cache.py", "KVCache.truncate", """
            from spec_decoding.algorithms.batched import BatchedKVCache
            rows = BatchedKVCache(self)
            rows.lengths[:] = self.length
            rows.truncate([length] * self.batch_size)
            self.length = int(rows.lengths[0])""", "kv_truncate", "removed in this assignment"),
    ],
    "gamma_cost_model": [
        ("spec_decoding/policies/theory.py", "expected_tokens_per_round", """
            from benchmarks.demo_class import REFERENCE_BODY
            namespace = {}
            exec("def formula(alpha, gamma):" + chr(10) + REFERENCE_BODY, namespace)
            return namespace["formula"](alpha, gamma)""", "tokens_per_round", "demo_class"),
        ("spec_decoding/policies/theory.py", "expected_tokens_by_position", """
            from spec_decoding.policies.gamma import AutoGamma

            class Positions(AutoGamma):
                def __init__(self):
                    self.gamma_max = len(alphas)

                def acceptance_by_position(self, optimism=0.0):
                    return list(alphas)

                def round_seconds(self, g):
                    return 1.0

            return Positions().tokens_per_second(0.0)[-1]""", "tokens_by_position", "removed in this assignment"),
        ("spec_decoding/policies/theory.py", "best_gamma", """
            from spec_decoding.policies.costs import BatchCostModel

            class Costs(BatchCostModel):
                def __init__(self):
                    pass

                def c(self, batch_size):
                    return c

            Costs.verify_cost = lambda self, rows, g: 1.0 if verify_cost is None else verify_cost(g)
            return Costs().best_gamma(alpha, 1, gammas)""", "best_gamma_choice", "removed in this assignment"),
        ("spec_decoding/policies/costs.py", "CostModel.round_seconds",
         "return gamma * self.draft_step_s + self.verify_cost(gamma) * self.target_step_s",
         "round_seconds", "removed in this assignment"),
    ],
}


def solved_copy(kit, file: str) -> str:
    """The copy's version of `file` (its removed siblings raising) with every function the student
    writes in it given the reference's body: what an honest student submits."""
    import ast
    import textwrap

    from assignments.make import _definitions
    from test_grader_verdicts import with_body

    reference = (ROOT / file).read_text()
    nodes, lines = _definitions(ast.parse(reference)), reference.splitlines(keepends=True)
    text = kit.stripped(file)
    for target in (resolve(f) for f in kit.assignment.functions):
        if target.file == file:
            node = nodes[target.qualname]
            first = node.body[1] if ast.get_docstring(node) and len(node.body) > 1 else node.body[0]
            text = with_body(text, target.qualname, textwrap.dedent("".join(lines[first.lineno - 1:node.end_lineno])))
    return text


def sibling_shortcuts_fail(kit):
    """Each sibling shortcut fails its check, written into an honest submission of its file (the
    copy's, every function solved: solved_copy)."""
    from test_grader_verdicts import with_body

    for file, qualname, body, check, words in SIBLING_SHORTCUTS.get(kit.assignment.name, []):
        result = results_by_check(kit.grade({file: with_body(solved_copy(kit, file), qualname, body)},
                                            only=[check]))[check]
        assert not result.passed and words in result.message, (qualname, result.message)


def shortcuts_fail(kit):
    for file, qualname, body, check, words in SHORTCUTS.get(kit.assignment.name, []):
        text = replaced(kit.stripped(file), stub(qualname), body)
        result = results_by_check(kit.grade({file: text}, only=[check]))[check]
        assert not result.passed and words in result.message, (qualname, result.message)


# ------------------------------------------------------------------------------------------------
# The grader survives what student code does: a debug print, a flood of output, a hang
# ------------------------------------------------------------------------------------------------

def debug_print_flood_and_hang_each_end_in_a_clear_verdict_for_their_check(kit):
    file = "spec_decoding/algorithms/rejection.py"
    text = kit.reference()[file]
    # A debug print of a dict (crashed the old grader), 1 MB printed each round, and a hang that
    # only the residual check reaches (p == q exactly).
    text = replaced(text, "    uniforms = []\n", "    uniforms = []\n    print({'check': 'debug', 'passed': False})\n")
    text = replaced(text, "    residual = torch.clamp(target_probs - draft_probs, min=0)\n",
                    "    residual = torch.clamp(target_probs - draft_probs, min=0)\n"
                    "    if torch.equal(target_probs, draft_probs):\n        import time\n        while True:\n"
                    "            time.sleep(1)\n")
    text = replaced(text, "    g = len(draft_tokens)\n", "    g = len(draft_tokens)\n    if torch.rand(()) < 0.002:\n"
                    "        print('x' * 1_000_000)\n")
    # The hang gets a short time limit; the checks it must not touch get their usual one, so a
    # busy machine cannot push them past it (no wall-time limit decides a pass here).
    hung = results_by_check(kit.grade({file: text}, only=["residual"], timeout=2))["residual"]
    assert not hung.passed and "did not finish within 2 s" in hung.message
    results = results_by_check(kit.grade({file: text}, only=["first_token", "bonus_token"]))
    for check in ("first_token", "bonus_token"):  # unaffected by the hang, and by their own output
        assert results[check].passed, results[check].message
        assert "{'check': 'debug', 'passed': False}" in results[check].output
    flooded = results["bonus_token"].output
    assert "characters left out" in flooded and len(flooded) < 20_000


# ------------------------------------------------------------------------------------------------
# make: what the copy holds
# ------------------------------------------------------------------------------------------------

def the_copy_holds_no_answer(kit):
    copy = kit.pristine
    assert not (copy / "tests").exists() and not list(copy.glob("assignments/*/instructor.md"))
    for dropped in kit.assignment.dropped:
        assert not list(copy.glob(dropped))
    # the student's functions, the siblings that would answer them, the checks' reference computations
    for function in kit.assignment.functions + kit.assignment.removed + reference_functions():
        t = resolve(function)
        node = _definitions(ast.parse((copy / t.file).read_text()))[t.qualname]
        body = node.body[1:] if ast.get_docstring(node) else node.body
        assert len(body) == 1 and "NotImplementedError" in ast.unparse(body[0])


def test_the_leak_check_refuses_a_copy_with_a_sibling_left_in(tmp_path, monkeypatch, capsys):
    greedy = ASSIGNMENTS["greedy_speculative"]
    monkeypatch.setitem(ASSIGNMENTS, "greedy_speculative", replace(greedy, removed=(), dropped=()))
    with pytest.raises(AssignmentError, match=r"(?s)still holds the answer.*spec_decoding/algorithms/speculative.py:speculative_sampling"):
        make(list(greedy.functions), tmp_path / "out", assignment="greedy_speculative", ship_visible=False)
    assert not (tmp_path / "out").exists()
    make(list(greedy.functions), tmp_path / "out", assignment="greedy_speculative", ship_visible=False,
         allow_leaks=True)
    assert "WARNING: the copy still holds the answer" in capsys.readouterr().err


def test_make_refuses_a_function_no_check_exercises(tmp_path):
    with pytest.raises(AssignmentError, match="no check exercises spec_decoding.drafters.drafter.LayerSkipDrafter.next_logits"):
        make(["spec_decoding.drafters.drafter.LayerSkipDrafter.next_logits"], tmp_path / "out")
    assert not (tmp_path / "out").exists()
    # every check names the student's functions it exercises, and calls them: a stub fails it;
    # check names are unique (a check's process finds its check by name)
    names = [c.name for a in ASSIGNMENTS.values() for c in a.checks]
    assert len(names) == len(set(names)) and len(ASSIGNMENTS) == 7
    for a in ASSIGNMENTS.values():
        for c in a.checks:
            assert c.exercises and set(c.exercises) <= set(a.functions), c.name


@pytest.mark.parametrize("name, message", [
    ("spec_decoding.algorithms.rejection.no_such_function", "defines no function 'no_such_function'. Its functions are: .*residual_distribution"),
    ("no_such_module.f", "no module 'no_such_module'"),
    ("gpt2.kv_cache.KVCache", "is a class, not a function: name the methods.*gpt2.kv_cache.KVCache.truncate"),
    ("spec_decoding.algorithms.rejection", "is a module, not a function"),
    ("spec_decoding", "is a package, not a function"),
    ("not a name", "not a dotted Python name"),
])
def test_bad_names_give_clear_errors(tmp_path, name, message):
    with pytest.raises(AssignmentError, match=message):
        make([name], tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing written


@pytest.mark.parametrize("under_git", [True, False])
def test_the_students_copy_leaves_out_local_checkpoints_and_what_git_ignores(tmp_path, under_git):
    """A checkout where benchmarks wrote gigabytes of stand-ins into checkpoints/ (git-ignored) once
    had them copied into every student's copy and every grading sandbox, until the disk filled."""
    project = tmp_path / "project"
    for rel in ("gpt2/model.py", "notes/new_idea.py", "checkpoints/standins/model.safetensors", "big.safetensors",
                "scratch/out.bin", "runs/x/results.json"):
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text(rel)
    (project / ".gitignore").write_text("scratch/\n")
    if under_git:
        subprocess.run(["git", "init", "-q", str(project)], check=True)
        subprocess.run(["git", "-C", str(project), "add", "gpt2"], check=True)  # notes/: untracked, not ignored
    shutil.copytree(project, tmp_path / "copy", ignore=copy_ignore(project))
    copied = sorted(str(p.relative_to(tmp_path / "copy")) for p in (tmp_path / "copy").rglob("*") if p.is_file()
                    and ".git/" not in p.as_posix() + "/")
    # git ignores scratch/ only in a git checkout; checkpoints and run outputs never travel
    assert copied == [".gitignore", "gpt2/model.py", "notes/new_idea.py"] + ([] if under_git else ["scratch/out.bin"])


def test_refuses_a_non_empty_folder_and_bad_grade_folders(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert cli.main(["make", "--functions", "spec_decoding.algorithms.rejection.residual_distribution", "--out", str(out)]) == 2
    assert "exists and is not an empty folder" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "mine"
    assert cli.main(["grade", str(out)]) == 2
    assert "was not made by `python -m assignments make`" in capsys.readouterr().err
    assert cli.main(["grade", str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# The student's local check, grade --json, the exports
# ------------------------------------------------------------------------------------------------

def the_students_local_check_uses_the_shipped_references(kit, tmp_path):
    """`python -m assignments check` inside a fresh copy: the visible checks fail cleanly; with
    the reference solution in, they pass; and a wrong attention fails there too (the references
    come with the copy, they are not rebuilt from the student's code)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    copy = tmp_path / "hw"
    make(list(ASSIGNMENTS["kv_cache"].functions), copy, assignment="kv_cache")
    visible = json.loads((copy / ".assignment/visible.json").read_text())
    assert sorted(visible) == sorted(c.name for c in ASSIGNMENTS["kv_cache"].checks if c.visible)
    env = {"PATH": os.defpath, "HOME": str(tmp_path)}

    def check():
        return subprocess.run([sys.executable, "-m", "assignments", "check", "--json"], cwd=copy, env=env,
                              capture_output=True, text=True)
    done = check()
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    report = json.loads(done.stdout)
    assert report["points"] == 0 and all("not implemented yet" in c["message"] for c in report["checks"])
    for rel in ("gpt2/kv_cache.py", "gpt2/model.py"):
        shutil.copyfile(ROOT / rel, copy / rel)
    zygote = kit.zygote
    assert check_locally(copy, zygote=zygote).passed  # what `check` runs, in this process
    model = copy / "gpt2/model.py"
    model.write_text(replaced(model.read_text(), "attn_mask=attn_mask)", "attn_mask=attn_mask, scale=1.0)"))
    result = check_locally(copy, only=["attention_forward"], zygote=zygote).results[0]
    assert not result.passed and "not divided by sqrt(head_dim)" in result.message


def grade_json(kit, tmp_path):
    student = tmp_path / "student"
    shutil.copytree(kit.pristine, student)
    # `grade` run inside a student's copy would take the stripped code as the reference: refused
    with pytest.raises(AssignmentError, match="is a student's copy.*python -m assignments check"):
        grade(student, root=student)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert cli.main(["grade", str(student), "--json", "--only", "greedy_stopping"]) == 1
    report = json.loads(out.getvalue())
    assert report["max_points"] == 1 and report["points"] == 0
    assert [c["check"] for c in report["checks"]] == ["greedy_stopping"]


GRADESCOPE_STATUSES, GRADESCOPE_VISIBILITY = {"passed", "failed"}, {"hidden", "after_due_date", "after_published", "visible"}


def valid_gradescope_results(results: dict, checks) -> None:
    """Gradescope's results.json: tests[] each with name, score, max_score, status, visibility, output."""
    assert isinstance(results["tests"], list)
    assert [t["name"] for t in results["tests"]] == [c.name for c in checks]
    for test, check in zip(results["tests"], checks):
        assert set(test) == {"name", "score", "max_score", "status", "visibility", "output"}
        assert test["max_score"] == check.points and 0 <= test["score"] <= test["max_score"]
        assert test["status"] in GRADESCOPE_STATUSES and test["visibility"] in GRADESCOPE_VISIBILITY
        assert isinstance(test["output"], str) and test["output"]
    assert "score" not in results  # Gradescope sums the tests, and hides the sum while some are hidden


def gradescope_export_grades_a_fake_autograder_folder(kit, tmp_path):
    """The autograder laid out in a folder like /autograder (source, submission, results); the
    submission is just the edited files, flat; run_autograder writes results.json. One
    assignment goes through the real zip and shell script, the others through the function the
    script calls (same code, one Python start-up less). None checks the reference solution again:
    it was graded on these inputs above (the export's own check: test_assignment_exports.py)."""
    assignment, name = kit.assignment, kit.assignment.name
    tmp_path.mkdir(parents=True, exist_ok=True)
    autograder = tmp_path / "autograder"
    source = autograder / "source"
    if name == "greedy_speculative":
        archive = tmp_path / f"{name}.zip"
        export_gradescope(name, archive, HIDDEN_SEED, check_reference=False)
        with zipfile.ZipFile(archive) as z:
            z.extractall(source)
        for script in ("setup.sh", "run_autograder"):
            os.chmod(source / script, 0o755)
    else:
        gradescope_source(name, source, HIDDEN_SEED, check_reference=False)
    assert {"setup.sh", "run_autograder", "hidden.json", "copy", "data"} <= {p.name for p in source.iterdir()}
    (autograder / "submission").mkdir()
    (autograder / "results").mkdir()
    for rel in sorted({resolve(f).file for f in assignment.functions}):  # the reference solution, bare files
        shutil.copyfile(ROOT / rel, autograder / "submission" / Path(rel).name)
    # a cheap passing run: the visible checks, or one (the hidden ones are graded the same way)
    hidden = json.loads((source / "hidden.json").read_text())
    assert sorted(hidden) == sorted(c.name for c in assignment.checks)
    checks = [c for c in assignment.checks if c.visible]
    if name != "greedy_speculative":
        checks = checks[:1]
    (source / "hidden.json").write_text(json.dumps({c.name: hidden[c.name] for c in checks}))
    if name == "greedy_speculative":
        env = {"PATH": os.defpath, "AUTOGRADER_ROOT": str(autograder), "AUTOGRADER_PYTHON": sys.executable}
        shutil.copy(source / "run_autograder", autograder / "run_autograder")  # as Gradescope does
        done = subprocess.run(["bash", str(autograder / "run_autograder")], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    else:
        assert autograde(source, autograder / "submission", autograder / "results" / "results.json",
                         zygote=kit.zygote) == 0
    results = json.loads((autograder / "results" / "results.json").read_text())
    valid_gradescope_results(results, checks)
    assert all(t["status"] == "passed" for t in results["tests"]), results
    assert not (source / "hidden.json").exists()  # read, then removed before the student's code ran


def test_gradescope_results_of_a_failing_submission():
    from assignments.grade import CheckResult, Report

    report = Report("x", ["f"], [CheckResult("a", ["f"], 0.0, 2.0, False, "not implemented yet", True, "hi"),
                                 CheckResult("b", ["f"], 1.0, 1.0, True, "ok", False)])
    results = gradescope_results(report)
    assert [t["status"] for t in results["tests"]] == ["failed", "passed"]
    assert [t["visibility"] for t in results["tests"]] == ["visible", "after_published"]
    assert "hi" in results["tests"][0]["output"] and "score" not in results


def test_leak_check_ignores_shared_input_guards():
    """Two functions that share only an `if <bad input>: raise` guard are not leaks of each other
    (KVCache.truncate's guard once matched a token-map function's), while a copied body still is."""
    import ast
    from assignments.make import LEAK_THRESHOLD, _tokens, similarity

    def body(source):
        return _tokens(ast.parse(source).body[0].body)

    guard = ("    if not 0 <= n <= self.length:\n"
             "        raise ValueError(f'{n} must be between 0 and {self.length} ({self.name}, {type(self)})')\n")
    answer = body("def truncate(self, n):\n" + guard + "    self.length = n\n")
    other = body("def other(self, n, table):\n" + guard + "    return [table[i] for i in range(n)]\n")
    assert similarity(answer, other) < LEAK_THRESHOLD
    work = "    for i in range(n):\n        self.k[i] = self.k[i + 1] * 2 + self.v[i] - n\n"
    assert similarity(body("def f(self, n):\n" + work), body("def g(self, n):\n" + guard + work)) >= LEAK_THRESHOLD


def test_the_leak_checks_cheap_bounds_never_fall_below_the_similarity():
    """find_leaks skips a pair when _shared_run_bound or _at_most (shared runs of MIN_RUN tokens)
    is below the threshold; neither may ever be below similarity() itself, or a leak would go
    unseen. Every reference body of rejection_sampling against every function of spec_decoding/
    (its own original among them)."""
    from collections import Counter

    from assignments.make import (LEAK_THRESHOLD, _at_most, _file_pieces, _runs, _shared_run_bound, _tokens,
                                  similarity)

    references = [_tokens(resolve(f).node.body) for f in ASSIGNMENTS["rejection_sampling"].functions]
    pieces = [p for file in sorted((ROOT / "spec_decoding").rglob("*.py")) for p in _file_pieces(file.read_text())]
    scores = []
    for reference in references:
        for _, tokens, runs in pieces:
            if similarity(reference, tokens) > 0:
                scores.append((similarity(reference, tokens), _at_most(_runs(reference), runs, len(reference)),
                               _shared_run_bound(Counter(_runs(reference)), runs, len(reference))))
    assert max(score for score, _, _ in scores) >= LEAK_THRESHOLD  # the originals, found
    assert len(scores) > 20 and all(looser >= bound >= score for score, bound, looser in scores), scores
    # and they are what make the check cheap: most pairs have some common run, few most of one
    assert sum(bound < LEAK_THRESHOLD for _, bound, _ in scores) > len(scores) / 2
    assert sum(looser < LEAK_THRESHOLD for _, _, looser in scores) > len(scores) / 4


def test_the_trees_bytecode_covers_the_unchanged_files_only_and_follows_their_source(tmp_path, monkeypatch):
    """Sandbox.place_tree writes compiled bytecode for the copy's own files (a check's child then
    need not compile every module it imports), never for the student's, and checked against each
    source's hash: a source changed after it was compiled (same size, same second) is compiled
    afresh, never run from the stale bytecode."""
    from importlib.util import cache_from_source

    from assignments import sandbox

    monkeypatch.setattr(sandbox, "_TREES", [1])  # as a batch's second tree
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "__init__.py").write_text("X = 1\n")
    (tree / "pkg" / "student.py").write_text("Y = 2\n")
    sandbox.write_bytecode(tree, skip={"pkg/student.py"})
    ours, theirs = (Path(cache_from_source(str(tree / "pkg" / f))) for f in ("__init__.py", "student.py"))
    assert ours.exists() and not theirs.exists()
    assert int.from_bytes(ours.read_bytes()[4:8], "little") == 0b11  # PEP 552: hash-based, checked

    def imported(code):
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        done = subprocess.run([sys.executable, "-v", "-c", code], cwd=tree, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip(), str(ours) in done.stderr  # -v names the bytecode it ran

    assert imported("import pkg; print(pkg.X)") == ("1", True)
    (tree / "pkg" / "__init__.py").write_text("X = 7\n")
    assert imported("import pkg; print(pkg.X)") == ("7", False)


def test_the_students_copy_starts_at_the_assignment(tmp_path):
    """The copy's README.md is the student's front page: what to write (each function, its file),
    how to check, what to submit, what was taken out; the project's README moves aside, and a
    function taken out says, when the project's commands reach it, that README.md says what to write."""
    greedy = ASSIGNMENTS["greedy_speculative"]
    out = tmp_path / "copy"
    make(list(greedy.functions), out, assignment="greedy_speculative", ship_visible=False)
    front = (out / "README.md").read_text()
    assert front.startswith("# Assignment `greedy_speculative`: your copy of the project")
    assert "`speculative_sampling_greedy` in `spec_decoding/algorithms/greedy.py`" in front
    assert "python -m assignments check" in front and "`spec_decoding/algorithms/greedy.py`." in front
    assert "`speculative_sampling`" in front.split("**Taken out of this copy**")[1]
    assert f"]({greedy.readme})" in front and (out / greedy.readme).is_file()
    assert (out / "README_project.md").read_text() == (ROOT / "README.md").read_text()
    removed = (out / "spec_decoding" / "algorithms" / "speculative.py").read_text()
    assert "removed in this assignment" in removed and "README.md says what is yours to write" in removed


@pytest.mark.parametrize("error, named", [
    ("raised ValueError: idx has no tokens (T = 0): feed at least one token at gpt2/model.py:161",
     "a forgotten roll_back(target_cache, drafter, len(tokens))"),
    ("raised IndexError: list index out of range at spec_decoding/algorithms/greedy.py:57",
     "a forgotten roll_back(target_cache, drafter, len(tokens))"),
    ("raised ValueError: The KV cache holds 40 positions and has room for 40; 3 more don't fit",
     "a cache made too small for prompt + max_gen"),
    ("raised ValueError: KVCache.truncate(5): length must be between 0 and the current length 0 at gpt2/kv_cache.py:38",
     "the target's KV cache was not advanced"),
    ("did not finish within 60 s (an endless loop? a very slow loop?)",
     "the bonus when every draft token was kept"),
])
def test_a_crash_or_a_hang_of_the_greedy_loop_names_the_usual_mistake(error, named):
    """greedy_speculative's checks add the mistake behind a run that crashed or hung to its message
    (the forgotten roll_back, a cache not advanced, a cache too small, a round that adds no token); another error is
    shown as it is, and a run without an error has no message to add to."""
    from assignments.grade import with_hint
    for check in ASSIGNMENTS["greedy_speculative"].checks:
        assert with_hint(check, error).startswith(error) and named in with_hint(check, error)
        assert with_hint(check, "raised KeyError: 'x'") == "raised KeyError: 'x'"
        assert with_hint(check, None) is None
