"""How often each statistical check (Check.statistical) fails the bug zoo's sampling bugs, with
its second draw: a student fails only if both independent draws fail (grade.second_draw).

    python -m benchmarks.statistical_power [--seeds N] [--assignments NAME ...]

For each assignment with statistical checks, at seeds 1..N: the references (and second draws)
are computed with this project's code, then each bug of spec_decoding/bug_zoo.py that changes
what the samples are drawn from (its check "lossless", and "sampler match", lossless by design:
the control) is planted in this process and the instructor's code judged as a student is
(references.failing_checks). Prints, per check and bug, in how many of the N seeds both draws
failed (the power against it), and the combined false-failure rate a correct solution has:
alpha squared per check, summed over the assignment's statistical checks. find_the_bug's
bug_fixed (a served check, much slower) is left out unless named.
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

DEFAULT = ("rejection_sampling", "tree_verify", "ngram_drafter")


def sampling_bugs() -> dict:
    """The zoo's bugs that change the sampled law (caught by check_lossless), and sampler match."""
    from spec_decoding.checks.bug_zoo import BUGS

    return {name: bug for name, bug in BUGS.items() if bug.check == "lossless" or name == "sampler match"}


def power(name: str, seeds: int, data: Path) -> dict:
    """{check: {bug: how many of the seeds failed it on both draws}} for assignment `name`."""
    from assignments.references import failing_checks, references
    from assignments.registry import ASSIGNMENTS

    assignment = ASSIGNMENTS[name]
    checks = [c for c in assignment.checks if c.statistical]
    caught = {c.name: {bug: 0 for bug in sampling_bugs()} for c in checks}
    for seed in range(1, seeds + 1):
        refs = references(assignment, data, seed, checks)  # the instructor's code, no bug planted
        for bug_name, bug in sampling_bugs().items():
            with bug.planted():
                failed = failing_checks(assignment, data, refs)
            for check in failed:
                caught[check][bug_name] += 1
    return caught


def main(argv=None) -> int:
    from assignments.references import make_data
    from spec_decoding.checks import P_VALUE_THRESHOLD

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds 1..N (default 5)")
    parser.add_argument("--assignments", nargs="+", default=list(DEFAULT))
    args = parser.parse_args(argv)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="power-") as tmp:
        data = make_data(Path(tmp) / "data")
        for name in args.assignments:
            caught = power(name, args.seeds, data)
            print(f"\n{name}: combined false-failure rate of a correct solution "
                  f"{len(caught) * P_VALUE_THRESHOLD ** 2:.0e} ({len(caught)} checks x alpha^2 = "
                  f"{P_VALUE_THRESHOLD ** 2:.0e}); seeds failing each bug on both draws, of {args.seeds}:")
            bugs = list(sampling_bugs())
            print("| check | " + " | ".join(bugs) + " |")
            print("|---|" + "---|" * len(bugs))
            for check, row in caught.items():
                print(f"| {check} | " + " | ".join(f"{row[bug]}/{args.seeds}" for bug in bugs) + " |")
    print(f"\n{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
