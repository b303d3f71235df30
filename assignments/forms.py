"""What a probe may send back: each check declares the exact form of its values, and the grader
reads them against it, in its own process, before any judge sees them (parse, don't trust).

The student's code controls everything its child process writes: it can replace json.dumps, send
[] for a list of twelve values, NaN for a logit, 5 for a text, a list nested 100,000 deep. So:
- parse(data) refuses an answer nested deeper than MAX_DEPTH, or holding more than
  MAX_CONTAINERS lists and objects, before json.loads sees it (the decoder recurses: a deep answer
  would raise RecursionError in the grader; a flood of {} would cost it gigabytes);
- read(form, values) checks every value: exact types (a bool is not an int, 3.0 is not a token
  id), finite numbers in range, lists of exactly the length asked for (a judge's zip never stops
  early), texts of bounded length, nesting no deeper than the form. Anything else is Failed with
  a message saying what was wrong and where ("values[2]: sent 0 values for 24 tokens").

A check's form is a function (inputs, reference) -> Form, so lengths and shapes follow its inputs
and its reference (definition.Check.form).
"""

import json
import math
from dataclasses import dataclass
from itertools import accumulate

from .definition import Failed

MAX_DEPTH = 32  # no form nests deeper; an answer that does is refused before json.loads
MAX_CONTAINERS = 200_000  # lists and objects in one answer (the largest form holds about 5,000)
MAX_TEXT = 4000  # characters of any text a probe sends back
MAX_LIST = 1_000_000  # items of a list whose length the form leaves open
BIG = 1e12  # numbers beyond this are out of range unless a form says otherwise


class Malformed(Failed):
    """The values are not of the check's form: the student's, never the grader's, fault."""


def parse(data: bytes | str) -> object:
    """The child's answer as Python values; ValueError (never RecursionError) if it is not JSON
    or nests deeper than MAX_DEPTH."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    brackets = _brackets(data)
    if max(accumulate(memoryview(brackets).cast("b")), default=0) > MAX_DEPTH:
        raise ValueError(f"nested more than {MAX_DEPTH} lists or objects deep")
    if brackets.count(1) > MAX_CONTAINERS:  # millions of {} would cost the grader gigabytes to build
        raise ValueError(f"more than {MAX_CONTAINERS:,} lists and objects")
    try:
        return json.loads(data)
    except RecursionError:  # cannot happen below MAX_DEPTH; kept so that parsing never raises it
        raise ValueError("nested too deep") from None


_BRACKETS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_OTHERS = bytes(set(range(256)) - set(b"[{]}"))


def _brackets(data: bytes) -> bytes:
    """The JSON text's brackets outside strings, each opening one as 1, each closing one as -1
    (0xff), in linear passes at C speed: escapes dropped (an escaped backslash first, then an
    escaped quote), then the text between quotes. (A regular expression for strings backtracks
    quadratically on a run of escaped quotes.)"""
    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b"".join(unescaped.split(b'"')[::2]).translate(_BRACKETS, _OTHERS)


def depth_of(data: bytes) -> int:
    """How deep the JSON text's lists and objects nest (brackets inside strings do not count)."""
    return max(accumulate(memoryview(_brackets(data)).cast("b")), default=0)


def _kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, str):
        return f"the text {value[:40]!r}" + ("..." if len(value) > 40 else "")
    text = repr(value)
    return f"{text[:40]} ({type(value).__name__})"


def _path(where: tuple) -> str:
    return "values" + "".join(f"[{key!r}]" if isinstance(key, str) else f"[{key}]" for key in where)


class Form:
    """One place of the values: check(value, where) raises Malformed, or returns None."""

    def check(self, value, where: tuple) -> None:
        raise NotImplementedError

    def fail(self, where: tuple, problem: str):
        raise Malformed(f"{_path(where)}: {problem}")


@dataclass(frozen=True)
class Int(Form):
    """A whole number (int exactly: not a bool, not 3.0) in [lo, hi]."""
    lo: int = -2**62
    hi: int = 2**62
    what: str = "a whole number"

    def check(self, value, where):
        if type(value) is not int:
            self.fail(where, f"sent {_kind(value)} where {self.what} was expected")
        if not self.lo <= value <= self.hi:
            self.fail(where, f"{value} is out of range: {self.what} between {self.lo} and {self.hi} was expected")


@dataclass(frozen=True)
class Real(Form):
    """A finite number (int or float exactly, not a bool) in [lo, hi]."""
    lo: float = -BIG
    hi: float = BIG
    what: str = "a number"

    def check(self, value, where):
        if type(value) not in (int, float):
            self.fail(where, f"sent {_kind(value)} where {self.what} was expected")
        if not math.isfinite(value):
            self.fail(where, f"{value} is not a finite number ({self.what} was expected)")
        if not self.lo <= value <= self.hi:
            self.fail(where, f"{value} is out of range: {self.what} between {self.lo:g} and {self.hi:g} was expected")


@dataclass(frozen=True)
class Bool(Form):
    what: str = "true or false"

    def check(self, value, where):
        if type(value) is not bool:
            self.fail(where, f"sent {_kind(value)} where {self.what} was expected")


@dataclass(frozen=True)
class Text(Form):
    """A string of at most max_len characters; one of `choices` if given."""
    max_len: int = MAX_TEXT
    choices: tuple = ()
    what: str = "a text"

    def check(self, value, where):
        if type(value) is not str:
            self.fail(where, f"sent {_kind(value)} where {self.what} was expected")
        if len(value) > self.max_len:
            self.fail(where, f"a text of {len(value):,} characters (at most {self.max_len:,})")
        if self.choices and value not in self.choices:
            self.fail(where, f"{value[:40]!r} is not one of {', '.join(map(repr, self.choices))}")


@dataclass(frozen=True)
class Maybe(Form):
    """null, or a value of `form`."""
    form: Form

    def check(self, value, where):
        if value is not None:
            self.form.check(value, where)


@dataclass(frozen=True)
class List(Form):
    """A list of `item`s: exactly `length` of them, or (length None) between at_least and at_most.
    what: the words for the items ("tokens", "samples", "inputs")."""
    item: Form
    length: int | None = None
    at_least: int = 0
    at_most: int = MAX_LIST
    what: str = "values"

    def check(self, value, where):
        if type(value) is not list:
            self.fail(where, f"sent {_kind(value)} where a list of {self.what} was expected")
        n = len(value)
        if self.length is not None and n != self.length:
            self.fail(where, f"sent {n} values for {self.length} {self.what}")
        if self.length is None and not self.at_least <= n <= self.at_most:
            self.fail(where, f"sent {n} {self.what}, expected between {self.at_least} and {self.at_most}")
        for i, x in enumerate(value):
            self.item.check(x, where + (i,))


@dataclass(frozen=True)
class Tuple(Form):
    """A list of exactly len(items) values, the i-th of form items[i]."""
    items: tuple
    what: str = "values"

    def check(self, value, where):
        if type(value) is not list:
            self.fail(where, f"sent {_kind(value)} where a list of {len(self.items)} {self.what} was expected")
        if len(value) != len(self.items):
            self.fail(where, f"sent {len(value)} values for {len(self.items)} {self.what}")
        for i, (form, x) in enumerate(zip(self.items, value)):
            form.check(x, where + (i,))


@dataclass(frozen=True)
class Record(Form):
    """An object with exactly these keys, each of its form."""
    fields: dict

    def check(self, value, where):
        if type(value) is not dict:
            self.fail(where, f"sent {_kind(value)} where an object with {', '.join(self.fields)} was expected")
        if set(value) != set(self.fields):
            missing, extra = set(self.fields) - set(value), set(value) - set(self.fields)
            self.fail(where, "the keys are not " + ", ".join(self.fields) + (
                f" (missing {', '.join(sorted(missing))})" if missing else "") + (
                f" (unexpected {', '.join(sorted(map(str, extra))[:5])})" if extra else ""))
        for key, form in self.fields.items():
            form.check(value[key], where + (key,))


def Tensor(shape, lo: float = -BIG, hi: float = BIG) -> Form:
    """Nested lists of finite numbers of this shape (a tuple of ints; None: any length up to
    MAX_LIST, which keeps the ndim)."""
    form = Real(lo, hi)
    for size in reversed(shape):
        form = List(form, size, what="numbers") if size is not None else List(form, what="numbers")
    return form


def shape_of(reference) -> tuple:
    """The shape of a reference tensor sent as nested lists ([] is (0,))."""
    shape = []
    while isinstance(reference, list):
        shape.append(len(reference))
        reference = reference[0] if reference else None
    return tuple(shape)


def like(reference, lo: float = -BIG, hi: float = BIG) -> Form:
    """Finite numbers in exactly the reference tensor's shape."""
    return Tensor(shape_of(reference), lo, hi)


def Tokens(length: int | None, vocab: int, at_most: int = 1024, what: str = "tokens") -> Form:
    """A list of token ids below vocab: exactly `length` of them, or (None) at most at_most."""
    token = Int(0, vocab - 1, "a token id")
    return List(token, length, what=what) if length is not None else List(token, at_most=at_most, what=what)


def Samples(inputs, vocab: int, at_most: int | None = None) -> Form:
    """inputs["samples"] generated samples of exactly inputs["n_tokens"] token ids each (or, with
    at_most, between n_tokens and at_most of them: the first n_tokens are counted)."""
    n = inputs["n_tokens"]
    sample = Tokens(n, vocab) if at_most is None else List(Int(0, vocab - 1, "a token id"), at_least=n,
                                                           at_most=at_most, what="tokens")
    return List(sample, inputs["samples"], what="samples")


def read(form: Form, values):
    """The values if they are of the form, else Malformed (a Failed) saying what and where."""
    try:
        form.check(values, ())
    except RecursionError:  # deeper than any form: unreachable through parse, kept for direct callers
        raise Malformed("values: nested too deep") from None
    return values
