"""A process with torch imported that forks one child per check (python -m assignments.zygote FD).

Importing torch costs about a second of CPU; every check paying it again would make grading
(and this project's tests) slow. The grader starts one zygote in the temporary copy, with the
same scrubbed environment a check gets; it imports torch and the grader's check definitions
(assignments/, never the student's files) and waits. For each check the grader sends it four
file descriptors over a Unix socket: the child's stdin (the inputs), its stdout/stderr, the
pipe for its answer and a socket to the grader (assignments/serving.py). The zygote forks; the child starts its own session (so the grader can kill
it and all it started on a timeout), imports the student's code fresh and runs the probe
(assignments/runner.py). So every check still runs in its own process, with its own timeout.
"""

import json
import os
import socket
import sys


def serve(sock: socket.socket) -> None:
    import torch

    import assignments.registry  # noqa: F401  (the check definitions: the grader's files, not the student's)

    # The student's modules must be imported fresh by each check's child, never here.
    assert not {m.split(".")[0] for m in sys.modules} & {"gpt2", "spec_decoding"}, "zygote imported project code"

    torch.set_num_threads(1)
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 65536, 4)
        except OSError:
            message = b""
        if not message:  # the grader closed its end: done
            reap(block=True)  # waited for, so their CPU time counts as ours (and the grader's)
            return
        request = json.loads(message)
        pid = os.fork()
        if pid == 0:
            sock.close()
            os.setsid()
            stdin, output, answer, served = fds
            os.dup2(output, 1)
            os.dup2(output, 2)
            os.close(output)
            os.chdir(request["tree"])
            sys.path[0] = request["tree"]
            from pathlib import Path

            from .runner import run

            with os.fdopen(stdin) as inputs:
                text = inputs.read()
            run(request["check"], Path(request["data"]), answer, text, served)
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"pid": pid}).encode())
        reap(block=False)


def reap(block: bool) -> None:
    """Wait for the children that ended (all of them, with block)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
