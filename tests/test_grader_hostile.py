"""Hostile submissions against the grader's sandbox (assignments/sandbox.py): one per attack class,
each planted in a stripped copy of gamma_cost_model (the cheapest assignment) before the stub's
`raise`, so the fair verdict is 0 points, "not implemented yet". Each attack is run (a) in the
Gradescope layout, as root, in a folder laid out like /autograder (the export's run_autograder,
or the `autograde` it calls), and (b) locally (`grade_tree`, as `grade` runs it). Nothing may be
forged: no score above 0, no file of the grader's written, no process of the check left alive.

The attacks only aim at this test's own folders and grader processes (found by a marker in their
command line), so a sandbox that failed could not harm anything else on the machine. Where an
attack is harmless to run unsandboxed, the same submission is also graded with isolation "none":
it then succeeds, which shows the test would catch a sandbox that let it through.

A grader that is not root (level "userns"): the same attacks, and escapes from the namespaces
(remount, mount, chroot, a user namespace of its own), graded by a throwaway user this test makes,
end in the same fair 0; with isolation "none" they succeed.

What the code can reach besides (at the end): submitted links and special files are refused before
anything reads them, and nothing (a key in a keyring, a file in /tmp, the home or /dev/shm) is
left from one submission for the next. tests/test_grader_batch.py grades a class with a hang, a
crash, a memory hog, an unreadable answer and escape sequences in one batch.

Needs root and working namespaces (as on this machine, a Linux VM or a privileged container);
skipped elsewhere, with the reason."""

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import textwrap
import tempfile
import time
from pathlib import Path

import pytest

from assignments import __main__ as cli
from assignments.definition import AssignmentError
from assignments.export import gradescope_source
from assignments.grade import Zygote, grade, grade_tree, student_files
from assignments.make import MANIFEST, resolve
from assignments.references import HIDDEN_SEED
from assignments.registry import ASSIGNMENTS
from assignments.sandbox import SYSTEM_PATH, USER, kill_processes_of, namespaces_work, processes_of, unreadable_python

ROOT = Path(__file__).resolve().parents[1]
NAME = "gamma_cost_model"
ASSIGNMENT = ASSIGNMENTS[NAME]
TARGET = resolve("spec_decoding.policies.theory.expected_tokens_per_round")  # the attack runs in it
CHECKS = ["tokens_per_round", "round_seconds"]  # the attacked check, and one after it
SECRET = "hidden-value-7f3a9c"  # put in the hidden references: the student's code must never see it

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not namespaces_work(),
                                reason="the sandbox's tests need root and working namespaces (unshare)")


# ------------------------------------------------------------------------------------------------
# The attacks: Python put before the stub's raise (run once per process); TARGETS etc. filled in
# ------------------------------------------------------------------------------------------------

REWRITE_RESULTS = """
import ctypes, json, os, time
ctypes.CDLL(None).prctl(15, NAME.encode())  # PR_SET_NAME: the test finds its processes by it
forged = json.dumps({"score": 100, "tests": [], "output": "FORGED"})
targets = list(TARGETS)
for pid in os.listdir("/proc"):  # the grader's command line names results.json
    try:
        args = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
    except OSError:
        continue
    if b"--results" in args and MARKER.encode() in b" ".join(args):
        targets.append(args[args.index(b"--results") + 1].decode())
print("TARGETS", targets, flush=True)
if os.fork() == 0:  # a daemon: double fork, own session, no pipe of the check's kept open
    os.setsid()
    if os.fork() == 0:
        os.closerange(0, 1024)
        end = time.time() + 8
        while time.time() < end:  # rewrite them after the grader wrote them, until after it exits
            for path in targets:
                try:
                    with open(path, "w") as f:
                        f.write(forged)
                except OSError:
                    pass
            time.sleep(0.05)
    os._exit(0)
time.sleep(0.3)
"""

KILL_GRADER = """
import json, os, signal
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
        continue
    try:
        args = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
    except OSError:
        continue
    if int(pid) == os.getppid() or (MARKER.encode() in b" ".join(args) and b"autograde" in args):
        if b"--results" in args:  # write the grade, then kill the grader so it cannot overwrite it
            try:
                with open(args[args.index(b"--results") + 1].decode(), "w") as f:
                    f.write(json.dumps({"score": 100, "tests": [], "output": "FORGED"}))
            except OSError as error:
                print("could not write", error)
        try:
            os.kill(int(pid), signal.SIGKILL)
            print("KILLED", pid, args[:3])
        except OSError as error:
            print("could not kill", pid, error)
"""

READ_PROC = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
found = []
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
        continue
    try:
        grader = int(pid) == os.getppid() or MARKER.encode() in open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        grader = False
    if grader and libc.ptrace(0x4206, int(pid), 0, 0) == 0:  # PTRACE_SEIZE (does not stop it)
        found.append("PTRACE-ALLOWED")
    for name in ("cmdline", "environ"):
        try:
            text = open(f"/proc/{pid}/{name}", "rb").read()
        except OSError:
            continue
        if name == "environ" and text:
            found.append("ENVIRON-READABLE")
        if MARKER.encode() in text:
            found.append(f"GRADER-{name.upper()}-VISIBLE")
    try:
        first = open(f"/proc/{pid}/maps").readline()
        with open(f"/proc/{pid}/mem", "rb") as mem:
            mem.seek(int(first.split("-")[0], 16))
            if mem.read(16):
                found.append("MEM-READABLE")
    except (OSError, ValueError):
        pass
    for name in ("cwd", "root"):
        try:
            os.listdir(f"/proc/{pid}/{name}")
            found.append(f"{name.upper()}-OF-ANOTHER-PROCESS")
        except OSError:
            pass
for path in FILES:
    try:
        text = open(path, errors="replace").read()
        found.append("FILE-READABLE " + path + (" WITH-SECRET" if SECRET in text else ""))
    except OSError:
        pass
print("FOUND", sorted(set(found)), flush=True)
"""

INSTALLED_COPY = """
import os, sys
for entry in [*sys.path, *SITES]:
    candidate = os.path.join(entry, "spec_decoding", "policies", "theory.py")
    try:
        text = open(candidate).read()
    except OSError:
        continue
    if "NotImplementedError" not in text.split("def expected_tokens_per_round")[1].split("def ")[0]:
        print("INSTALLED-COPY", candidate, flush=True)
        namespace = {"__name__": "installed_theory"}
        exec(compile(text, candidate, "exec"), namespace)
        return namespace["expected_tokens_per_round"](alpha, gamma)
print("NO-INSTALLED-COPY", flush=True)
"""

DAEMON = """
import ctypes, os
ctypes.CDLL(None).prctl(15, NAME.encode())  # PR_SET_NAME: the test finds its processes by it
if os.fork() == 0:  # a daemon that keeps the check's pipes open and spins
    os.setsid()
    if os.fork() == 0:
        while True:
            pass
    os._exit(0)
"""


def process_name(tmp_path: Path) -> str:
    """A name (at most 15 characters, the kernel's limit) for one test's attacking processes."""
    import zlib

    return f"hostile{zlib.crc32(str(tmp_path).encode()):08x}"


def named(name: str) -> list[int]:
    """Live processes called `name` (whatever their user: after a grader exits, another grader
    running beside this test may take the same sandbox user, so its processes prove nothing)."""
    found = []
    for entry in os.scandir("/proc"):
        try:
            if entry.name.isdigit() and Path(entry.path, "comm").read_text().strip() == name and \
                    Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX":
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def planted(stripped: str, attack: str, once: bool = True, **values) -> str:
    """The stripped file with `attack` run before the stub's raise (once per process, or on every
    call), with the upper-case names in it set to `values`."""
    stub = f"raise NotImplementedError('{TARGET.qualname}: your code here (see the docstring)')"
    line = next(line for line in stripped.splitlines() if line.strip() == stub)
    indent = line[:len(line) - len(line.lstrip())]
    settings = "".join(f"{name} = {value!r}\n" for name, value in values.items())
    guard = "if not globals().get('_attacked'):\n    globals()['_attacked'] = True\n" if once else "if True:\n"
    block = guard + textwrap.indent(settings + textwrap.dedent(attack), "    ")
    return stripped.replace(line, textwrap.indent(block, indent) + line, 1)


# ------------------------------------------------------------------------------------------------
# One built copy, shared: the Gradescope source folder and a sandbox (zygote) for local grading
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """gamma_cost_model's Gradescope source (copy, checkpoints, hidden references for CHECKS with
    the secret among them); its hidden.json text is kept to lay out a fresh /autograder per run."""
    folder = tmp_path_factory.mktemp("hostile")
    source = gradescope_source(NAME, folder / "source", HIDDEN_SEED, check_reference=False)
    refs = json.loads((source / "hidden.json").read_text())
    refs = {name: refs[name] for name in CHECKS}
    refs["tokens_per_round"]["secret"] = SECRET
    return {"folder": folder, "source": source, "refs": refs,
            "stripped": (source / "copy" / TARGET.file).read_text()}


@pytest.fixture(scope="module")
def sandbox(built):
    with Zygote(built["source"] / "copy") as z:
        assert z.isolation.level == "namespaces"
        yield z


@pytest.fixture(scope="module")
def unsandboxed(built):
    with Zygote(built["source"] / "copy", isolation="none") as z:
        yield z


def grade_locally(built, zygote, text: str, tmp_path: Path):
    """Grade a submission of TARGET's file as `grade` does, in this process."""
    submission = tmp_path / "submission"
    (submission / TARGET.file).parent.mkdir(parents=True, exist_ok=True)
    (submission / TARGET.file).write_text(text)
    files, notes = student_files(submission, [TARGET.file])
    report = grade_tree(ASSIGNMENT, built["source"] / "copy", files, built["source"] / "data", built["refs"],
                        notes=notes, zygote=zygote)
    return {r.check: r for r in report.results}


def autograder(built, tmp_path: Path, text: str) -> Path:
    """A fresh folder laid out like /autograder: the shared source (a fresh hidden.json: the
    grader deletes it), the submission (just the edited file), results/."""
    root = tmp_path / "autograder"
    (root / "source").mkdir(parents=True)
    for name in ("copy", "data"):
        (root / "source" / name).symlink_to(built["source"] / name)
    (root / "source" / "hidden.json").write_text(json.dumps(built["refs"]))
    (root / "submission").mkdir()
    (root / "submission" / Path(TARGET.file).name).write_text(text)
    (root / "results").mkdir()
    shutil.copy(built["source"] / "run_autograder", root / "run_autograder")
    return root


def run_autograder(root: Path) -> tuple[dict, int]:
    """Gradescope's run, as root: the exported run_autograder script, a fresh grader process.
    Returns results.json and the user id the student's code ran as (from the grader's log line)."""
    env = {"PATH": os.defpath, "AUTOGRADER_ROOT": str(root), "AUTOGRADER_PYTHON": sys.executable}
    done = subprocess.run(["bash", str(root / "run_autograder")], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads((root / "results" / "results.json").read_text()), user_id(done.stderr)


def user_id(log: str) -> int:
    user = re.search(r"the student's code ran as user (\S+), in its own PID", log)
    assert user and user[1].startswith(USER), log
    return pwd.getpwnam(user[1]).pw_uid


def fair(results: dict) -> None:
    """A stripped copy's verdicts: every check graded, none passed, 0 points."""
    assert sorted(results) == sorted(CHECKS)
    for r in results.values():
        assert not r.passed and r.points == 0 and "not implemented yet" in r.message, (r.check, r.message)


def fair_gradescope(results: dict) -> None:
    assert "FORGED" not in json.dumps(results)
    assert [t["name"] for t in results["tests"]] == CHECKS
    assert all(t["score"] == 0 and "not implemented yet" in t["output"] for t in results["tests"]), results
    assert results.get("score", 0) == 0


# ------------------------------------------------------------------------------------------------
# The attacks, one test each
# ------------------------------------------------------------------------------------------------

def test_rewriting_results_after_the_grader_exits_is_stopped(built, tmp_path):
    """A daemon (double fork, setsid, every fd closed) finds results.json in the grader's command
    line and rewrites it for 8 s, past the grader's exit: it is killed with its check, and could
    not have written there anyway (another user; no grader process or file visible to it)."""
    name = process_name(tmp_path)
    root = autograder(built, tmp_path / "gradescope", planted(built["stripped"], REWRITE_RESULTS,
                                                               TARGETS=[], MARKER=str(tmp_path), NAME=name))
    results, _ = run_autograder(root)
    fair_gradescope(results)
    assert not named(name)
    time.sleep(1.0)  # the daemon, had it lived, rewrites every 50 ms
    fair_gradescope(json.loads((root / "results" / "results.json").read_text()))


def test_rewriting_a_local_graders_files_is_stopped(built, sandbox, unsandboxed, tmp_path):
    """Locally: the same daemon aims at files the grader would read afterwards (a report it writes
    next to the submission, the stripped copy it grades from). Unsandboxed it rewrites them after
    the grading; in the sandbox it is dead when the check's verdict is read and wrote nothing."""
    report = tmp_path / "report.json"
    targets = [str(report), str(built["source"] / "copy" / "forged.txt")]
    text = planted(built["stripped"], REWRITE_RESULTS, TARGETS=targets, MARKER=str(tmp_path), NAME="hostile-local")
    fair(grade_locally(built, sandbox, text, tmp_path / "sandboxed"))
    time.sleep(0.5)
    assert not any(Path(t).exists() for t in targets) and not processes_of(sandbox.isolation.uid)
    # the same submission unsandboxed: its daemon outlives the grading and writes (the attack works)
    text = planted(built["stripped"], REWRITE_RESULTS, TARGETS=[str(report)], MARKER=str(tmp_path),
                   NAME="hostile-none")
    fair(grade_locally(built, unsandboxed, text, tmp_path / "unsandboxed"))
    deadline = time.monotonic() + 30
    while not (report.exists() and "FORGED" in report.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "FORGED" in report.read_text()


def test_killing_the_grader_is_stopped(built, sandbox, tmp_path):
    """The child writes a perfect results.json and SIGKILLs the grader (found by its command
    line) and its own parent, the zygote: it can do neither, and every check is graded."""
    root = autograder(built, tmp_path / "gradescope", planted(built["stripped"], KILL_GRADER, MARKER=str(tmp_path)))
    results, _ = run_autograder(root)
    fair_gradescope(results)
    assert "KILLED" not in results["tests"][0]["output"]
    # locally, where the grader is this test's process and the zygote the child's parent
    results = grade_locally(built, sandbox, planted(built["stripped"], KILL_GRADER, MARKER=str(tmp_path)), tmp_path)
    fair(results)
    assert "KILLED" not in results["tokens_per_round"].output
    fair(grade_locally(built, sandbox, built["stripped"], tmp_path / "after"))  # the zygote still serves


def test_reading_the_graders_proc_and_files_is_stopped(built, sandbox, unsandboxed, tmp_path):
    """The child reads every /proc/<pid>/cmdline, environ, mem, cwd and root it can, tries to
    trace the grader and its own parent (the zygote), and reads the files a cheater wants: the
    instructor's checkout (the reference implementation), hidden.json, the grader's own copy of
    the checkpoints and another student's submission. In the sandbox it finds nothing;
    unsandboxed, environments, memory, tracing and those files are all there."""
    other = tmp_path / "other-student" / "theory.py"
    other.parent.mkdir()
    other.write_text(f"# another student's submission {SECRET}\n")
    (tmp_path / "hidden.json").write_text(json.dumps(built["refs"]))
    files = [str(ROOT / TARGET.file), str(other), str(tmp_path / "hidden.json"),
             str(built["source"] / "data" / "target" / "config.json")]
    text = planted(built["stripped"], READ_PROC, MARKER=str(tmp_path), FILES=files, SECRET=SECRET)
    root = autograder(built, tmp_path / "gradescope", text)
    results, _ = run_autograder(root)
    fair_gradescope(results)
    assert "FOUND []" in results["tests"][0]["output"], results["tests"][0]["output"]
    local = grade_locally(built, sandbox, text, tmp_path / "sandboxed")
    fair(local)
    assert "FOUND []" in local["tokens_per_round"].output, local["tokens_per_round"].output
    # unsandboxed the attack finds what it looks for
    exposed = grade_locally(built, unsandboxed, text, tmp_path / "unsandboxed")["tokens_per_round"].output
    for found in ("ENVIRON-READABLE", "MEM-READABLE", "PTRACE-ALLOWED", f"FILE-READABLE {ROOT / TARGET.file}",
                  "WITH-SECRET"):
        assert found in exposed, exposed


@pytest.fixture(scope="module")
def installed_python(tmp_path_factory):
    """A Python whose site-packages holds an installed copy of the project (as `pip install .`
    would put it), torch coming from this virtualenv's site-packages (a .pth file)."""
    import site

    venv = tmp_path_factory.mktemp("installed") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    sites = list(venv.glob("lib/python*/site-packages"))
    assert len(sites) == 1
    (sites[0] / "this_venv.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    for package in ("gpt2", "spec_decoding", "offline"):
        shutil.copytree(ROOT / package, sites[0] / package, ignore=shutil.ignore_patterns("__pycache__"))
    return venv / "bin" / "python", sites[0]


def test_importing_an_installed_copy_is_stopped(built, installed_python, tmp_path):
    """The child looks for the project's theory.py in sys.path and site-packages and runs the
    installed (complete) one instead of its stub. Graded by a Python with such a copy installed:
    unsandboxed it passes the check; in the sandbox the copy is masked (shown empty)."""
    python, site_packages = installed_python
    text = planted(built["stripped"], INSTALLED_COPY, once=False, SITES=[str(site_packages)])
    with Zygote(built["source"] / "copy", python=str(python)) as sandbox:
        results = grade_locally(built, sandbox, text, tmp_path / "sandboxed")
    fair(results)
    assert "NO-INSTALLED-COPY" in results["tokens_per_round"].output
    with Zygote(built["source"] / "copy", isolation="none", python=str(python)) as unsandboxed:
        exposed = grade_locally(built, unsandboxed, text, tmp_path / "unsandboxed")["tokens_per_round"]
    assert exposed.passed and "INSTALLED-COPY" in exposed.output  # the attack works without the sandbox


def test_a_daemon_holding_the_pipes_ends_with_its_check(built, sandbox, tmp_path):
    """A setsid'd daemon that keeps stdout and the answer pipe open and spins: the check ends
    when its child exits (not at the timeout), the daemon is killed, the verdict is the stub's,
    and the grader's output says a process was left running."""
    name = process_name(tmp_path)
    text = planted(built["stripped"], DAEMON, NAME=name)
    root = autograder(built, tmp_path / "gradescope", text)
    results, _ = run_autograder(root)
    fair_gradescope(results)
    assert not named(name)
    results = grade_locally(built, sandbox, text, tmp_path / "local")
    fair(results)
    assert "were still running when the check ended: killed" in results["tokens_per_round"].output
    assert not processes_of(sandbox.isolation.uid)


def test_a_wrong_manifest_does_not_choose_the_assignment(built, sandbox, tmp_path, capsys):
    """An empty gamma_cost_model copy whose .assignment.json names kv_cache: graded as the
    grader's assignment (the export's, or --assignment), with a note; without --assignment the
    local grade says it read the copy's manifest and is unofficial."""
    manifest = {"assignment": "kv_cache", "functions": list(ASSIGNMENTS["kv_cache"].functions),
                "files": ["gpt2/kv_cache.py", "gpt2/model.py"]}
    root = autograder(built, tmp_path / "gradescope", built["stripped"])
    (root / "submission" / MANIFEST).write_text(json.dumps(manifest))
    results, _ = run_autograder(root)
    fair_gradescope(results)
    assert "names 'kv_cache', but this grader grades 'gamma_cost_model'" in results["output"]
    student = tmp_path / "student"
    (student / TARGET.file).parent.mkdir(parents=True)
    (student / TARGET.file).write_text(built["stripped"])
    (student / MANIFEST).write_text(json.dumps(manifest))
    report = grade(student, assignment=NAME, only=["tokens_per_round"])
    assert report.assignment == NAME and report.points == 0 and report.official
    assert "names 'kv_cache'" in report.notes[0]
    # without --assignment: the manifest decides, and the report says it cannot be trusted
    (student / MANIFEST).write_text(json.dumps({**manifest, "assignment": NAME}))
    assert cli.main(["grade", str(student), "--json", "--only", "tokens_per_round"]) == 1
    printed = json.loads(capsys.readouterr().out)
    assert printed["official"] is False and "pass --assignment NAME" in printed["unofficial"][0]
    assert printed["isolation"]["level"] == "namespaces"


def test_a_grader_that_cannot_isolate_says_so_and_is_unofficial(built, unsandboxed, tmp_path, capsys):
    """isolation "none" (what a grader that is not root, without namespaces, gets): one line says
    the code ran as the grader's own user, and the report is unofficial in its JSON and print."""
    from assignments.grade import Report, mark_isolation, print_report

    report = Report(NAME, list(ASSIGNMENT.functions))
    grade_tree(ASSIGNMENT, built["source"] / "copy", {}, built["source"] / "data", built["refs"],
               zygote=unsandboxed, report=report)
    assert report.isolation["level"] == "none"
    print_report(mark_isolation(report))  # as grade() does
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("UNOFFICIAL: NOT ISOLATED: the student's code ran as your own user")
    assert report.to_json()["official"] is False


def test_a_grader_stopped_mid_grading_keeps_the_verdicts_it_had(built, tmp_path):
    """Gradescope's grader sent SIGTERM (its time limit) while the second check hangs: results.json
    holds the first check's verdict, says grading stopped, and no process of the check is left."""
    import signal

    root = autograder(built, tmp_path / "gradescope", built["stripped"])  # the first check fails at once
    name = process_name(tmp_path)
    costs = resolve("spec_decoding.policies.costs.CostModel.round_seconds")
    stub = "raise NotImplementedError('CostModel.round_seconds: your code here (see the docstring)')"
    stripped_costs = (built["source"] / "copy" / costs.file).read_text()
    (root / "submission" / Path(costs.file).name).write_text(
        stripped_costs.replace(stub, f"import ctypes, time\n        ctypes.CDLL(None).prctl(15, {name.encode()!r})\n"
                                     f"        time.sleep(120)\n        " + stub, 1))  # the second hangs
    env = {"PATH": os.defpath, "AUTOGRADER_ROOT": str(root), "AUTOGRADER_PYTHON": sys.executable}
    shell = subprocess.Popen(["bash", str(root / "run_autograder")], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    results, partial = root / "results" / "results.json", root / "results" / ".partial.json"
    deadline = time.monotonic() + 300
    while not partial.exists() and time.monotonic() < deadline:  # the first check's verdict is written
        time.sleep(0.1)
    assert not results.exists()  # published once, when grading ends
    grader = [int(p) for p in Path(f"/proc/{shell.pid}/task/{shell.pid}/children").read_text().split()]
    assert len(grader) == 1
    os.kill(grader[0], signal.SIGTERM)
    _, log = shell.communicate(timeout=120)
    written = json.loads(results.read_text())
    assert [t["name"] for t in written["tests"]] == ["tokens_per_round"]
    assert "not implemented yet" in written["tests"][0]["output"]
    assert "Grading stopped after 1 check(s)" in written["output"]
    assert not named(name)


def test_without_namespaces_the_grader_falls_back_and_says_why(monkeypatch):
    """Where `unshare` is refused (a container without CAP_SYS_ADMIN) the level drops to "user",
    or to "none" when other users cannot even run this Python (pyenv's under /root), and the
    line says why; a level the machine cannot give is refused."""
    import assignments.sandbox as sandbox

    monkeypatch.setattr(sandbox, "_NAMESPACES_WORK", False)
    isolation = sandbox.detect()
    try:
        assert isolation.level in ("user", "none")
        assert "`unshare --pid --mount --net` does not work here" in isolation.line()
        if isolation.level == "none":
            assert "cannot be read by other users" in isolation.line()
            assert isolation.line().startswith("NOT ISOLATED")
        with pytest.raises(AssignmentError, match="cannot sandbox at level 'namespaces'"):
            sandbox.detect("namespaces")
    finally:
        if isolation.user:
            sandbox.release_user(isolation.user)


@pytest.mark.skipif(unreadable_python(sys.executable) is not None,
                    reason="level user needs a Python other users can run (this one is under a private folder)")
def test_without_namespaces_the_sandbox_user_still_stops_the_attacks(built, tmp_path):
    """Level "user" (root, no namespaces: Gradescope's probable case): the /proc attack finds no
    environment, memory or trace of the grader's and cannot read a folder of root's; the daemon is
    killed with its check."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "theory.py").write_text(SECRET)
    text = planted(built["stripped"], READ_PROC, MARKER=str(tmp_path), FILES=[str(private / "theory.py")],
                   SECRET=SECRET)
    with Zygote(built["source"] / "copy", isolation="user") as sandbox:
        results = grade_locally(built, sandbox, text, tmp_path / "proc")
        fair(results)
        found = results["tokens_per_round"].output
        for what in ("ENVIRON-READABLE", "MEM-READABLE", "PTRACE-ALLOWED", "CWD-", "ROOT-", "WITH-SECRET"):
            assert what not in found, found
        results = grade_locally(built, sandbox, planted(built["stripped"], DAEMON, NAME="hostile-user"),
                                tmp_path / "daemon")
        fair(results)
        assert not processes_of(sandbox.isolation.uid)


def test_emptying_the_sandbox_keeps_the_zygotes_mount_points(tmp_path):
    """Between gradings the sandbox's tmp is emptied of what the student left, but a root-owned
    folder there is the path to a folder the zygote bound under /tmp (a virtualenv in a temporary
    folder, as .ci/run makes): removing it unmounted the virtualenv in the zygote's namespace, and
    every later grading failed to import safetensors. Fails with the old rule (root-owned folders
    kept only when empty)."""
    from assignments.sandbox import empty_for_the_next

    mount_path = tmp_path / "tmp.venv-parent" / "venv"  # root-owned, not empty
    mount_path.mkdir(parents=True)
    student_dir = tmp_path / "left-by-student"
    (student_dir / "deep").mkdir(parents=True)
    (tmp_path / "notes.txt").write_text("left by the student")
    nobody = pwd.getpwnam("nobody").pw_uid
    for path in (student_dir, student_dir / "deep", tmp_path / "notes.txt"):
        os.chown(path, nobody, -1)
    empty_for_the_next(tmp_path)
    assert mount_path.is_dir()
    assert not student_dir.exists() and not (tmp_path / "notes.txt").exists()


# ------------------------------------------------------------------------------------------------
# A grader that is not root: level "userns" (user, PID, mount and network namespaces of its own)
# ------------------------------------------------------------------------------------------------

ESCAPE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
found = []
for line in open("/proc/self/status"):
    if line.startswith("Cap") and int(line.split()[1], 16):
        found.append("HAS-" + line.split(":")[0])
if libc.mount(None, os.getcwd().encode(), None, 32 | 4096, None) == 0:  # MS_REMOUNT | MS_BIND: writable
    found.append("REMOUNTED-WRITABLE")
if libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, None) == 0:
    found.append("MOUNTED")
if libc.unshare(0x10000000) == 0:  # CLONE_NEWUSER: a user namespace of its own, with every capability in it
    found.append("NEW-USER-NAMESPACE")
try:
    os.chroot("/tmp")
    found.append("CHROOTED")
except OSError:
    pass
try:
    open("forged.py", "w").write("FORGED")  # the folder its code runs in
    found.append("TREE-WRITABLE")
except OSError:
    pass
print("ESCAPE", sorted(found), flush=True)
"""

# Run as the throwaway user: grades each submission with one sandbox (python DRIVER LEVEL FOLDER
# autograde MARKER: the attacks find the grader by these); after each, the verdicts, the report's isolation and any process of this user
# left outside the grader and its zygote go to FOLDER/graded.jsonl (so they survive this process).
DRIVER = """
import json, os, sys
from pathlib import Path
from assignments.grade import Report, Zygote, grade_tree, mark_isolation, student_files
from assignments.registry import ASSIGNMENTS
from assignments.sandbox import processes_of

level, folder = sys.argv[1], Path(sys.argv[2])
refs = json.loads((folder / "hidden.json").read_text())
with Zygote(folder / "copy", isolation=level) as zygote:
    for submission in sorted((folder / "submissions").iterdir()):
        files, notes = student_files(submission, [FILE])
        report = mark_isolation(grade_tree(ASSIGNMENTS[NAME], folder / "copy", files, folder / "data", refs,
                                           notes=notes, zygote=zygote))
        try:
            zygotes = [int(p) for p in Path(f"/proc/{zygote.process.pid}/task/{zygote.process.pid}/children")
                       .read_text().split()]
        except OSError:
            zygotes = []
        ours = {os.getpid(), zygote.process.pid, *zygotes}
        with open(folder / "graded.jsonl", "a") as out:
            out.write(json.dumps({"submission": submission.name, "report": report.to_json(),
                                  "left": [p for p in processes_of(os.getuid()) if p not in ours]}) + "\\n")
"""

GRADER_USER = "hostile-test-grader"


def _runs(user: str, python: str, folder: Path, code: str) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", python, "-c", code],
                          cwd=folder, env={"PATH": SYSTEM_PATH, "HOME": str(folder), "TMPDIR": str(folder),
                                           "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
                          capture_output=True, text=True, timeout=300)


def _python_for(user: str, folder: Path) -> str | None:
    """A Python the user can run with this virtualenv's packages: this one, else the system's
    Python of the same version with a .pth naming this virtualenv's site-packages (this one may
    sit under a private folder, as pyenv's under /root)."""
    import site

    probe = ("import subprocess, sys, assignments.sandbox; "  # as the grader starts its zygote
             "subprocess.run([sys.executable, '-E', '-s', '-c', 'import torch, safetensors'], check=True)")
    if _runs(user, sys.executable, folder, probe).returncode == 0:
        return sys.executable
    system = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}", path=SYSTEM_PATH)
    if system is None:
        return None
    venv = folder / "venv"
    subprocess.run([system, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    sites = list(venv.glob("lib/python*/site-packages"))
    (sites[0] / "grader.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    shutil.chown(venv, GRADER_USER, GRADER_USER)
    python = str(venv / "bin" / "python")
    return python if _runs(user, python, folder, probe).returncode == 0 else None


@pytest.fixture(scope="module")
def not_root(built, tmp_path_factory):
    """A throwaway user (made here, removed after), a folder of its own holding the built copy,
    checkpoints and hidden references, and a Python it can run; skips where user namespaces do
    not work for it."""
    if not shutil.which("useradd", path=SYSTEM_PATH) or not shutil.which("setpriv", path=SYSTEM_PATH):
        pytest.skip("needs useradd and setpriv (util-linux) to run the grader as another user")
    made = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--shell",
                           "/usr/sbin/nologin", GRADER_USER], capture_output=True, text=True)
    assert made.returncode in (0, 9), made.stderr  # 9: left by a run that was killed
    uid = pwd.getpwnam(GRADER_USER).pw_uid
    folder = Path(__import__("tempfile").mkdtemp(prefix="hostile-not-root-"))
    try:
        for name in ("copy", "data"):
            shutil.copytree(built["source"] / name, folder / name)
        (folder / "hidden.json").write_text(json.dumps(built["refs"]))
        (folder / "other-student").mkdir()
        (folder / "other-student" / "theory.py").write_text(f"# another student's submission {SECRET}\n")
        subprocess.run(["chown", "-R", f"{GRADER_USER}:{GRADER_USER}", str(folder)], check=True)
        python = _python_for(GRADER_USER, folder)
        if python is None:
            pytest.skip(f"user {GRADER_USER} cannot run a Python with this virtualenv's packages")
        refused = _runs(GRADER_USER, python, folder,
                        "from assignments.sandbox import user_namespaces_refused as r; print(r() or '')")
        assert refused.returncode == 0, refused.stderr
        if refused.stdout.strip():
            pytest.skip(f"a grader that is not root cannot use user namespaces here: {refused.stdout.strip()}")
        yield {"folder": folder, "python": python, "uid": uid}
    finally:
        kill_processes_of(uid)
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run(["userdel", GRADER_USER], capture_output=True)


def grade_as_not_root(built, not_root, level: str, attacks: dict[str, str]) -> tuple[dict, subprocess.CompletedProcess]:
    """Grade each submission (name -> the attack planted in TARGET's file), in that order, with a
    grader run as the throwaway user at `level`; {name: what DRIVER wrote}, and the run."""
    folder = not_root["folder"]
    shutil.rmtree(folder / "submissions", ignore_errors=True)
    (folder / "graded.jsonl").unlink(missing_ok=True)
    for i, (name, text) in enumerate(attacks.items()):
        (folder / "submissions" / f"{i}-{name}" / TARGET.file).parent.mkdir(parents=True)
        (folder / "submissions" / f"{i}-{name}" / TARGET.file).write_text(text)
    subprocess.run(["chown", "-R", f"{GRADER_USER}:{GRADER_USER}", str(folder)], check=True)
    driver = f"NAME, FILE = {NAME!r}, {TARGET.file!r}\n" + DRIVER
    done = subprocess.run(["setpriv", f"--reuid={GRADER_USER}", f"--regid={GRADER_USER}", "--clear-groups",
                           not_root["python"], "-c", driver, level, str(folder), "autograde", MARKER],
                          cwd=folder, env={"PATH": SYSTEM_PATH, "HOME": str(folder), "TMPDIR": str(folder),
                                           "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
                          capture_output=True, text=True, timeout=600)
    lines = (folder / "graded.jsonl").read_text().splitlines() if (folder / "graded.jsonl").exists() else []
    graded = {}
    for line in lines:
        entry = json.loads(line)
        graded[entry["submission"].split("-", 1)[1]] = entry
    return graded, done


def _verdicts(entry: dict) -> dict:
    from assignments.grade import CheckResult

    return {c["check"]: CheckResult(**c) for c in entry["report"]["checks"]}


MARKER = f"hostile-grader-{os.getpid()}"  # in the command line of the grader run as the throwaway user


def _attacks(built, folder: Path) -> dict[str, str]:
    stripped, marker = built["stripped"], MARKER
    forged = [str(folder / "report.json"), str(folder / "copy" / "forged.txt")]
    files = [str(ROOT / TARGET.file), str(folder / "other-student" / "theory.py"), str(folder / "hidden.json"),
             str(folder / "data" / "target" / "config.json")]
    return {"rewrite": planted(stripped, REWRITE_RESULTS, TARGETS=forged, MARKER=marker, NAME="hostile-userns"),
            "read-proc": planted(stripped, READ_PROC, MARKER=marker, FILES=files, SECRET=SECRET),
            "escape": planted(stripped, ESCAPE),
            "daemon": planted(stripped, DAEMON, NAME="hostile-userns"),
            "kill-grader": planted(stripped, KILL_GRADER, MARKER=marker),
            "stripped": stripped}


def test_a_grader_that_is_not_root_stops_the_attacks_with_user_namespaces(built, not_root):
    """Graded by a user that is not root, each attack ends in the stub's fair 0 with nothing
    forged: the daemons die with their check (nothing of theirs is left, nothing written), the
    grader's /proc, files and the other student's are out of sight, the child has no capability
    (no remount, mount, chroot or user namespace of its own, its folder read-only), and killing
    the grader or its zygote fails (the next submission is graded). The report is official."""
    graded, done = grade_as_not_root(built, not_root, "auto", _attacks(built, not_root["folder"]))
    assert done.returncode == 0 and len(graded) == 6, done.stderr[-3000:]
    for name, entry in graded.items():
        fair(_verdicts(entry))
        assert entry["report"]["isolation"]["level"] == "userns" and entry["report"]["official"], entry["report"]
        assert entry["left"] == [], (name, entry["left"])
    output = {name: _verdicts(entry)["tokens_per_round"].output for name, entry in graded.items()}
    assert "FOUND []" in output["read-proc"], output["read-proc"]
    assert "ESCAPE []" in output["escape"], output["escape"]
    assert "were still running when the check ended: killed" in output["daemon"]
    time.sleep(0.5)  # the rewriting daemon, had it lived, writes every 50 ms
    assert not (not_root["folder"] / "report.json").exists()
    assert not (not_root["folder"] / "copy" / "forged.txt").exists()
    assert not processes_of(not_root["uid"])


def test_a_grader_that_is_not_root_without_isolation_lets_the_attacks_through(built, not_root):
    """The same submissions graded by the same user at level "none": the attacks work (the daemon
    outlives its check and writes the grader's files, the grader's environment, memory and files
    are open, the folder the code runs in is writable, the grader is killed), so the test above
    would catch a sandbox that let them through. The report says it is unofficial."""
    attacks = _attacks(built, not_root["folder"])
    graded, done = grade_as_not_root(built, not_root, "none", {name: attacks[name] for name in
                                                               ("rewrite", "read-proc", "escape", "kill-grader")})
    assert done.returncode == -9, done.stderr[-3000:]  # killed by the last submission
    assert sorted(graded) == ["escape", "read-proc", "rewrite"]
    report = graded["rewrite"]["report"]
    assert not report["official"] and report["unofficial"][0].startswith("NOT ISOLATED")
    assert graded["rewrite"]["left"], "the rewriting daemon outlived its check"
    deadline = time.monotonic() + 30
    forged = not_root["folder"] / "report.json"
    while not (forged.exists() and "FORGED" in forged.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "FORGED" in forged.read_text()
    exposed = _verdicts(graded["read-proc"])["tokens_per_round"].output
    for found in ("ENVIRON-READABLE", "MEM-READABLE", "PTRACE-ALLOWED", "WITH-SECRET"):
        assert found in exposed, exposed
    assert "TREE-WRITABLE" in _verdicts(graded["escape"])["tokens_per_round"].output
    kill_processes_of(not_root["uid"])


def test_user_namespaces_refused_falls_back_to_none_and_says_why(monkeypatch):
    """A grader that is not root where user namespaces are refused (switched off, AppArmor) is not
    isolated, and its one line says why; where they work it gets "userns"; asking for "userns"
    as root, or where it is refused, is refused with the reason."""
    import assignments.sandbox as sandbox

    with pytest.raises(AssignmentError, match="'userns' here: it is for a grader that is not root"):
        sandbox.detect("userns")
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(sandbox, "_USER_NAMESPACES_REFUSED", "")
    assert sandbox.detect().level == "userns" and sandbox.detect().user is None
    reason = "AppArmor restricts unprivileged user namespaces (sysctl kernel.apparmor_restrict_unprivileged_userns = 1)"
    monkeypatch.setattr(sandbox, "_USER_NAMESPACES_REFUSED", reason)
    isolation = sandbox.detect()
    assert isolation.level == "none"
    assert isolation.line() == f"NOT ISOLATED: the student's code ran as your own user (the grader is not root, and {reason})"
    with pytest.raises(AssignmentError, match="cannot sandbox at level 'userns' here: the grader is not root, and AppArmor"):
        sandbox.detect("userns")


def test_a_virtualenv_inside_the_hidden_checkout_is_still_bound(installed_python, tmp_path):
    """A grader whose virtualenv lies inside the checkout it hides (`.venv` in the project, as a
    user that is not root often has it): the root folder binds the interpreter's folders inside
    it (else the zygote cannot import torch), never the checkout itself, and masks an installed
    copy of the project in that virtualenv."""
    from assignments.sandbox import root_spec

    python, site_packages = installed_python
    checkout = Path(os.path.realpath(site_packages)).parents[3]  # checkout/venv/lib/pythonX.Y/site-packages
    for package in ("gpt2", "spec_decoding"):  # the checkout's packages, as the project's
        (checkout / package).mkdir(exist_ok=True)
        (checkout / package / "__init__.py").touch()
    spec = root_spec(str(python), tmp_path, [checkout])
    targets = [target for _, target, _, _ in spec["binds"]]
    assert any(str(site_packages) == t or str(site_packages).startswith(t + "/") for t in targets), targets
    assert str(checkout) not in targets
    assert {str(site_packages / name) for name in ("gpt2", "spec_decoding")} <= set(spec["masks"]), spec["masks"]


def test_a_user_namespace_sandbox_that_cannot_be_built_falls_back_to_none(built, monkeypatch):
    """The probe said user namespaces work, but building the root folder fails (a mount the
    machine refuses): the grader grades at level "none" and its line says why, rather than
    failing every grading."""
    import assignments.sandbox as sandbox

    monkeypatch.setattr(sandbox, "detect", lambda requested="auto", python=None: sandbox.Isolation("userns"))
    start = sandbox.Sandbox._start_zygote

    def refused(self, hidden):
        if self.isolation.level == "userns":
            raise OSError("the sandbox's zygote process did not start: mount proc on /proc: Operation not permitted")
        return start(self, hidden)

    monkeypatch.setattr(sandbox.Sandbox, "_start_zygote", refused)
    with sandbox.Sandbox(built["source"] / "copy") as fallen:
        assert fallen.isolation.level == "none"
        assert fallen.isolation.line() == (
            "NOT ISOLATED: the student's code ran as your own user (the user-namespace sandbox could not be built "
            "(the sandbox's zygote process did not start: mount proc on /proc: Operation not permitted))")


# ------------------------------------------------------------------------------------------------
# What the code can reach: submitted links and special files, keyrings and scratch folders
# ------------------------------------------------------------------------------------------------

def _submission_of(tmp_path: Path, make) -> Path:
    """A submission folder whose spec_decoding/policies/theory.py `make(path)` creates."""
    folder = tmp_path / "submission"
    (folder / "spec_decoding" / "policies").mkdir(parents=True)
    make(folder / "spec_decoding" / "policies" / "theory.py")
    return folder


def test_submitted_links_and_special_files_are_refused(built, tmp_path):
    """A submitted file that is a symbolic link (to the instructor's checkout, to a root-only file,
    to /proc/self/environ; or a folder on its way that is one), a hard link to a file outside the
    submission, a FIFO, a socket or a device: refused, naming the file, before anything reads it
    (through a link, the checkout's theory.py scored full marks and the others printed what they
    point to). A hard link whose every name is inside the submission, and a plain file, are taken.
    Through Gradescope's entry point (autograde): 0 points, and results.json says why."""
    import socket
    import stat

    from assignments.export import autograde
    from assignments.submission_files import RefusedSubmission, copy_submitted, submitted_files

    secret = tmp_path / "root-only.txt"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    outside = tmp_path / "outside.py"
    outside.write_text("x = 1\n")

    def unix_socket(path):
        # bound under a short name, then moved: a socket's path is limited to about 108 bytes,
        # and pytest's temporary folders can be longer
        short = Path(tempfile.mkdtemp(dir="/tmp")) / "s"
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(short))
        os.rename(short, path)
        short.parent.rmdir()

    attacks = {
        "symbolic link (to " + str(ROOT / TARGET.file): lambda p: p.symlink_to(ROOT / TARGET.file),
        "symbolic link (to " + str(secret): lambda p: p.symlink_to(secret),
        "symbolic link (to /proc/self/environ": lambda p: p.symlink_to("/proc/self/environ"),
        "hard link to a file outside the submission": lambda p: os.link(outside, p),
        "named pipe (FIFO)": os.mkfifo,
        "socket": unix_socket,
        "device file": lambda p: os.mknod(p, stat.S_IFCHR | 0o644, os.makedev(1, 3)),
    }
    for i, (what, make) in enumerate(attacks.items()):
        folder = _submission_of(tmp_path / str(i), make)
        with pytest.raises(RefusedSubmission, match=re.escape(f"refused: spec_decoding/policies/theory.py is a {what}")):
            student_files(folder, [TARGET.file])
        with pytest.raises(RefusedSubmission, match=re.escape(f"refused: theory.py is a {what}")):
            student_files(folder / "spec_decoding" / "policies", [TARGET.file])  # found by its name
    linked = tmp_path / "linked-folder"
    linked.mkdir()
    (linked / "spec_decoding").symlink_to(ROOT / "spec_decoding")
    with pytest.raises(RefusedSubmission, match="refused: spec_decoding is a symbolic link"):
        student_files(linked, [TARGET.file])
    inside = _submission_of(tmp_path / "inside", lambda p: p.write_text("y = 2\n"))
    os.link(inside / TARGET.file, inside / "copy-of-theory.py")
    files, _ = submitted_files(inside, [TARGET.file])
    copy_submitted(files[TARGET.file], tmp_path / "copied.py")
    assert (tmp_path / "copied.py").read_text() == "y = 2\n"
    # swapped for a link after it was checked: the copy (O_NOFOLLOW, then fstat) refuses it
    (inside / TARGET.file).unlink()
    (inside / TARGET.file).symlink_to(ROOT / TARGET.file)
    with pytest.raises(RefusedSubmission, match="symbolic link"):
        copy_submitted(files[TARGET.file], tmp_path / "copied-again.py")
    root = autograder(built, tmp_path / "gradescope", "unused")
    (root / "submission" / "theory.py").unlink()
    (root / "submission" / "theory.py").symlink_to(ROOT / TARGET.file)
    assert autograde(root / "source", root / "submission", root / "results" / "results.json") == 0
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["score"] == 0 and results["tests"] == []
    assert "refused: theory.py is a symbolic link" in results["output"]


LEFT_BEHIND = """
import ctypes, glob, os
libc = ctypes.CDLL(None, use_errno=True)
ADD_KEY, KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}[os.uname().machine]
found = []
for keyring in (-3, -4, -5):  # session, user, user session
    serial = libc.syscall(ctypes.c_long(KEYCTL), ctypes.c_long(10), ctypes.c_long(keyring), b"user",
                          b"left-behind", ctypes.c_long(0))  # KEYCTL_SEARCH
    if serial > 0:
        buffer = ctypes.create_string_buffer(256)
        size = libc.syscall(ctypes.c_long(KEYCTL), ctypes.c_long(11), ctypes.c_long(serial), buffer,
                            ctypes.c_long(256))  # KEYCTL_READ
        found.append("KEY " + buffer.raw[:max(size, 0)].decode(errors="replace"))
for folder in ("/tmp", os.environ["HOME"], "/dev/shm"):
    found += ["FILE " + path for path in glob.glob(f"{folder}/left-behind*")]
wrote = []
for keyring in (-3, -4, -5):
    if libc.syscall(ctypes.c_long(ADD_KEY), b"user", b"left-behind", SECRET.encode(), ctypes.c_long(len(SECRET)),
                    ctypes.c_long(keyring)) > 0:
        wrote.append(keyring)
for folder in ("/tmp", os.environ["HOME"], "/dev/shm"):
    with open(f"{folder}/left-behind-{os.getpid()}", "w") as f:
        f.write(SECRET)
        wrote.append(folder)
print("FOUND", found, "WROTE", wrote, "OOM-SCORE-ADJ", open("/proc/self/oom_score_adj").read().strip(), flush=True)
"""


def test_nothing_carries_over_between_submissions(built, sandbox, tmp_path):
    """A submission stores a key in its session, user and user-session keyrings and a file in
    /tmp, its home and /dev/shm, after looking for those a submission before it left: the next
    finds none (a fresh session keyring and the user's keyrings cleared for each check, fresh
    tmpfs). Before, a key in the user keyring was read by the next submission. Each check's process
    is also the out-of-memory killer's first choice (oom_score_adj 1000)."""
    outputs = []
    for i in range(2):
        text = planted(built["stripped"], LEFT_BEHIND, SECRET=f"{SECRET}-{i}")
        results = grade_locally(built, sandbox, text, tmp_path / str(i))
        fair(results)
        outputs.append(results["tokens_per_round"].output)  # the check that calls the planted function
    for output in outputs:
        found = re.search(r"FOUND (\[.*?\]) WROTE (\[.*?\]) OOM-SCORE-ADJ (\S+)", output)
        assert found, output
        assert found[1] == "[]" and SECRET not in found[1], output
        assert "-4" in found[2] and "'/tmp'" in found[2] and "'/dev/shm'" in found[2], output  # the writes worked
        assert found[3] == "1000"
