"""python -m assignments {make,grade}: see assignments/__init__.py and the README."""

import argparse
import sys
from pathlib import Path

from . import ASSIGNMENTS
from .make import AssignmentError, make


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m assignments", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make", help="copy the project with functions' bodies removed, for a student")
    which = m.add_mutually_exclusive_group(required=True)
    which.add_argument("--functions", nargs="+", metavar="NAME",
                       help="dotted names, e.g. spec_decoding.rejection.residual_distribution "
                            "gpt2.kv_cache.KVCache.truncate")
    which.add_argument("--assignment", choices=sorted(ASSIGNMENTS),
                       help="a ready-made assignment (assignments/<name>/README.md)")
    m.add_argument("--out", required=True, type=Path, help="a new or empty folder for the student's copy")
    g = sub.add_parser("grade", help="grade a student's copy made by `make`")
    g.add_argument("dir", type=Path, help="the student's copy")
    g.add_argument("--timeout", type=float, default=300, help="seconds before the checks are stopped (default 300)")
    args = parser.parse_args(argv)
    try:
        if args.command == "make":
            functions = args.functions or ASSIGNMENTS[args.assignment]
            targets = make(functions, args.out, assignment=args.assignment)
            print(f"Wrote {args.out} with these bodies removed (raise NotImplementedError):")
            for t in targets:
                print(f"  {t.name}  ({t.file}:{t.node.lineno})")
            print(f"Grade it with: python -m assignments grade {args.out}")
            return 0
        from .grade import grade, print_report
        print(f"Grading {args.dir} (small checkpoints made on the fly; about 15 s) ...", file=sys.stderr)
        report = grade(args.dir, timeout=args.timeout)
        print_report(report)
        return 0 if report.passed else 1
    except AssignmentError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
