"""python -m assignments {make,grade,check,export}: see assignments/__init__.py and
docs/instructor_guide.md."""

import argparse
import json
import sys
from pathlib import Path

from .definition import AssignmentError
from .printable import printable
from .registry import ASSIGNMENTS
from .sandbox import LEVELS


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m assignments", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make", help="copy the project with functions' bodies removed, for a student")
    which = m.add_mutually_exclusive_group(required=True)
    which.add_argument("--functions", nargs="+", metavar="NAME",
                       help="dotted names, e.g. spec_decoding.algorithms.rejection.residual_distribution "
                            "gpt2.kv_cache.KVCache.truncate (each must be exercised by a check)")
    which.add_argument("--assignment", choices=sorted(ASSIGNMENTS),
                       help="a ready-made assignment (assignments/<name>/README.md)")
    m.add_argument("--out", required=True, type=Path, help="a new or empty folder for the student's copy")
    m.add_argument("--student", metavar="ID", help="find_the_bug: this student's own copy (the bug the "
                                                   "instructor's secret, $FIND_THE_BUG_SECRET, and the id pick)")
    m.add_argument("--allow-leaks", action="store_true",
                   help="make the copy even if the leak check finds a stripped body elsewhere in it (warns)")
    g = sub.add_parser("grade", help="the instructor's grade of a student's copy (or of a folder of "
                                     "submissions): every check, hidden inputs")
    g.add_argument("dir", type=Path, nargs="?", help="the student's copy (or a folder of their edited files with "
                                                     "the copy's .assignment.json); with --submissions: the "
                                                     "assignment's name (or give --assignment)")
    g.add_argument("--submissions", type=Path, metavar="DIR",
                   help="grade every submission in DIR (a folder per student, or Gradescope's "
                        "'Export Submissions' folder or .zip) into one CSV (--csv)")
    g.add_argument("--csv", type=Path, metavar="FILE", help="with --submissions: the CSV to write "
                                                            "(default: grades-ASSIGNMENT.csv; never overwritten)")
    g.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="with --submissions: grade N submissions at once (each check uses one core; default 1)")
    g.add_argument("--json", action="store_true", help="print the report as JSON")
    g.add_argument("--student", metavar="ID", help="whose copy it is (find_the_bug copies made with --student)")
    g.add_argument("--seed", type=int, default=None, help="the hidden inputs' seed, 1..10000 (default: a fresh one, "
                                                          "printed with the grade; another one re-runs the "
                                                          "statistical checks on fresh samples)")
    g.add_argument("--only", nargs="+", metavar="CHECK", help="run only these checks")
    g.add_argument("--timeout", type=float, default=None, help="seconds per check (default: the check's own); "
                                                               "a submission's checks share the longest one")
    g.add_argument("--memory", type=float, default=None, metavar="MB",
                   help="with --submissions: memory in MB the processes of one check may use together "
                        "(default: 2048, or half of this machine's or container's memory if less)")
    g.add_argument("--assignment", choices=sorted(ASSIGNMENTS),
                   help="what to grade (else read from the copy's .assignment.json, and the grade is unofficial)")
    g.add_argument("--functions", nargs="+", metavar="NAME", help="what to grade: a custom assignment's functions")
    g.add_argument("--sandbox", choices=["auto", *LEVELS], default="auto",
                   help="how to shut in the student's code (default: the best this machine allows; "
                        "docs/instructor_guide.md, the threat model)")
    c = sub.add_parser("check", help="the student's run, inside their copy: the visible checks")
    c.add_argument("dir", type=Path, nargs="?", default=Path("."), help="the copy (default: here)")
    c.add_argument("--only", nargs="+", metavar="CHECK", help="run only these checks")
    c.add_argument("--json", action="store_true", help="print the report as JSON")
    c.add_argument("--summary", type=Path, metavar="FILE",
                   help="also append the report as a Markdown table to FILE (the GitHub workflow "
                        "passes $GITHUB_STEP_SUMMARY)")
    e = sub.add_parser("export", help="an autograder for a course platform")
    e.add_argument("platform", choices=["gradescope", "github", "github-classroom"],
                   help="github-classroom: the same as github (Classroom's autograding actions are deprecated)")
    e.add_argument("assignment", choices=sorted(ASSIGNMENTS))
    e.add_argument("--out", required=True, type=Path,
                   help="gradescope: the .zip to write; github: a new or empty folder")
    e.add_argument("--seed", type=int, default=None, help="gradescope: the hidden inputs' one seed (default: "
                                                          "8 fresh ones, each run of the autograder draws one)")
    a = sub.add_parser("autograde", help=argparse.SUPPRESS)  # what an exported run_autograder calls
    a.add_argument("--source", type=Path, required=True)
    a.add_argument("--submission", type=Path, required=True)
    a.add_argument("--results", type=Path, required=True)
    a.add_argument("--sandbox", choices=["auto", *LEVELS], default="auto")
    args = parser.parse_args(argv)
    try:
        return run(args)
    except AssignmentError as error:
        print(f"error: {printable(error)}", file=sys.stderr)  # it may name a submitted file
        return 2


def run(args) -> int:
    from .grade import check_locally, grade, print_report
    from .references import official_seed

    if args.command == "make":
        from .make import make

        functions = args.functions or list(ASSIGNMENTS[args.assignment].functions)
        targets = make(functions, args.out, assignment=args.assignment, allow_leaks=args.allow_leaks,
                       student=args.student)
        planted = args.assignment and ASSIGNMENTS[args.assignment].plant
        print(f"Wrote {args.out} with " + ("a bug planted in one of these (the student names it in BUG.txt and "
                                           "fixes it):" if planted else
                                           "these bodies removed (raise NotImplementedError):"))
        for t in targets:
            print(f"  {t.name}  ({t.file}:{t.node.lineno})")
        print(f"Students check their work with: cd {args.out} && python -m assignments check")
        print(f"Grade it with: python -m assignments grade {args.out}")
        return 0
    if args.command == "grade" and args.submissions is not None:
        from .batch import grade_batch

        name = args.assignment or (str(args.dir) if args.dir is not None else None)
        if name not in ASSIGNMENTS:
            raise AssignmentError(f"with --submissions, name the assignment ({', '.join(sorted(ASSIGNMENTS))}): "
                                  f"grade NAME --submissions DIR, or --assignment NAME")
        csv = args.csv or Path(f"grades-{name}.csv")
        grade_batch(name, args.submissions, csv, seed=official_seed(args.seed),
                    timeout=args.timeout, jobs=args.jobs, isolation=args.sandbox,
                    memory=int(args.memory * 2**20) if args.memory else None)
        print(f"Wrote {csv}")
        return 0
    if args.command in ("grade", "check"):
        if args.command == "grade":
            if args.dir is None:
                raise AssignmentError("give the student's copy to grade (or --submissions DIR for a whole class)")
            print(f"Grading {args.dir} (small checkpoints made on the fly) ...", file=sys.stderr)
            report = grade(args.dir, seed=args.seed, timeout=args.timeout, only=args.only,
                           assignment=args.assignment, functions=args.functions, isolation=args.sandbox,
                           student_id=args.student)
        else:
            report = check_locally(args.dir, only=args.only)
            if args.summary is not None:
                from .export import markdown_summary

                with open(args.summary, "a") as summary:
                    summary.write(markdown_summary(report))
        if args.json:
            print(json.dumps(report.to_json(), indent=2))
        else:
            print_report(report)
            if args.command == "check":
                print("(the visible checks only; the grade runs more, on other inputs)")
        return 0 if report.passed else 1
    if args.command == "export":
        from .export import export_github, export_gradescope

        if args.platform == "gradescope":
            from .export import EXPORTED_SEEDS
            from .references import draw_seed

            seeds = official_seed(args.seed) if args.seed is not None else sorted(
                {draw_seed() for _ in range(EXPORTED_SEEDS)})
            path = export_gradescope(args.assignment, args.out, seed=seeds)
            print(f"Wrote {path}: upload it as the assignment's autograder (Gradescope: "
                  f"Configure Autograder, zip upload, base image Ubuntu with Python 3)")
        else:
            path = export_github(args.assignment, args.out)
            print(f"Wrote {path}: the starter repository (git init, commit everything, push; "
                  f".github/workflows/checks.yml runs the visible checks on every push)")
        return 0
    from .export import autograde

    return autograde(args.source, args.submission, args.results, isolation=args.sandbox)


if __name__ == "__main__":
    sys.exit(main())
