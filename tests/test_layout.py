"""The floor plan: no module of the project imports, even lazily, a module that imports it back,
the rejection step stays a leaf the algorithms share, and only the comparisons with transformers
import it (a test-only reference).

Read from the source (the `ast` module), not by importing: every `import` counts, also those
inside functions, which is where a cycle usually hides ("import here: X imports this module").
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["gpt2", "offline", "spec_decoding", "benchmarks", "assignments"]
SCRIPTS = ["benchmark.py", "spec_decoding_generate.py"]


def project_modules(root: Path = ROOT, packages=PACKAGES, scripts=SCRIPTS) -> dict[str, Path]:
    """Dotted module name -> file, for the project's own code (a package is its __init__.py)."""
    modules = {Path(s).stem: root / s for s in scripts}
    for package in packages:
        for file in sorted((root / package).rglob("*.py")):
            parts = file.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return modules


def nodes_of(file: Path, at_import: bool = False):
    """Every node of the file's syntax tree; at_import: only those run when it is imported (a
    function's body, imports included, waits for its first call)."""
    todo = [ast.parse(file.read_text(), filename=str(file))]
    while todo:
        node = todo.pop()
        if at_import and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def imports_of(name: str, file: Path, modules: dict, at_import: bool = False) -> set[str]:
    """The project modules that `name` imports anywhere in its file (at_import: when imported)."""
    package = name if file.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in nodes_of(file, at_import):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from .x import y, from . import x
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import sub` imports the submodule pkg.sub when there is one
            candidates = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                          for alias in node.names]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in modules:  # import a.b.c of a module a.b
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                found.add(candidate)
    return found


def import_graph(modules: dict) -> dict[str, set[str]]:
    return {name: imports_of(name, file, modules) for name, file in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle [a, b, ..., a], or None (depth-first search, white/grey/black)."""
    state, stack = {}, []

    def visit(node):
        state[node] = "grey"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "grey":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = "black"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycles():
    modules = project_modules()
    assert {"spec_decoding.algorithms.rejection", "spec_decoding.presentation.trace_page", "offline.train_pair"} <= set(modules)
    cycle = find_cycle(import_graph(modules))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_walk_finds_a_planted_cycle_even_a_lazy_one(tmp_path):
    """The test above can fail: a package whose a imports b at the top and b imports a inside a
    function (the usual way a cycle is dodged) is reported."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from .b import f\n")
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    from pkg import a\n    return a\n")
    (tmp_path / "pkg" / "c.py").write_text("import pkg.a\nfrom . import b\n")
    modules = project_modules(tmp_path, ["pkg"], [])
    graph = import_graph(modules)
    assert graph["pkg.c"] == {"pkg.a", "pkg.b"}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    return 1\n")
    assert find_cycle(import_graph(project_modules(tmp_path, ["pkg"], []))) is None


@pytest.mark.parametrize("module, allowed", [
    # the rejection step: torch and the sampling helpers only, so every generator can use it
    ("spec_decoding.algorithms.rejection", {"spec_decoding.sampling"}),
    # what the generators report: nothing of the project
    ("spec_decoding.result", set()),
    # the loop measure: the benchmark, the script and the README's test share it
    ("spec_decoding.presentation.loops", set()),
])
def test_leaf_modules_stay_leaves(module, allowed):
    modules = project_modules()
    assert imports_of(module, modules[module], modules) <= allowed


# The model a learner opens: these files hold it, and none of them imports the speed machinery
# (gpt2/speed/) at all; gpt2.speed.accelerate (or a speed option of load_gpt2) is the one step
# that brings it in.
MODEL_MODULES = {"gpt2.config", "gpt2.model", "gpt2.kv_cache", "gpt2.tokenizer"}


def test_the_model_folder_holds_the_model():
    modules = project_modules()
    top_level = {name for name in modules if name.startswith("gpt2.") and name.count(".") == 1}
    assert top_level == MODEL_MODULES | {"gpt2.checkpoints", "gpt2.loading", "gpt2.speed"}, (
        "gpt2/ holds the model; speed machinery goes in gpt2/speed/: " + ", ".join(sorted(top_level)))
    for name in MODEL_MODULES:
        speed = {m for m in imports_of(name, modules[name], modules) if m.startswith("gpt2.speed")}
        assert not speed, f"{name} imports {speed}: the model must not need the speed machinery"


def libraries_imported_on_import(file: Path) -> set[str]:
    """The top-level names of what `file` imports when it is imported, other than relative imports."""
    found = set()
    for node in nodes_of(file, at_import=True):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.add(node.module.split(".")[0])
    return found


# Imported only by the code that needs them: each costs every process that imports the project
# (every check a grader forks, every script run) a noticeable part of a second.
HEAVY = {"triton", "matplotlib", "transformers"}


def heavy_imports_on_import(start: list[str], modules: dict) -> dict[str, set[str]]:
    """Module -> the heavy libraries it imports when imported, over every project module that
    importing `start` imports (followed through module-level imports only)."""
    todo, seen, heavy = list(start), set(), {}
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            heavy[name] = libraries_imported_on_import(modules[name]) & HEAVY
            todo += imports_of(name, modules[name], modules, at_import=True)
    return heavy


def test_importing_the_project_does_not_import_heavy_libraries():
    """What `import gpt2, spec_decoding` and the grader's forked checks load when imported: none
    of it imports Triton, matplotlib or transformers (only the functions that use them do)."""
    found = heavy_imports_on_import(["gpt2", "spec_decoding", "assignments.registry", "assignments.runner"],
                                    project_modules())
    assert "spec_decoding.algorithms.speculative" in found and "gpt2.model" in found  # the walk reaches the project
    assert {name: libs for name, libs in found.items() if libs} == {}


def test_importing_gpt2_and_spec_decoding_imports_no_speed_machinery():
    """`import gpt2, spec_decoding` brings in the model and the algorithms, not gpt2/speed/: a
    learner's process runs gpt2/model.py as written until it takes gpt2.speed's step. Read from the
    source (every module-level import, followed), then seen in a fresh interpreter's sys.modules."""
    found = heavy_imports_on_import(["gpt2", "spec_decoding"], project_modules())
    assert not [name for name in found if name.startswith("gpt2.speed")], sorted(found)
    code = "import sys, gpt2, spec_decoding; print(sorted(m for m in sys.modules if m.startswith('gpt2.speed')))"
    shown = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "[]", shown.stdout + shown.stderr


def test_the_heavy_import_walk_finds_an_import_in_a_try_two_modules_down(tmp_path):
    """The shape fused_step once had (`try: import triton` at module level), reached through the
    package; an import inside a function is not counted."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from .a import f\n")
    (tmp_path / "pkg" / "a.py").write_text("from . import b\n\ndef f():\n    import matplotlib\n")
    (tmp_path / "pkg" / "b.py").write_text("try:\n    import triton\nexcept ImportError:\n    triton = None\n")
    found = heavy_imports_on_import(["pkg"], project_modules(tmp_path, ["pkg"], []))
    assert found == {"pkg": set(), "pkg.a": set(), "pkg.b": {"triton"}}


@pytest.mark.parametrize("module", ["spec_decoding.algorithms.greedy", "spec_decoding.algorithms.speculative", "spec_decoding.algorithms.tree"])
def test_the_algorithms_do_not_import_the_trace(module):
    """The trace subscribes to the generators' rounds (on_round); they never call it."""
    modules = project_modules()
    assert not {"spec_decoding.presentation.trace", "spec_decoding.presentation.trace_page"} & imports_of(module, modules[module], modules)


# The benchmarks that compare against transformers' own GPT-2 (each imports it inside the function
# that runs the comparison, and says what to install when it is missing), and the probe they ask.
TRANSFORMERS_COMPARISONS = {"benchmarks.hf_assisted", "benchmarks.model_speed", "benchmarks.speculative_speed",
                            "benchmarks.compiled_speed",
                            "benchmarks.common"}


def transformers_imports(file: Path) -> list[tuple[int, bool]]:
    """(line, at module level) of every import of transformers in the file."""
    tree = ast.parse(file.read_text(), filename=str(file))
    in_function = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(f)}
    found = []
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        if any(n.split(".")[0] == "transformers" for n in names):
            found.append((node.lineno, id(node) not in in_function))
    return found


def test_only_the_comparisons_with_transformers_import_it():
    """transformers is a test-only reference (requirements-dev.txt): the models, the algorithms,
    the scripts and every other benchmark must run without it; the comparisons import it lazily."""
    for name, file in project_modules().items():
        found = transformers_imports(file)
        if name in TRANSFORMERS_COMPARISONS:
            assert not [line for line, top in found if top], f"{name} imports transformers at module level"
        else:
            assert not found, f"{name} imports transformers (line {found[0][0] if found else ''})"


# ------------------------------------------------------------------ spec_decoding: a folder per concern

MAX_TOP_LEVEL_MODULES = 8  # beside the folders: the few modules every concern shares
POLICIES = "spec_decoding.policies"


def spec_decoding_layout(root: Path = ROOT) -> tuple[list[str], list[str]]:
    """(subpackages, top-level modules) of spec_decoding/, by name."""
    folder = root / "spec_decoding"
    subpackages = sorted(p.name for p in folder.iterdir() if (p / "__init__.py").is_file())
    modules = sorted(p.stem for p in folder.glob("*.py"))
    return subpackages, modules


def test_spec_decoding_has_a_folder_per_concern():
    subpackages, modules = spec_decoding_layout()
    assert len(subpackages) >= 3, f"spec_decoding/ has {len(subpackages)} subpackages: {subpackages}"
    assert {"algorithms", "drafters", "policies", "presentation", "checks"} <= set(subpackages)
    assert len(modules) <= MAX_TOP_LEVEL_MODULES, (
        f"spec_decoding/ has {len(modules)} top-level modules ({', '.join(modules)}), more than "
        f"{MAX_TOP_LEVEL_MODULES}: move a module into the folder of its concern")


def concern_of(module: str) -> str | None:
    """spec_decoding.algorithms.tree -> spec_decoding.algorithms; a top-level module is its own
    concern; the package's own __init__ (which re-exports) and code outside are None."""
    parts = module.split(".")
    if parts[0] != "spec_decoding" or len(parts) == 1:
        return None
    return ".".join(parts[:2])


def concern_graph(modules: dict) -> dict[str, set[str]]:
    """Which of spec_decoding's folders (and top-level modules) imports which, anywhere in its files."""
    graph = {}
    for name, targets in import_graph(modules).items():
        if (source := concern_of(name)) is None:
            continue
        graph.setdefault(source, set()).update(
            t for t in map(concern_of, targets) if t is not None and t != source)
    return graph


def test_no_folder_of_spec_decoding_imports_one_that_imports_it_back():
    """The folders are layers: presentation and policies below the algorithms, drafters below
    them too, checks above; a cycle between two folders means a concern is split wrongly."""
    graph = concern_graph(project_modules())
    assert {"spec_decoding.algorithms", "spec_decoding.drafters", POLICIES} <= set(graph)
    assert "spec_decoding.policies" in graph["spec_decoding.algorithms"]  # the walk sees the layers
    cycle = find_cycle(graph)
    assert cycle is None, "folders import each other: " + " -> ".join(cycle or [])


def test_the_folder_walk_finds_a_cycle_between_two_folders(tmp_path):
    """The test above can fail: two folders whose modules import each other, even lazily."""
    for folder, body in (("a", "from ..b import y\n"), ("b", "def y():\n    from ..a import x\n")):
        (tmp_path / "spec_decoding" / folder).mkdir(parents=True)
        (tmp_path / "spec_decoding" / folder / "__init__.py").write_text("")
        (tmp_path / "spec_decoding" / folder / "x.py").write_text(body)
    (tmp_path / "spec_decoding" / "__init__.py").write_text("")
    graph = concern_graph(project_modules(tmp_path, ["spec_decoding"], []))
    assert find_cycle(graph) in (["spec_decoding.a", "spec_decoding.b", "spec_decoding.a"],
                                 ["spec_decoding.b", "spec_decoding.a", "spec_decoding.b"])


def reachable(start: str, modules: dict) -> set[str]:
    """Every project module `start` imports, directly or through others, anywhere in their files."""
    graph, seen, todo = import_graph(modules), set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_gamma_policies_import_nothing_of_the_speed_package():
    """The policies decide from the costs handed to them (a CostModel); measuring, and keeping the
    measurements per machine (gpt2.speed's kernel cache), is the caller's."""
    modules = project_modules()
    policies = [name for name in modules if name == POLICIES or name.startswith(POLICIES + ".")]
    assert {"spec_decoding.policies.gamma", "spec_decoding.policies.costs"} <= set(policies)
    for name in policies:
        speed = {m for m in reachable(name, modules) if m == "gpt2.speed" or m.startswith("gpt2.speed.")}
        assert not speed, f"{name} reaches {sorted(speed)}: a policy takes its measurements handed in"
    # the walk does reach the speed package from the code that measures
    assert any(m.startswith("gpt2.speed") for m in reachable("spec_decoding.calibration", modules))


# ------------------------------------------------------------------ small contracts

MAX_PARAMETERS = 8  # the paper's names (target, draft, prefix, max_gen, gamma) and three values


def generators():
    from spec_decoding import (autoregressive_generate, speculative_sampling, speculative_sampling_greedy,
                               tree_speculative_sampling)
    from spec_decoding.algorithms.batched import batched_autoregressive_generate, batched_speculative_sampling
    return [autoregressive_generate, speculative_sampling, speculative_sampling_greedy, tree_speculative_sampling,
            batched_autoregressive_generate, batched_speculative_sampling]


@pytest.mark.parametrize("generate", generators(), ids=lambda f: f.__name__)
def test_each_generator_takes_at_most_eight_parameters(generate):
    """Sampling options are one value (SamplingParams), observers another (Observers): a generator
    names what it needs, and a new option changes one class, not every signature."""
    import inspect

    parameters = list(inspect.signature(generate).parameters)
    assert len(parameters) <= MAX_PARAMETERS, f"{generate.__name__}{inspect.signature(generate)}"
    assert not {"temperature", "top_k", "top_p", "generator", "on_tokens", "on_round", "trace"} & set(parameters)


def test_the_kits_greedy_speculative_student_signature_is_as_small():
    """What the course kit hands the student is the function's own signature (make blanks the body)."""
    import ast

    from assignments.make import resolve
    from assignments.registry import ASSIGNMENTS

    (name,) = ASSIGNMENTS["greedy_speculative"].functions
    node = resolve(name).node
    args = node.args
    parameters = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    assert isinstance(node, ast.FunctionDef) and node.name == "speculative_sampling_greedy"
    assert len(parameters) <= MAX_PARAMETERS and parameters[:5] == ["target", "draft", "prefix", "max_gen", "gamma"]
    assert "observers" in parameters


def kit_function_paths() -> list[str]:
    """Every dotted function path the kit's assignments name: the student's, and those removed."""
    from assignments.registry import ASSIGNMENTS

    return sorted({name for a in ASSIGNMENTS.values() for name in (*a.functions, *a.removed)})


def test_every_function_path_the_kit_names_resolves():
    """The kit names functions by their module's path; after a move each must still be found (and
    be a function of that file, not of a package that re-exports it)."""
    from assignments.make import resolve

    paths = kit_function_paths()
    assert "spec_decoding.algorithms.greedy.speculative_sampling_greedy" in paths and len(paths) > 10
    for name in paths:
        target = resolve(name)  # an AssignmentError names what is missing
        assert target.node.name == name.rpartition(".")[2], name


def test_the_bug_zoos_plants_find_their_code():
    """find_the_bug plants a bug by replacing a piece of a file's text: every file must exist and
    hold the piece it replaces."""
    import json

    plants = json.loads((ROOT / "assignments" / "find_the_bug" / "plants.json").read_text())["plants"]
    assert plants
    for bug, edits in plants.items():
        for file, old, _new in edits:
            assert (ROOT / file).is_file(), f"{bug}: {file} does not exist"
            assert old in (ROOT / file).read_text(), f"{bug}: {file} no longer holds {old!r}"


# What `from spec_decoding import X` gave before the folders: every name still comes from the package.
PUBLIC_API = ["autoregressive_generate", "speculative_sampling_greedy", "speculative_sampling", "Drafter",
              "ModelDrafter", "NGramDrafter", "LayerSkipDrafter", "tree_speculative_sampling",
              "modified_rejection_sampling", "residual_distribution", "logits_to_probs", "sample",
              "GenerationResult", "GenerationStats", "CostModel", "GammaPolicy", "FixedGamma", "HeuristicGamma",
              "AutoGamma"]


def test_the_public_api_is_still_importable_from_the_package():
    import spec_decoding

    missing = [name for name in PUBLIC_API if not hasattr(spec_decoding, name)]
    assert not missing, f"from spec_decoding import ... no longer finds {missing}"
    assert set(PUBLIC_API) | {"SamplingParams", "Observers", "GREEDY"} <= set(spec_decoding.__all__)
