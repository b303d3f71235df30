"""A class of generated submissions of gamma_cost_model, graded in one batch: honest, wrong,
hanging, crashing and hostile ones, each a folder with the student's spec_decoding/policies/theory.py
(and costs.py), made from this project's own solution:

    python -m benchmarks.demo_class --out DIR [--memory MB] [--timeout S]

writes DIR/submissions/ (20 students) and DIR/grades.csv (assignments/batch.py), and prints each
row's points and seconds, the seconds per student and the machine's load. Every student gets a
row; what the hostile ones tried is in their notes. tests/test_grader_batch.py grades a few of
the same kinds (KINDS).
"""

import argparse
import csv
import os
import sys
import textwrap
import time
from pathlib import Path

NAME = "gamma_cost_model"
THEORY, COSTS = "spec_decoding/policies/theory.py", "spec_decoding/policies/costs.py"
FUNCTION = "def expected_tokens_per_round(alpha: float, gamma: int) -> float:"

# Python put at the top of expected_tokens_per_round (runs on each call, in the check's process)
HANG = "while True:\n    pass\n"
WAIT = "import threading\nthreading.Event().wait()\n"  # hangs without spinning: a wait nothing ends
CRASH = "import os\nos._exit(3)\n"
SEGFAULT = "import ctypes\nctypes.string_at(0)\n"
WRONG = "if alpha >= 1.0:\n    return float(gamma)\nreturn (1 - alpha ** gamma) / (1 - alpha)  # off by one\n"
REFERENCE_BODY = ("    if alpha >= 1.0:\n        return gamma + 1.0\n"
                  "    return (1 - alpha ** (gamma + 1)) / (1 - alpha)\n")
LOOP = "    return float(sum(alpha ** i for i in range(gamma + 1)))\n"  # honest, written differently: the body
# An answer 200,000 lists deep on the answer pipe (the only FIFO among its descriptors), then exit:
# the grader's json.loads of it raises RecursionError unless its parser is bounded.
DEEP_JSON = """
import os, stat
for fd in range(3, 256):
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.write(fd, b'{"values": ' + b'[' * 200000 + b']' * 200000 + b'}')
    except OSError:
        pass
os._exit(0)
"""
# HOGS processes of HOG_MB each (filled: the pages are really used), waited for by the check's
MEMORY_HOG = """
import os, time
children = []
for _ in range(HOGS):
    pid = os.fork()
    if pid == 0:
        block = b"x" * (HOG_MB << 20)
        time.sleep(1)  # holding its memory while the others fill theirs
        os._exit(0)
    children.append(pid)
block = b"x" * (HOG_MB << 20)
for pid in children:
    os.waitpid(pid, 0)
"""
ANSI = ('print("\\x1b[2J\\x1b[H\\x1b[32mALL PASS: 10/10 points\\x1b[0m", flush=True)\n'
        'raise RuntimeError("\\x1b[2J\\x1b[H\\x1b]0;graded\\x07\\x1b[32mALL PASS: 10/10 points\\x1b[0m\\r")\n')
# Stores a key in each keyring it has (add_key(2)), after printing any key an earlier one left
KEYRING = """
import ctypes, os
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
        found.append(buffer.raw[:max(size, 0)].decode(errors="replace"))
try:
    found += [line for line in open("/proc/keys") if "left-behind" in line]
except OSError:
    pass
wrote = [libc.syscall(ctypes.c_long(ADD_KEY), b"user", b"left-behind", SECRET.encode(), ctypes.c_long(len(SECRET)),
                      ctypes.c_long(keyring)) > 0 for keyring in (-3, -4, -5)]
print("KEYS FOUND", found, "WROTE", wrote, flush=True)
"""


def _with_attack(reference: str, code: str, **values) -> str:
    """The reference theory.py with `code` at the top of expected_tokens_per_round's body."""
    settings = "".join(f"{name} = {value!r}\n" for name, value in values.items())
    body = textwrap.indent(settings + textwrap.dedent(code), "    ")
    assert FUNCTION in reference
    start = reference.index(FUNCTION)
    docstring_end = reference.index('"""', reference.index('"""', start) + 3) + 3
    return reference[:docstring_end] + "\n" + body + reference[docstring_end:]


CONSTANT = "return 0.0\n"  # expected_tokens_per_round knows nothing: what a lookup table earns beyond
# A lookup table of the visible inputs' answers (the grid shipped with every copy), else CONSTANT
LOOKUP = """
table = TABLE
if (round(float(alpha), 6), int(gamma)) in table:
    return table[round(float(alpha), 6), int(gamma)]
return 0.0
"""


def visible_table() -> dict:
    """{(alpha, gamma): expected tokens per round} over the visible grid of gamma_cost_model."""
    from assignments.gamma_cost_model import grid_inputs
    from spec_decoding.policies.theory import expected_tokens_per_round

    grid = grid_inputs(0)
    return {(round(a, 6), g): expected_tokens_per_round(a, g) for a in grid["alphas"] for g in grid["gammas"]}


def hijacking_metadata(root: Path, classmates: list[str]) -> str:
    """A submission_metadata.yml put in a student's own folder, in Gradescope's form: the
    instructor's checkout (its solution) and a classmate's folder listed as this student's
    submissions, under ids of its choosing. Read as the export's metadata, it graded the checkout
    and dropped every folder it does not list from the CSV."""
    entries = [(str(Path(root).resolve()), "hijacker"), *((f"../{name}", f"second-id-{name}") for name in classmates)]
    return "".join(f"{key!r}:\n  :submitters:\n  - :name: Hijacker\n    :sid: {sid!r}\n" for key, sid in entries)


def student_name(number: int, kind: str) -> str:
    """The folder's name (the student's id in the CSV): NN-kind; a formula-id student's starts
    with what a spreadsheet runs as a formula."""
    name = f"{number:02d}-{kind}"
    return f'=HYPERLINK("http:example.invalid")+{name}' if kind == "formula-id" else name


def write_submission(folder: Path, kind: str, root: Path, hog_mb: int = 100, hogs: int = 12,
                     classmates: list[str] = ()) -> None:
    """One student's folder of kind `kind` (a key of KINDS), from the project at `root`
    (classmates: the folders before it, for the hijacking metadata)."""
    folder.mkdir(parents=True)
    if kind == "hijack-metadata":  # nothing of the assignment's, only the metadata
        (folder / "submission_metadata.yml").write_text(hijacking_metadata(root, classmates))
        return
    theory, costs = (root / THEORY).read_text(), (root / COSTS).read_text()
    out = folder / "spec_decoding" / "policies"
    out.mkdir(parents=True)
    if kind != "partial":
        (out / "costs.py").write_text(costs)
    attacks = {"honest": None, "honest-loop": None, "wrong": WRONG, "partial": None, "hang": HANG,
               "hang-waiting": WAIT, "crash": CRASH,
               "segfault": SEGFAULT, "deep-json": DEEP_JSON, "ansi": ANSI, "keyring": KEYRING,
               "memory-hog": MEMORY_HOG, "formula-id": None, "constant": CONSTANT}
    if kind == "symlink-checkout":
        (out / "theory.py").symlink_to(root / THEORY)
    elif kind == "symlink-environ":
        (out / "theory.py").symlink_to("/proc/self/environ")
    elif kind == "fifo":
        os.mkfifo(out / "theory.py")
    elif kind == "memory-hog":
        (out / "theory.py").write_text(_with_attack(theory, MEMORY_HOG, HOGS=hogs, HOG_MB=hog_mb))
    elif kind == "honest-loop":
        assert REFERENCE_BODY in theory
        (out / "theory.py").write_text(theory.replace(REFERENCE_BODY, LOOP, 1))
    elif kind == "lookup-table":
        (out / "theory.py").write_text(_with_attack(theory, LOOKUP, TABLE=visible_table()))
    elif kind == "keyring":
        (out / "theory.py").write_text(_with_attack(theory, KEYRING, SECRET=f"secret-of-{folder.name}"))
    elif attacks.get(kind) is not None:
        (out / "theory.py").write_text(_with_attack(theory, attacks[kind]))
    elif kind in attacks:
        (out / "theory.py").write_text(theory)
    else:
        raise ValueError(f"no kind {kind!r}: one of {', '.join(KINDS)}")


# the class: kind -> how many students
KINDS = {"honest": 3, "honest-loop": 1, "wrong": 1, "constant": 1, "lookup-table": 1, "partial": 1, "hang": 1,
         "hang-waiting": 1, "crash": 1, "segfault": 1, "symlink-checkout": 1, "fifo": 1, "deep-json": 1,
         "memory-hog": 1, "ansi": 1, "keyring": 1, "formula-id": 1, "hijack-metadata": 1}


def write_class(folder: Path, root: Path, kinds: dict = KINDS, hog_mb: int = 100, hogs: int = 12) -> list[str]:
    """A folder per student (student_name: NN-kind), in KINDS' order; their names."""
    names = []
    for kind, count in kinds.items():
        for _ in range(count):
            name = student_name(len(names) + 1, kind)
            write_submission(folder / name, kind, root, hog_mb, hogs, classmates=list(names))
            names.append(name)
    return names


def main(argv=None) -> int:
    from assignments.batch import grade_batch
    from assignments.make import ROOT
    from assignments.references import HIDDEN_SEED

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="a new folder")
    parser.add_argument("--memory", type=float, default=512, metavar="MB",
                        help="memory of one check's processes together (the memory hog asks for 12 x 100 MB)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per check (default: the check's own)")
    args = parser.parse_args(argv)
    if args.out.exists():
        parser.error(f"{args.out} exists: give a new folder")
    names = write_class(args.out / "submissions", ROOT)
    load_before = os.getloadavg()
    start = time.perf_counter()
    grade_batch(NAME, args.out / "submissions", args.out / "grades.csv", seed=HIDDEN_SEED, timeout=args.timeout,
                memory=int(args.memory * 2**20))
    seconds = time.perf_counter() - start
    rows = list(csv.DictReader((args.out / "grades.csv").open()))
    for row in rows:
        print(f"{row['submission']:22} {row['total']:>3}/{row['max']}  {float(row['seconds']):6.1f} s  "
              f"{row['similar_to_reference']:>28}  {row['notes'][:110]}")
    grading = sum(float(row["seconds"]) for row in rows)
    print(f"{len(rows)} rows for {len(names)} students; {seconds:.0f} s in all (building included), "
          f"{grading / len(rows):.1f} s a student grading; load average before {load_before[0]:.2f}, "
          f"after {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    return 0 if len(rows) == len(names) else 1


if __name__ == "__main__":
    sys.exit(main())
