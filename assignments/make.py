"""`make`: copy the project with some functions' bodies replaced by `raise NotImplementedError`.

Done on the syntax tree: the `ast` module finds each function (its signature, docstring and body
lines), and only the body's lines are replaced in the file's text, so comments, formatting and
everything else stay as they are. The teaching code needs no markers.
"""

import ast
import difflib
import functools
import json
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .definition import AssignmentError

ROOT = Path(__file__).resolve().parents[1]  # the project: the folder holding gpt2/ and spec_decoding/
MANIFEST = ".assignment.json"  # written into the student's copy: what was removed, for `grade`
SHIPPED = ".assignment"  # in the copy: the visible checks' inputs and reference values, their checkpoints
# Left out of every copy: the instructor's tests (they re-implement and exercise the code), the
# instructor's notes and guide.
# (benchmarks/demo_class.py: the instructor's class of generated submissions, made from the
# reference solution's own bodies)
ALWAYS_DROPPED = ("tests", "docs/instructor_guide.md", "assignments/*/instructor.md", "benchmarks/demo_class.py")
# Helpers of the checks' reference computations (besides each check's `reference` itself).
REFERENCE_HELPERS = ("assignments.greedy_speculative.served_reference",)
LEAK_THRESHOLD = 0.7  # share of a stripped body's normalised syntax found, in order, in another function
LEAK_MIN_TOKENS = 25  # bodies shorter than this are too generic to compare
# Not copied: version control, caches, run outputs.
IGNORE = shutil.ignore_patterns(".git", "__pycache__", "*.pyc", ".pytest_cache", ".ipynb_checkpoints",
                                "runs", "*.egg-info", "build", "dist", ".venv", "venv")
# Not copied from the project either: its local checkpoints (benchmarks keep gigabytes of stand-ins
# in checkpoints/).
LOCAL_CHECKPOINTS = shutil.ignore_patterns("checkpoints", "*.safetensors")


def copy_ignore(root: Path):
    """shutil.copytree's `ignore` for copying the project at `root`: IGNORE, LOCAL_CHECKPOINTS and
    every path git ignores there (its .gitignore and the user's own excludes), so that what a user
    made in their checkout (a virtualenv, downloaded models, outputs) stays out of a student's
    copy. Outside a git checkout (or without git): IGNORE and LOCAL_CHECKPOINTS."""
    root = Path(root).resolve()
    try:
        listed = subprocess.run(["git", "-C", str(root), "ls-files", "--others", "--ignored", "--exclude-standard",
                                 "--directory", "-z"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        listed = None
    ignored = ({root / p.rstrip("/") for p in listed.stdout.split("\0") if p}
               if listed is not None and listed.returncode == 0 else set())

    def ignore(directory: str, names: list[str]) -> set[str]:
        return (set(IGNORE(directory, names)) | set(LOCAL_CHECKPOINTS(directory, names))
                | {n for n in names if Path(directory).resolve() / n in ignored})
    return ignore


@dataclass
class Target:
    name: str  # the dotted name as given, e.g. gpt2.kv_cache.KVCache.truncate
    file: str  # relative to the project root, e.g. gpt2/kv_cache.py
    qualname: str  # inside the module, e.g. KVCache.truncate
    node: ast.AST  # the function's FunctionDef


def _definitions(tree: ast.Module) -> dict[str, ast.AST]:
    """qualname -> node for every function, class and method defined in a module."""
    found = {}

    def visit(body, prefix):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found[prefix + node.name] = node
                if isinstance(node, ast.ClassDef):
                    visit(node.body, prefix + node.name + ".")

    visit(tree.body, "")
    return found


@functools.lru_cache(maxsize=256)
def _parsed(text: str, filename: str) -> ast.Module:
    """A source's syntax tree, never changed by its callers (cached: make resolves a dozen names in
    the same few files, every time it makes a copy)."""
    return ast.parse(text, filename=filename)


def resolve(name: str, root: Path = ROOT) -> Target:
    """The function a dotted name points to, or an AssignmentError saying why not."""
    parts = name.split(".")
    if not all(p.isidentifier() for p in parts):
        raise AssignmentError(f"{name!r} is not a dotted Python name (e.g. spec_decoding.algorithms.rejection.residual_distribution)")
    for i in range(len(parts), 0, -1):  # the longest prefix that is a module file
        module_path = Path(*parts[:i])
        if (root / module_path).is_dir() and (root / module_path / "__init__.py").is_file() and i == len(parts):
            raise AssignmentError(f"{name} is a package, not a function: name a function in one of "
                                  f"its modules, e.g. {_example(root / module_path, name)}")
        file = root / module_path.with_suffix(".py")
        if file.is_file():
            break
        file = root / module_path / "__init__.py"  # a function defined in a package's __init__.py
        if i < len(parts) and file.is_file() and parts[i] in _definitions(_parsed(file.read_text(), str(file))):
            break
    else:
        raise AssignmentError(f"{name}: no module {parts[0]!r} in the project ({root}); names start with "
                              f"the module's path, e.g. spec_decoding.algorithms.rejection.residual_distribution")
    rel = file.relative_to(root).as_posix()
    qualname = ".".join(parts[i:])
    definitions = _definitions(_parsed(file.read_text(), rel))
    functions = [q for q, n in definitions.items() if not isinstance(n, ast.ClassDef)]
    if not qualname:
        raise AssignmentError(f"{name} is a module, not a function: name a function in it, e.g. "
                              f"{name}.{functions[0] if functions else '...'}")
    node = definitions.get(qualname)
    if node is None:
        listing = ", ".join(functions[:12]) + (", ..." if len(functions) > 12 else "")
        raise AssignmentError(f"{name}: {'.'.join(parts[:i])} ({rel}) defines no function {qualname!r}. "
                              f"Its functions are: {listing or 'none'}")
    if isinstance(node, ast.ClassDef):
        methods = [q for q in functions if q.startswith(qualname + ".")]
        raise AssignmentError(f"{name} is a class, not a function: name the methods to remove, e.g. "
                              + ", ".join(f"{'.'.join(parts[:i])}.{m}" for m in methods[:4]))
    return Target(name, rel, qualname, node)


def _example(package_dir: Path, name: str) -> str:
    for file in sorted(package_dir.glob("*.py")):
        if file.name != "__init__.py":
            tree = ast.parse(file.read_text())
            for q, n in _definitions(tree).items():
                if isinstance(n, ast.FunctionDef) and "." not in q:
                    return f"{name}.{file.stem}.{q}"
    return f"{name}.<module>.<function>"


def strip_bodies(source: str, targets: list[Target], removed: tuple[str, ...] = (),
                 grader_only: tuple[str, ...] = ()) -> str:
    """The source with each target's body (after its docstring) replaced by one
    `raise NotImplementedError(...)` line. Targets named in `removed` (siblings that would answer
    the assignment) get a message saying they are not to be used; those in `grader_only` (the
    checks' reference computations) one saying they are the grader's."""
    lines = source.splitlines(keepends=True)
    # Bottom-up, so earlier line numbers stay valid.
    for t in sorted(targets, key=lambda t: t.node.lineno, reverse=True):
        body = t.node.body
        has_docstring = (isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                         and isinstance(body[0].value.value, str))
        rest = body[1:] if has_docstring else body
        first_body_line = body[0].lineno
        if first_body_line == t.node.lineno:
            raise AssignmentError(f"{t.name}: its body is on the same line as its def; put it on its own lines first")
        indent = lines[first_body_line - 1][:len(lines[first_body_line - 1]) - len(lines[first_body_line - 1].lstrip())]
        message = (f"{t.qualname}: removed in this assignment (it would answer it; write the assignment's "
                   f"functions without it). The project's commands that use it do not run in this copy: "
                   f"README.md says what is yours to write"
                   if t.name in removed else
                   f"{t.qualname}: the grader's reference, not in the student's copy" if t.name in grader_only
                   else f"{t.qualname}: your code here (see the docstring)")
        stub = f"{indent}raise NotImplementedError({message!r})\n"
        if rest:
            start, end = rest[0].lineno - 1, t.node.end_lineno
            # Comment lines right above the first statement belong to the body too.
            while start > (body[0].end_lineno if has_docstring else t.node.lineno) and lines[start - 1].strip().startswith("#"):
                start -= 1
        else:  # only a docstring: add the raise after it
            start = end = body[0].end_lineno
        lines[start:end] = [stub]
    return "".join(lines)


# ------------------------------------------------------------------------------------------------
# The leak check: is a stripped function's answer still somewhere in the copy?
# ------------------------------------------------------------------------------------------------

def _tokens(statements) -> list[str]:
    """A function body's syntax as a token list, with local names, constants and docstrings
    normalised away (renaming variables does not hide a copy); attribute names are kept."""
    tokens = []

    def visit(node):
        if isinstance(node, (ast.Load, ast.Store, ast.Del, ast.expr_context)):
            return
        if isinstance(node, ast.Attribute):
            tokens.append("." + node.attr)
        elif isinstance(node, ast.Constant):
            tokens.append("const")
        elif isinstance(node, ast.Name):
            tokens.append("name")
        else:
            tokens.append(type(node).__name__)
        for child in ast.iter_child_nodes(node):
            visit(child)

    for statement in statements:
        if not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
                or is_guard(statement)):
            visit(statement)
    return tokens


def is_guard(statement) -> bool:
    """`if <bad input>: raise ...`: input checking, which many functions share and no answer is
    made of (compared, it made a checked function look like any other with a similar guard)."""
    return (isinstance(statement, ast.If) and not statement.orelse
            and all(isinstance(s, ast.Raise) for s in statement.body))


def _pieces(tree: ast.Module):
    """(qualname, tokens) for every function in a module, and for each run of module-level
    statements (a notebook's cells)."""
    for qualname, node in _definitions(tree).items():
        if not isinstance(node, ast.ClassDef):
            yield qualname, _tokens(node.body)
    loose = [s for s in tree.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                                      ast.Import, ast.ImportFrom))]
    if loose:
        yield "<module-level code>", _tokens(loose)


# similarity() counts common runs of at least this many tokens
MIN_RUN = 6


def _runs(tokens: list[str]) -> list[int]:
    """Every run of MIN_RUN consecutive tokens, in order, as its hash (two runs that differ may
    share one: that only loosens the bound below, never makes it miss a leak)."""
    return [hash(tuple(tokens[i:i + MIN_RUN])) for i in range(len(tokens) - MIN_RUN + 1)]


@functools.lru_cache(maxsize=1024)
def _file_pieces(text: str) -> tuple:
    """(qualname, tokens, set of its runs) of each piece of a file's source (cached: copies of the
    project share almost every file)."""
    return tuple((q, tokens, frozenset(_runs(tokens))) for q, tokens in _pieces(ast.parse(text)))


def similarity(reference: list[str], other: list[str], matcher: difflib.SequenceMatcher | None = None) -> float:
    """The share of the reference's tokens found in `other` in the same order, in runs of at least
    MIN_RUN tokens (single common tokens such as a call or a name do not count). matcher: one
    already holding `other` as its second sequence (it indexes it once)."""
    if matcher is None:
        matcher = difflib.SequenceMatcher(None, autojunk=False)
        matcher.set_seq2(other)
    matcher.set_seq1(reference)
    return sum(b.size for b in matcher.get_matching_blocks() if b.size >= MIN_RUN) / max(len(reference), 1)


def _shared_run_bound(reference_counts: Counter, other_runs: frozenset, length: int) -> float:
    """A looser bound than _at_most, cheaper still: each position whose run `other` shares covers
    at most MIN_RUN tokens. reference_counts: how often each run occurs in the reference. One set
    intersection (in C) a pair, where _at_most loops over the reference's tokens in Python."""
    shared = reference_counts.keys() & other_runs
    return sum(reference_counts[run] for run in shared) * MIN_RUN / max(length, 1)


def _at_most(reference_runs: list[int], other_runs: frozenset, length: int) -> float:
    """An upper bound of similarity(), cheap: the share of the reference's tokens inside some run
    of MIN_RUN that `other` holds too. Every common block similarity() counts is made of such
    runs, so it never exceeds this; it costs one set lookup a token, where difflib's matching
    costs about a token times the other's length, and skips almost every pair."""
    covered_until, covered = 0, 0
    for i, run in enumerate(reference_runs):
        if run in other_runs:
            covered += i + MIN_RUN - max(i, covered_until)
            covered_until = i + MIN_RUN
    return covered / max(length, 1)


@dataclass
class Leak:
    function: str  # the stripped function
    where: str  # file:qualname in the copy
    similarity: float


def find_leaks(references: dict[str, list[str]], copy: Path, skip: set[tuple[str, str]]) -> list[Leak]:
    """Every function (or notebook code) in the copy whose syntax holds most of a stripped
    function's reference body. references: name -> tokens of the instructor's body."""
    compared = {}  # name -> (tokens, their runs in order, how often each run occurs)
    for name, tokens in references.items():
        if len(tokens) >= LEAK_MIN_TOKENS:
            runs = _runs(tokens)
            compared[name] = (tokens, runs, Counter(runs))
    leaks = []
    for file in sorted(copy.rglob("*.py")):
        rel = file.relative_to(copy).as_posix()
        if rel.startswith(SHIPPED):
            continue
        try:
            pieces = _file_pieces(file.read_text())
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for qualname, tokens, runs in pieces:
            if (rel, qualname) in skip:
                continue
            matcher = None
            for name, (reference, reference_runs, reference_counts) in compared.items():
                # two bounds of similarity(), the cheaper first: most pairs stop at one of them
                if (_shared_run_bound(reference_counts, runs, len(reference)) < LEAK_THRESHOLD
                        or _at_most(reference_runs, runs, len(reference)) < LEAK_THRESHOLD):
                    continue
                if matcher is None:
                    matcher = difflib.SequenceMatcher(None, autojunk=False)
                    matcher.set_seq2(tokens)
                score = similarity(reference, tokens, matcher)
                if score >= LEAK_THRESHOLD:
                    leaks.append(Leak(name, f"{rel}:{qualname}", score))
    return leaks


# ------------------------------------------------------------------------------------------------
# make
# ------------------------------------------------------------------------------------------------

def _drop(out: Path, patterns) -> list[str]:
    gone = []
    for pattern in patterns:
        for path in sorted(out.glob(pattern)):
            gone.append(path.relative_to(out).as_posix())
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return gone


def reference_functions() -> tuple[str, ...]:
    """The checks' reference computations (each check's `reference`, and their helpers): the
    grader's alone. make strips them from every copy, as it strips the student's functions, and
    the leak check looks for their bodies anywhere in it."""
    from .registry import ASSIGNMENTS

    names = {f"{c.reference.__module__}.{c.reference.__qualname__}"
             for a in ASSIGNMENTS.values() for c in a.checks if c.reference is not None}
    return tuple(sorted(names | set(REFERENCE_HELPERS)))


def refuse_a_students_copy(root: Path, command: str) -> None:
    """make and grade need the instructor's project: its reference code computes the answers."""
    if (Path(root) / MANIFEST).is_file():
        raise AssignmentError(f"{root} is a student's copy (it has {MANIFEST}): `{command}` needs the "
                              f"instructor's project, whose code computes the reference values. Inside a "
                              f"copy, run `python -m assignments check` (the visible checks).")


PROJECT_README = "README_project.md"  # in a student's copy: the project's own front page, moved aside


def front_page(definition, assignment: str | None, targets: list[Target], removed: list[Target],
               files: list[str]) -> str:
    """The README.md of a student's copy: what to write, how to check, how to submit, what was
    taken out; the assignment's own README and the project's come after, linked."""
    title = f"Assignment `{assignment}`" if assignment else "Your assignment"
    to_write = "\n".join(f"- `{t.qualname}` in `{t.file}`" for t in targets)
    taken = ", ".join(f"`{t.qualname}`" for t in removed)
    lines = [
        f"# {title}: your copy of the project",
        "",
        "This folder is the project with the functions below left for you to write. Each one raises",
        "`NotImplementedError(\"...: your code here\")` until you do; its signature and docstring are the",
        "specification." if not definition.plant else
        "specification. (Here the code is complete but holds a planted bug: find it and fix it.)",
        "",
        "**What to write**" if not definition.plant else "**Where the bug may be**",
        "",
        to_write,
        "",
        "**Check your work**: `python -m assignments check` runs the visible checks here, with messages that",
        "name the usual mistakes. The hidden checks run when your work is graded.",
        "",
        f"**Submit** these files, as your instructor says (Gradescope, GitHub Classroom or a folder): "
        f"{', '.join(f'`{f}`' for f in files)}.",
        "",
    ]
    if taken:
        lines += [f"**Taken out of this copy** because they would answer it: {taken}. The project's commands",
                  "that need them (the main script's sampling at `--temperature` above 0, for example) stop",
                  "with a message that says so; run what your functions make work instead.", ""]
    if definition.readme:
        lines += [f"The assignment in full: [{definition.readme}]({definition.readme}).", ""]
    lines += [f"The project's own README, whose commands assume the complete project: [{PROJECT_README}]({PROJECT_README}).", ""]
    return "\n".join(lines)


def write_front_page(out: Path, definition, assignment: str | None, targets: list[Target],
                     removed: list[Target]) -> None:
    """Move the copy's README.md to PROJECT_README and write front_page() in its place."""
    readme = out / "README.md"
    if readme.is_file():
        readme.rename(out / PROJECT_README)
    files = json.loads((out / MANIFEST).read_text())["files"]
    readme.write_text(front_page(definition, assignment, targets, removed, files))


def make(functions: list[str], out: Path, root: Path = ROOT, assignment: str | None = None,
         ship_visible: bool = True, allow_leaks: bool = False, student: str | None = None) -> list[Target]:
    """Copy the project at `root` into `out` (which must be empty or absent) with the named
    functions' bodies removed, and whatever else would answer them (the assignment's `removed`
    siblings and `dropped` files, the instructor's tests). Writes out/.assignment.json for the
    grader and, with ship_visible, the visible checks' inputs and reference values (computed with
    this project's code) in out/.assignment/. Refuses functions no check exercises, and (unless
    allow_leaks) a copy in which the leak check still finds a stripped function's body. student: a
    "find the bug" assignment's copy for this student (the bug the instructor's secret and the id
    pick: find_the_bug.bug_for); the manifest records the id."""
    from .registry import ASSIGNMENTS, custom_assignment

    if not functions:
        raise AssignmentError("name at least one function: --functions spec_decoding.algorithms.rejection.residual_distribution ...")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise AssignmentError(f"{out} exists and is not an empty folder: give a new or empty folder "
                              f"(nothing there is overwritten)")
    if out.resolve().is_relative_to(root.resolve()):
        raise AssignmentError(f"{out} is inside the project ({root}): put the student's copy elsewhere")
    refuse_a_students_copy(root, "make")
    targets = [resolve(name, root) for name in dict.fromkeys(functions)]
    definition = ASSIGNMENTS[assignment] if assignment else custom_assignment([t.name for t in targets])
    if student is not None and not definition.plant:
        raise AssignmentError(f"--student {student}: only a \"find the bug\" assignment makes a different copy "
                              f"per student")
    removed = [resolve(name, root) for name in definition.removed if name not in functions]
    grader_only = reference_functions()
    references = [resolve(name, root) for name in grader_only]
    stripped_targets = [] if definition.plant else targets  # a planted bug: the bodies stay
    by_file = {}
    for t in stripped_targets + removed + references:
        by_file.setdefault(t.file, []).append(t)
    stripped = {file: strip_bodies((root / file).read_text(), ts, definition.removed, grader_only)
                for file, ts in by_file.items()}
    for file, text in stripped.items():
        ast.parse(text, filename=file)  # the copy must still be valid Python
    shutil.copytree(root, out, ignore=copy_ignore(root), dirs_exist_ok=True)
    for file, text in stripped.items():
        (out / file).write_text(text)
    _drop(out, ALWAYS_DROPPED + tuple(definition.dropped))
    if definition.plant:
        try:
            definition.plant(out, root, *([student] if student is not None else []))
        except AssignmentError:
            shutil.rmtree(out)  # nothing half made is left
            raise
    manifest = {"assignment": assignment, "functions": [t.name for t in targets],
                "files": sorted({t.file for t in targets} | set(definition.answer_files))}
    if student is not None:
        manifest["student"] = student
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    write_front_page(out, definition, assignment, targets, removed)

    bodies = {t.name: _tokens(t.node.body) for t in stripped_targets + removed + references}
    leaks = find_leaks(bodies, out, skip={(t.file, t.qualname) for t in stripped_targets + removed + references})
    if leaks:
        listing = "\n".join(f"  {leak.function}: {leak.similarity:.0%} of its body is in {leak.where}"
                            for leak in leaks)
        if not allow_leaks:
            shutil.rmtree(out)
            raise AssignmentError(f"the copy still holds the answer (leak check, threshold "
                                  f"{LEAK_THRESHOLD:.0%}):\n{listing}\nAdd those to the assignment's "
                                  f"`removed` or `dropped`, or pass --allow-leaks to make it anyway. "
                                  f"Nothing was written.")
        print(f"WARNING: the copy still holds the answer (leak check):\n{listing}", file=sys.stderr)
    if ship_visible:
        from .references import VISIBLE_SEED, make_data, references

        data = make_data(out / SHIPPED / "data")
        refs = references(definition, data, VISIBLE_SEED, [c for c in definition.checks if c.visible])
        (out / SHIPPED / "visible.json").write_text(json.dumps(refs) + "\n")
    return targets
