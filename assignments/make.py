"""`make`: copy the project with some functions' bodies replaced by `raise NotImplementedError`.

Done on the syntax tree: the `ast` module finds each function (its signature, docstring and body
lines), and only the body's lines are replaced in the file's text, so comments, formatting and
everything else stay as they are. The teaching code needs no markers.
"""

import ast
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the project: the folder holding gpt2/ and spec_decoding/
MANIFEST = ".assignment.json"  # written into the student's copy: what was removed, for `grade`
# Not copied: version control, caches, run outputs.
IGNORE = shutil.ignore_patterns(".git", "__pycache__", "*.pyc", ".pytest_cache", ".ipynb_checkpoints",
                                "runs", "*.egg-info", "build", "dist", ".venv", "venv")


class AssignmentError(ValueError):
    """Bad input to make/grade: the message says what was wrong and how to fix it."""


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


def resolve(name: str, root: Path = ROOT) -> Target:
    """The function a dotted name points to, or an AssignmentError saying why not."""
    parts = name.split(".")
    if not all(p.isidentifier() for p in parts):
        raise AssignmentError(f"{name!r} is not a dotted Python name (e.g. spec_decoding.rejection.residual_distribution)")
    for i in range(len(parts), 0, -1):  # the longest prefix that is a module file
        module_path = Path(*parts[:i])
        if (root / module_path).is_dir() and (root / module_path / "__init__.py").is_file() and i == len(parts):
            raise AssignmentError(f"{name} is a package, not a function: name a function in one of "
                                  f"its modules, e.g. {_example(root / module_path, name)}")
        file = root / module_path.with_suffix(".py")
        if file.is_file():
            break
    else:
        raise AssignmentError(f"{name}: no module {parts[0]!r} in the project ({root}); names start with "
                              f"the module's path, e.g. spec_decoding.rejection.residual_distribution")
    rel = file.relative_to(root).as_posix()
    qualname = ".".join(parts[i:])
    definitions = _definitions(ast.parse(file.read_text(), filename=rel))
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


def strip_bodies(source: str, targets: list[Target]) -> str:
    """The source with each target's body (after its docstring) replaced by one
    `raise NotImplementedError(...)` line."""
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
        message = f"{t.qualname}: your code here (see the docstring)"
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


def make(functions: list[str], out: Path, root: Path = ROOT, assignment: str | None = None) -> list[Target]:
    """Copy the project at `root` into `out` (which must be empty or absent) with the named
    functions' bodies removed. Writes out/.assignment.json for the grader."""
    if not functions:
        raise AssignmentError("name at least one function: --functions spec_decoding.rejection.residual_distribution ...")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise AssignmentError(f"{out} exists and is not an empty folder: give a new or empty folder "
                              f"(nothing there is overwritten)")
    if out.resolve().is_relative_to(root.resolve()):
        raise AssignmentError(f"{out} is inside the project ({root}): put the student's copy elsewhere")
    targets = [resolve(name, root) for name in dict.fromkeys(functions)]
    by_file = {}
    for t in targets:
        by_file.setdefault(t.file, []).append(t)
    stripped = {file: strip_bodies((root / file).read_text(), ts) for file, ts in by_file.items()}
    for file, text in stripped.items():
        ast.parse(text, filename=file)  # the copy must still be valid Python
    shutil.copytree(root, out, ignore=IGNORE, dirs_exist_ok=True)
    for file, text in stripped.items():
        (out / file).write_text(text)
    manifest = {"assignment": assignment, "functions": [t.name for t in targets],
                "files": sorted(by_file)}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return targets
