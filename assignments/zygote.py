"""A process with torch imported that forks one child per check
(python -m assignments.zygote FD CONFIG; started by assignments/sandbox.py).

Importing torch costs about a second of CPU; every check paying it again would make grading
(and this project's tests) slow. The sandbox starts one zygote in its folder, with a scrubbed
environment; with namespaces it first builds the sandbox's root folder and chroots into it
(sandbox.build_root). It imports torch and the grader's check definitions (assignments/, never the
student's files) and waits. For each check the grader sends it four file descriptors over a Unix
socket: the child's stdin (the inputs), its stdout/stderr, the pipe for its answer and a socket to
the grader (for the checks it serves a model to: assignments/serving.py). The zygote
forks; the child reads its inputs, starts its own session, drops to the sandbox user
(sandbox.enter), imports the student's code fresh and runs the probe (assignments/runner.py). The
zygote tells the grader the child's pid, and later that it exited (and how), so the grader knows
when the check is over without trusting anything the child's processes hold open. In "userns"
(no sandbox user to kill by) the grader then asks the zygote, the init of the namespace, to kill
every other process in it.
"""

import json
import os
import select
import signal
import socket
import sys


def serve(sock: socket.socket, config: dict) -> None:
    from .sandbox import build_root, enter

    if config["level"] in ("namespaces", "userns"):
        build_root(config["spec"])
        os.chdir(sys.path[0])  # the same path inside the new root
    import torch

    import assignments.registry  # noqa: F401  (the check definitions: the grader's files, not the student's)
    # What the project imports from outside itself (besides torch), loaded once here: each check's
    # child imports the student's copy of the project afresh, and then only the project's own modules.
    import getpass  # noqa: F401
    import statistics  # noqa: F401
    import safetensors.torch  # noqa: F401

    from .runner import run

    # The student's modules must be imported fresh by each check's child, never here.
    assert not {m.split(".")[0] for m in sys.modules} & {"gpt2", "spec_decoding"}, "zygote imported project code"

    torch.set_num_threads(1)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # in "userns" a child may signal it: no KeyboardInterrupt
    signal.set_wakeup_fd(wake_write)
    children = set()
    sock.send(json.dumps({"ready": True}).encode())
    while True:
        ready, _, _ = select.select([sock, wake_read], [], [])
        if wake_read in ready:
            try:
                while os.read(wake_read, 4096):
                    pass
            except BlockingIOError:
                pass
            for pid, code in reaped():
                if pid in children:
                    children.discard(pid)
                    sock.send(json.dumps({"exited": pid, "code": code}).encode())
        if sock not in ready:
            continue
        try:
            message, fds, _, _ = socket.recv_fds(sock, 65536, 4)
        except OSError:
            message = b""
        if not message:  # the grader closed its end: done
            return
        request = json.loads(message)
        if request.get("kill"):
            killed = kill_the_rest()
            children.clear()
            sock.send(json.dumps({"killed": killed}).encode())
            continue
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            child(request, fds, config, run, enter)
        for fd in fds:
            os.close(fd)
        children.add(pid)
        sock.send(json.dumps({"pid": pid}).encode())


def child(request: dict, fds, config: dict, run, enter) -> None:
    """A check's child: never returns."""
    try:
        os.setsid()  # its own session (without a sandbox user, what the grader kills)
        stdin, output, answer, served = fds
        with os.fdopen(stdin, "rb") as inputs:  # read before any student code runs
            text = inputs.read().decode()
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(output)
        enter(config, request["tree"], keep_fds=(answer, served))
        sys.path[0] = request["tree"]
        from pathlib import Path

        run(request["check"], Path(request["data"]), answer, text, served)
    finally:
        os._exit(112)  # something above failed: the grader reports a check that sent nothing


def kill_the_rest() -> int:
    """As the init of the sandbox's PID namespace ("userns"): SIGKILL every other process in it
    and reap them all; how many were running. kill(-1) reaches every process of the namespace but
    the caller, and a process being killed cannot fork, so nothing started in between survives."""
    running = 0
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and int(entry) != os.getpid() and \
                    open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[0] not in "ZX":
                running += 1
        except OSError:
            pass
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return running


def reaped():
    """(pid, exit code as subprocess gives it) of each child that ended."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])), json.loads(sys.argv[2]))
    # Done: nothing of the zygote's needs tearing down (the grader kills what is left of the
    # sandbox), and an interpreter with torch loaded takes a noticeable while to exit.
    os._exit(0)
