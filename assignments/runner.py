"""The child process of one check, run inside the student's copy (its cwd and sys.path[0]):

    python -m assignments.runner CHECK DATA_DIR FD SERVED_FD    (the check's inputs as JSON on stdin)

(or forked by assignments/zygote.py, which has torch imported already: the same, faster).

It calls the check's probe, which calls the student's functions, and writes one JSON object to
file descriptor FD, a pipe the grader opened: {"values": ...} or {"error": "..."}. It never
judges: the grader compares the values with the reference in its own process. Everything the
student's code prints goes to stdout/stderr, which the grader only shows (truncated).
"""

import json
import os
import sys
import traceback
from pathlib import Path


def explain(error: BaseException) -> str:
    """The student's exception in one line, with where in their copy it was raised."""
    from assignments.memory import out_of_memory

    if isinstance(error, NotImplementedError):
        return f"not implemented yet ({error})"
    here = str(Path.cwd().resolve())
    memory = out_of_memory(error)
    if memory:
        return memory
    if isinstance(error, SyntaxError) and error.filename and error.filename.startswith(here):
        return (f"your code could not be imported: SyntaxError: {error.msg} at "
                f"{Path(error.filename).relative_to(here)}:{error.lineno}")
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if f.filename.startswith(here) and "/assignments/" not in f.filename]
    where = f" at {Path(frames[-1].filename).relative_to(here)}:{frames[-1].lineno}" if frames else ""
    if isinstance(error, ImportError):  # the student's file imports something that is not there
        return f"your code could not be imported: {type(error).__name__}: {error}{where}"
    return f"raised {type(error).__name__}: {error}{where}"


def run(check_name: str, data: Path, fd: int, inputs_text: str, served_fd: int | None = None) -> None:
    """Run one check's probe and write its answer to fd; never returns (os._exit). served_fd: a
    socket to the grader, for the checks it serves a model to (assignments/serving.py)."""
    import torch

    torch.set_num_threads(1)
    message = {}
    try:
        from assignments import serving
        from assignments.registry import all_checks

        if served_fd is not None:
            serving.connect(served_fd)

        check = all_checks()[check_name]
        message = {"values": check.probe(json.loads(inputs_text), data)}
    except BaseException as error:  # noqa: BLE001  (whatever the student's code does is a verdict)
        message = {"error": explain(error)}
    try:
        text = json.dumps(message)
    except (TypeError, ValueError) as error:
        text = json.dumps({"error": f"the values could not be sent back: {error}"})
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        with os.fdopen(fd, "w") as channel:
            channel.write(text)
    finally:
        os._exit(0)  # no atexit hooks: nothing the student's code registered runs after the probe


def main(argv) -> None:
    run(argv[0], Path(argv[1]), int(argv[2]), sys.stdin.read(), int(argv[3]) if len(argv) > 3 else None)


if __name__ == "__main__":
    main(sys.argv[1:])
