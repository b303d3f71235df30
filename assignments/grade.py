"""`grade`: run the checks that exercise the removed functions against a student's copy.

The grading copy is this project (the instructor's code, checks included) with the student's
versions of the assignment's files put in; the checks run there in a subprocess (so an endless
loop or a crash cannot take the grader down) on small random checkpoints made on the fly, against
references computed here with the instructor's code. Offline, well under two minutes on a CPU.
"""

import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import CHECKS_FOR, END_TO_END
from .make import IGNORE, MANIFEST, ROOT, AssignmentError


@dataclass
class CheckResult:
    check: str
    passed: bool
    message: str
    seconds: float = 0.0


@dataclass
class FunctionScore:
    function: str
    results: list[CheckResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def score(self) -> str:
        return f"{sum(r.passed for r in self.results)}/{len(self.results)}"


@dataclass
class Report:
    functions: list[FunctionScore]
    seconds: float

    @property
    def passed(self) -> bool:
        return all(f.passed for f in self.functions)


def read_manifest(student: Path) -> dict:
    student = Path(student)
    if not student.is_dir():
        raise AssignmentError(f"{student} is not a folder: give the student's copy made by "
                              f"`python -m assignments make`")
    path = student / MANIFEST
    if not path.is_file():
        raise AssignmentError(f"{student} has no {MANIFEST}: it was not made by `python -m assignments make` "
                              f"(or the file was deleted; make a fresh copy and move the student's files in)")
    manifest = json.loads(path.read_text())
    missing = [f for f in manifest["files"] if not (student / f).is_file()]
    if missing:
        raise AssignmentError(f"{student} lacks {', '.join(missing)}: the student's copy must keep the "
                              f"files the assignment is in")
    return manifest


def checks_for(function: str) -> list[str]:
    return CHECKS_FOR.get(function, END_TO_END)


@torch.inference_mode()
def make_setup(folder: Path) -> Path:
    """Small checkpoints and the references the checks compare with, computed with the
    instructor's code. Returns the setup file for run_checks."""
    from gpt2 import GPT2Config, load_gpt2
    from offline.random_weights import save_agreeing_pair, save_random_checkpoint
    from spec_decoding import autoregressive_generate

    from .run_checks import PROMPT

    tiny = GPT2Config(n_layer=4, n_head=2, n_embd=32, n_positions=64, vocab_size=100)
    vocab = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=32, vocab_size=16)
    target_dir, draft_dir = save_agreeing_pair(folder / "target", folder / "draft", tiny, draft_n_layer=2,
                                               damping=0.1, seed=11, std=0.2, embedding_std=0.3)
    setup = {
        "target": str(target_dir), "draft": str(draft_dir),
        "unrelated": str(save_random_checkpoint(folder / "unrelated", tiny.with_(n_layer=2), seed=9, std=0.2,
                                                embedding_std=0.3)),
        # A 16-token pair that agrees about half the time, for the exact-enumeration check.
        "vocab_target": str(save_random_checkpoint(folder / "vocab-target", vocab, seed=21, std=0.2,
                                                   embedding_std=0.3)),
        "vocab_draft": str(save_random_checkpoint(folder / "vocab-draft", vocab, seed=22, std=0.2,
                                                  embedding_std=0.3)),
        "references": str(folder / "references.pt"),
    }
    target = load_gpt2(target_dir)
    sequence = torch.tensor(PROMPT + [7, 64, 23, 1, 88, 45, 12, 9, 30, 77], dtype=torch.long)
    torch.save({
        "sequence": sequence,
        "logits": target(sequence[None])[0],
        "truncate_at": 9,
        "wrong_tokens": torch.tensor([3, 3, 50, 61], dtype=torch.long),
        "greedy": autoregressive_generate(target, PROMPT, 30).tokens,
    }, setup["references"])
    path = folder / "setup.json"
    path.write_text(json.dumps(setup))
    return path


def grade(student: Path, timeout: float = 300, root: Path = ROOT) -> Report:
    import time

    start = time.perf_counter()
    manifest = read_manifest(student)
    functions = manifest["functions"]
    checks = list(dict.fromkeys(c for f in functions for c in checks_for(f)))
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        tmp = Path(tmp)
        tree = tmp / "project"
        shutil.copytree(root, tree, ignore=IGNORE)
        for file in manifest["files"]:  # the student's versions of the assignment's files
            shutil.copy2(Path(student) / file, tree / file)
        setup = make_setup(tmp / "checkpoints")
        results = run_checks(tree, setup, checks, timeout)
    by_check = {r.check: r for r in results}
    scores = [FunctionScore(f, [by_check[c] for c in checks_for(f)]) for f in functions]
    return Report(scores, time.perf_counter() - start)


def run_checks(tree: Path, setup: Path, checks: list[str], timeout: float) -> list[CheckResult]:
    """Run the checks in a subprocess inside the grading tree; a check that never reported
    (a crash on import, an endless loop) gets a failing result that says so."""
    command = [sys.executable, "-m", "assignments.run_checks", str(setup), *checks]
    env = {**__import__("os").environ, "PYTHONPATH": str(tree)}
    try:
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
        stdout, stderr, why = done.stdout, done.stderr, None
    except subprocess.TimeoutExpired as expired:
        stdout = (expired.stdout or b"").decode() if isinstance(expired.stdout, bytes) else (expired.stdout or "")
        stderr, why = "", f"did not finish within {timeout:g} s (an endless loop?)"
    results = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            results[r["check"]] = CheckResult(r["check"], r["passed"], r["message"], r["seconds"])
    if why is None and len(results) < len(checks):
        last = [line for line in stderr.strip().splitlines() if line.strip()]
        why = f"the checks crashed: {last[-1] if last else 'no output'}"
        if "Error" in stderr and "import" in stderr.lower() and not results:
            why = f"your code does not import: {last[-1] if last else ''}"
    return [results.get(c) or CheckResult(c, False, why) for c in checks]


def print_report(report: Report, file=None) -> None:
    file = file or sys.stdout
    width = max(len(f.function) for f in report.functions)
    print(f"{'function':{width}}  score  first failing check", file=file)
    for f in report.functions:
        failing = next((r for r in f.results if not r.passed), None)
        note = f"{failing.check}: {failing.message}" if failing else "all checks pass"
        print(f"{f.function:{width}}  {f.score:>5}  {note}", file=file)
    print(file=file)
    print("Checks:", file=file)
    seen = set()
    for f in report.functions:
        for r in f.results:
            if r.check not in seen:
                seen.add(r.check)
                print(f"  [{'PASS' if r.passed else 'FAIL'}] {r.check} ({r.seconds:.1f} s): {r.message}", file=file)
    verdict = "ALL PASS" if report.passed else "NOT YET: fix the failing checks above"
    print(f"\n{verdict} (graded in {report.seconds:.0f} s)", file=file)
