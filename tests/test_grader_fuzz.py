"""Every judge fuzzed: for each check of each assignment, hostile values sent back (empty,
truncated, extended, NaN and infinities, wrong types, bools for ints, floats for token ids, huge,
nested deeper, near misses, arbitrary JSON) never score, the instructor's own values always score
full (also when moved within the check's tolerance), and reading and judging them never raises
anything but Failed.

The judges are called directly, as grade.judge calls them (forms.read, then the judge), on values
computed once per session with the instructor's code (a module fixture), not through the sandbox:
the instructor's values are computed once (the fixture), each judgement costs milliseconds.
Before assignments/forms.py, a judge that compared with zip(got, ref) gave full marks to [], and
NaN keys passed kv_update's `diff > 1e-6`: run with forms.read made a no-op and
tokens_per_round's zip non-strict, this file fails (emptied and shortened lists pass
tokens_per_round; kv_cache's judges raise TypeError on a None).
"""

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from assignments.definition import ChildRun, Failed
from assignments.forms import MAX_CONTAINERS, MAX_DEPTH, depth_of, parse, read
from assignments.grade import judge as grade_judge
from assignments.references import HIDDEN_SEED, make_data
from assignments.registry import ASSIGNMENTS
from assignments.serving import serve_here

CHECKS = [(a.name, c.name) for a in ASSIGNMENTS.values() for c in a.checks]
SMALLER = {"rounds": 400, "samples": 120}  # fewer draws than a grade: the same judges, faster

# Values a judge does not decide on, or decides on only in aggregate; a change there may pass.
# (check, path test) for any change: diagnostics, or values a judge never reads.
FREE_ANY = {
    "greedy_equals_target": lambda p: "sources" in p,  # only explain a wrong token
    "greedy_unrelated_draft": lambda p: "sources" in p,
    "greedy_caches": lambda p: "snapshots" in p,  # judged only where the sequence is the reference's
    "bug_fixed": lambda p: p[:1] == ("speed",) or p[:3] in {("eos", i, 0) for i in range(8)}
    or (p[:1] == ("samples",) and len(p) >= 2),  # statistics; tokens past the first n are not counted
}
# statistical checks: one value among hundreds of draws changed still follows the law
STATISTICAL = {"first_token", "bonus_token", "acceptance_rate", "second_token", "point_mass_draft", "lossless",
               "multi_draft_output", "multi_draft_one_child", "multi_draft_all_rejected", "tree_lossless",
               "ngram_lossless"}


class Genuine(dict):
    def __repr__(self):  # hypothesis prints a failing example's arguments: not these tables
        return f"<the instructor's values for {len(self)} checks>"


@pytest.fixture(scope="module")
def genuine(shared):
    """{check: (inputs, reference, the instructor's values, what the server counted)} at one hidden
    seed, computed with the instructor's code (in one worker's process: `shared`)."""
    return Genuine(shared("grader-fuzz-genuine", instructors_values))


def instructors_values(folder) -> dict:
    import torch

    torch.set_num_threads(1)
    data = make_data(folder / "data")
    out = {}
    for assignment in ASSIGNMENTS.values():
        for check in assignment.checks:
            inputs = check.make_inputs(HIDDEN_SEED)
            inputs.update({key: small for key, small in SMALLER.items() if key in inputs})
            reference = json.loads(json.dumps((check.reference or check.probe)(inputs, data)))
            server = check.serve(inputs, reference, data) if check.serve else None
            serve_here(server)
            try:
                got = json.loads(json.dumps(check.probe(inputs, data)))
            finally:
                serve_here(None)
            out[check.name] = (inputs, reference, got, server.record() if server else {})
    return out


def verdict(check, entry, values) -> tuple[bool, str]:
    """(passed, message) as grade.judge decides it, with no exception but Failed caught: anything
    else is a judge that raised, and fails the test."""
    inputs, reference, _, served = entry
    try:
        got = read(check.form(inputs, reference), values)
        check.judge(inputs, reference, got, *([served] if check.serve else []))
    except Failed as failure:
        return False, str(failure)
    return True, "ok"


def paths(values, where=()):
    """Every place in the values: (path, value), containers included."""
    yield where, values
    if isinstance(values, list):
        for i, v in enumerate(values):
            yield from paths(v, where + (i,))
    elif isinstance(values, dict):
        for k, v in values.items():
            yield from paths(v, where + (k,))


def replaced(values, where, new):
    """A copy of values with the place `where` set to new (only the containers on the way copied)."""
    if not where:
        return new
    head, rest = where[0], where[1:]
    copy = list(values) if isinstance(values, list) else dict(values)
    copy[head] = replaced(values[head], rest, new)
    return copy


def structural(value) -> list:
    """Changes of form: each must fail wherever it is made (but in FREE_ANY places)."""
    out = [None, True, "5", {"x": 1}, [value], float("nan"), float("inf"), -float("inf")]
    if isinstance(value, list):
        out += [[], value[:-1], value + value[-1:] if value else [0], value + value]
    if type(value) is int:
        out += [float(value), 2**70, -2**70, bool(value % 2)]
    if type(value) is float:
        out += [1e300, -1e300, str(value)]
    if type(value) is bool:
        out += [int(value)]
    if isinstance(value, str):
        out += [len(value), "x" * 100_000]
    return [v for v in out if not (type(v) is type(value) and v == value)]


def near_misses(value) -> list:
    """Changes of value beyond every check's tolerance (1e-4 absolute is the loosest)."""
    if type(value) is bool:
        return [not value]
    if type(value) is int:
        return [value + 1, value - 1]
    if type(value) is float:
        return [value + 1e-3 + abs(value) * 1e-3, value - 1e-3 - abs(value) * 1e-3]
    if type(value) is str:
        return [value + "x", value[:-1]] if value else ["x"]
    return []


def within_tolerance(value) -> list:
    """A float moved by far less than any check's tolerance: the same answer."""
    return [value * (1 + 1e-12)] if type(value) is float else []


def check_of(name):
    return next(c for a in ASSIGNMENTS.values() for c in a.checks if c.name == name)


@pytest.mark.parametrize("assignment,name", CHECKS)
def test_the_instructors_values_score_full(genuine, assignment, name):
    """The reference passes, through grade.judge too; and moved within tolerance it still does."""
    check, entry = check_of(name), genuine[name]
    assert verdict(check, entry, entry[2]) == (True, "ok")
    result = grade_judge(check, entry[0], entry[1], ChildRun(values=entry[2], served=entry[3]))
    assert result.passed and result.points == check.points
    moved = entry[2]
    for where, value in paths(entry[2]):
        for new in within_tolerance(value):
            moved = replaced(moved, where, new)
    assert verdict(check, entry, moved) == (True, "ok"), name


@pytest.mark.parametrize("assignment,name", CHECKS)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_a_changed_value_never_scores(genuine, assignment, name, data):
    """One place of the instructor's values changed: a change of form anywhere, or a near miss
    where the judge decides (not in a statistical check's draws), scores nothing."""
    check, entry = check_of(name), genuine[name]
    places = list(paths(entry[2]))
    where, value = data.draw(st.sampled_from(places), label="place")
    free = FREE_ANY.get(name, lambda p: False)(where)
    kind = data.draw(st.sampled_from(["structural", "near miss"]), label="kind")
    options = structural(value) if kind == "structural" else near_misses(value)
    if not options:
        return
    new = data.draw(st.sampled_from(options), label="new value")
    passed, message = verdict(check, entry, replaced(entry[2], where, new))
    draws = name in STATISTICAL and len(where) >= 2 and kind == "near miss"
    if not (free or draws):
        assert not passed, (name, where, value, new)
    result = grade_judge(check, entry[0], entry[1], ChildRun(values=replaced(entry[2], where, new), served=entry[3]))
    assert result.passed == passed and (result.points == 0) == (not passed)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30)


@pytest.mark.parametrize("assignment,name", CHECKS)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(values=JSON)
def test_arbitrary_json_never_scores(genuine, assignment, name, values):
    check = check_of(name)
    assert verdict(check, genuine[name], values)[0] is False


@pytest.mark.parametrize("assignment,name", CHECKS)
def test_empty_short_and_deep_answers_score_nothing_with_a_message(genuine, assignment, name):
    """The issue's attacks on every check: every list sent back empty (json.dumps replaced in the
    child), one value short, a list nested far deeper than the form."""
    check, entry = check_of(name), genuine[name]

    def emptied(values):
        if isinstance(values, list):
            return []
        if isinstance(values, dict):
            return {k: emptied(v) for k, v in values.items()}
        return "" if isinstance(values, str) else values

    deep = []
    for _ in range(100_000):  # built without recursion; json.loads would have raised RecursionError
        deep = [deep]
    hostiles = [deep, 0, None, "all pass"] + ([emptied(entry[2])] if emptied(entry[2]) != entry[2] else [])
    for hostile in hostiles:
        passed, message = verdict(check, entry, hostile)
        assert not passed and message, (name, message)
    if isinstance(entry[2], list) and len(entry[2]) > 1:
        passed, message = verdict(check, entry, entry[2][:-1])
        assert not passed and f"sent {len(entry[2]) - 1} values for {len(entry[2])}" in message, message


def _depth(value) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


def test_parsing_refuses_deep_nesting_before_json_loads():
    """100,000-deep nesting (which made json.loads raise RecursionError in the grader) is a
    ValueError with the limit; brackets inside strings do not count; MAX_DEPTH itself parses."""
    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(ValueError, match=f"more than {MAX_DEPTH}"):
        parse(b'{"values": ' + deep + b"}")
    assert depth_of(b'{"values": "[[[[[[", "x": [[1]]}') == 3
    for nested in (["a\"[[", [["\\"], "]"]], ["\\[", ["\\\"[[", "{"]], {"k\"": [{"[": "\\\\"}]}):
        text = json.dumps(nested).encode()
        assert depth_of(text) == _depth(nested), text  # escaped quotes and backslashes in strings
    # a run of escaped quotes, 16 MB: linear passes, no backtracking (a regular expression for
    # strings took 2 s for 10 kB and 4 times as long for twice as many here)
    assert depth_of(b'"' + b'\\"' * 8_000_000) == 0
    assert parse("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    with pytest.raises(ValueError):
        parse(b'{"values": [1, 2')  # truncated
    with pytest.raises(ValueError, match=f"more than {MAX_CONTAINERS:,} lists and objects"):
        parse(b'{"values": [' + b"{}," * MAX_CONTAINERS + b"{}]}")
    assert len(parse(b'{"values": [' + b"[]," * (MAX_CONTAINERS - 3) + b"[]]}")["values"]) == MAX_CONTAINERS - 2


def test_messages_say_what_was_wrong():
    """The words a student reads: how many values for how many inputs, which value is NaN, a bool
    where a whole number was expected."""
    from assignments.forms import Int, List, Real, Tokens

    with pytest.raises(Failed, match=r"values: sent 0 values for 12 tokens"):
        read(Tokens(12, 100), [])
    with pytest.raises(Failed, match=r"values\[3\]: nan is not a finite number"):
        read(List(Real(), 5), [0.0, 1.0, 2.0, math.nan, 4.0])
    with pytest.raises(Failed, match=r"values\[0\]: sent True \(bool\) where a token id was expected"):
        read(Tokens(1, 100), [True])
    with pytest.raises(Failed, match=r"values\[0\]: sent 3.0 \(float\) where a whole number was expected"):
        read(List(Int(), 1), [3.0])
