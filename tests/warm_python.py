"""`python script.py ...`, `python -m module ...` and `python -c code ...` for the tests, started
from a process that has imported torch already (a fork server), so that each run skips the
import a fresh interpreter pays (the largest part of a short script's CPU).

    run([sys.executable, "benchmark.py", "--gammas", "1"], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=120)      # as subprocess.run; WarmPopen as subprocess.Popen (a subset)

What the run sees is what a fresh `python` would: its arguments (sys.argv), working folder,
environment (os.environ), sys.path (the script's folder or the working folder, then PYTHONPATH,
then the interpreter's own), stdin/stdout/stderr, exit status, atexit handlers; its modules are
imported afresh, but torch (and what torch imports) is already there. What a fresh interpreter
fixes when it starts (the environment variables PyTorch, OpenMP and Python read then: PYTHON*,
OMP_*, ATEN_CPU_CAPABILITY, ...) is that of the server: one server is started per distinct set of
those values, so a run never gets another's. Python's hash seed is the server's too: a test that
needs a new process's own (two runs giving the same tokens) starts a real one (subprocess).

How: the server (one per pytest process and start-up environment) forks a waiter per run; the
waiter forks the run, tells its pid, waits for it and sends its exit status back.
"""

import atexit
import io
import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time

# Read by an interpreter (or PyTorch, OpenMP, the allocator) when it starts: the server's own.
STARTUP_PREFIXES = ("PYTHON", "OMP_", "MKL_", "KMP_", "GOMP_", "ATEN_", "ONEDNN_", "DNNL_", "TORCH", "PYTORCH",
                    "CUDA", "TRITON", "LD_", "MALLOC", "LC_", "LANG")
# but these a run may set for itself: each run gets its own
PER_RUN = {"PYTHONPATH"}


def startup_env(env: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(STARTUP_PREFIXES) and k not in PER_RUN))


# ------------------------------------------------------------------------------------------------
# The server's side (runs in the server process: `python -c SERVER FD`)
# ------------------------------------------------------------------------------------------------

SERVER = "import sys, torch; sys.path.insert(0, sys.argv[2]); import warm_python; warm_python.serve(int(sys.argv[1]))"


def serve(fd: int) -> None:
    control = socket.socket(fileno=fd)
    here = os.path.dirname(os.path.abspath(__file__))
    base_path = [p for p in sys.path if p not in ("", here)]  # the interpreter's own (its -c put "" first)
    waiters = set()
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, 1 << 20, 4)
        except OSError:
            message = b""
        if not message:  # the tests' process ended
            for pid in waiters:
                os.waitpid(pid, 0)
            return
        pid = os.fork()
        if pid == 0:  # whatever happens in the waiter, it never goes back to this loop
            try:
                control.close()
                _waiter(json.loads(message), fds, base_path)
            finally:
                os._exit(0)
        waiters.add(pid)
        for fd_ in fds:
            os.close(fd_)
        for done in list(waiters):  # reaped here, so that their CPU time counts as the tests'
            if os.waitpid(done, os.WNOHANG)[0]:
                waiters.discard(done)


def _waiter(request: dict, fds: list[int], base_path: list[str]) -> None:
    reply = socket.socket(fileno=fds[3])
    started_read, started_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            reply.close()
            os.close(started_read)
            _run(request, fds[:3], base_path, started_write)
        finally:
            os._exit(1)
    for fd in (*fds[:3], started_write):
        os.close(fd)
    os.read(started_read, 1)  # its session is set (a caller may signal its process group at once)
    reply.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    _, status = os.waitpid(pid, 0)
    reply.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")


def _run(request: dict, stdio: list[int], base_path: list[str], started: int) -> None:
    import runpy
    import types

    code = 1
    try:
        if request["new_session"]:
            os.setsid()
        os.write(started, b".")
        os.close(started)
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _fresh_stdio()
        kind, what, args = request["kind"], request["what"], request["args"]
        first = {"script": os.path.dirname(os.path.realpath(what)), "-c": "", "-m": os.getcwd()}[kind]
        extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [first, *extra, *base_path]
        if kind == "script":
            sys.argv = [what, *args]
            runpy.run_path(what, run_name="__main__")
        elif kind == "-m":
            sys.argv = ["-m", *args]
            runpy._run_module_as_main(what, alter_argv=True)
        else:
            sys.argv = ["-c", *args]
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(what, "<string>", "exec"), main.__dict__)
        code = 0
    except SystemExit as e:
        code = _exit_code(e.code)
    except BaseException as e:
        traceback = e.__traceback__  # from the run's own first frame, as an interpreter shows it
        while traceback and traceback.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>"):
            traceback = traceback.tb_next
        sys.excepthook(type(e), e.with_traceback(traceback), traceback)
    try:
        threading._shutdown()  # as an interpreter's exit: wait for the threads it started
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _fresh_stdio() -> None:
    """Text streams on the new file descriptors, made as an interpreter makes them."""
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    for name, fd, mode in (("stdin", 0, "r"), ("stdout", 1, "w"), ("stderr", 2, "w")):
        old = getattr(sys, name)
        raw = io.FileIO(fd, mode, closefd=False)
        buffered = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
        stream = io.TextIOWrapper(buffered, encoding=old.encoding, errors=old.errors,
                                  line_buffering=(name == "stderr" or os.isatty(fd)) and not unbuffered,
                                  write_through=unbuffered and mode == "w")
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


# ------------------------------------------------------------------------------------------------
# The tests' side
# ------------------------------------------------------------------------------------------------

_servers: dict[tuple, tuple[subprocess.Popen, socket.socket]] = {}
_lock = threading.Lock()


def _server(env: dict) -> socket.socket:
    key = startup_env(env)
    with _lock:
        if key not in _servers:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            server_env = {k: v for k, v in os.environ.items() if k not in dict(startup_env(os.environ))}
            server_env.update(key)
            server_env.pop("PYTHONPATH", None)
            process = subprocess.Popen([sys.executable, "-c", SERVER, str(theirs.fileno()), os.path.dirname(__file__)],
                                       pass_fds=(theirs.fileno(),), env=server_env, stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, start_new_session=True)
            theirs.close()
            _servers[key] = (process, ours)
        return _servers[key][1]


@atexit.register
def stop_servers() -> None:
    """End the servers (each waits for its runs first): tests/conftest.py calls it when the
    session ends, so that the runs' CPU time is counted in the test process's children."""
    with _lock:
        for process, control in _servers.values():
            control.close()
            process.wait()
        _servers.clear()


def _parse(args: list[str]) -> tuple[str, str, list[str]]:
    """(kind, what, the script's arguments) of [python, script | -m module | -c code, args...]."""
    if len(args) < 2 or args[0] != sys.executable:
        raise ValueError(f"warm_python runs this interpreter ({sys.executable}) only: {args[:1]}")
    if args[1] in ("-m", "-c"):
        return args[1], args[2], list(args[3:])
    if args[1].startswith("-"):
        raise ValueError(f"warm_python does not take interpreter options ({args[1]}): use subprocess")
    return "script", args[1], list(args[2:])


class WarmPopen:
    """subprocess.Popen's subset the tests (and jupyter_client, for a notebook's kernel) use:
    stdin, stdout and stderr each None (inherited), DEVNULL, PIPE or a file descriptor; cwd, env,
    start_new_session; poll, wait, kill, terminate, send_signal, communicate, returncode, pid."""

    def __init__(self, args, stdin=None, stdout=None, stderr=None, cwd=None, env=None, start_new_session=False):
        kind, what, rest = _parse([str(a) for a in args])
        env = dict(os.environ if env is None else env)
        ours, child = {}, []
        for fd, spec in enumerate((stdin, stdout, stderr)):
            ours[fd] = None
            if spec == subprocess.PIPE:
                r, w = os.pipe()
                mine, theirs = (w, r) if fd == 0 else (r, w)
                ours[fd] = os.fdopen(mine, "wb" if fd == 0 else "rb")
                child.append(theirs)
            elif spec == subprocess.DEVNULL:
                child.append(os.open(os.devnull, os.O_RDWR))
            else:
                child.append(os.dup(fd if spec is None else spec if isinstance(spec, int) else spec.fileno()))
        self.stdin, self.stdout, self.stderr = ours[0], ours[1], ours[2]
        self.args, self.returncode = args, None
        self._reply, theirs = socket.socketpair()
        self._buffer = b""
        request = {"kind": kind, "what": what, "args": rest, "cwd": os.path.abspath(cwd or os.getcwd()), "env": env,
                   "new_session": bool(start_new_session)}
        try:
            socket.send_fds(_server(env), [json.dumps(request).encode()], [*child, theirs.fileno()])
        finally:
            for fd in child:
                os.close(fd)
            theirs.close()
        self.pid = self._message(None)["pid"]

    def _message(self, timeout):
        """The waiter's next line (a dict); None if none came within timeout seconds."""
        while b"\n" not in self._buffer:
            if not select.select([self._reply], [], [], timeout)[0]:
                return None
            data = self._reply.recv(4096)
            if not data:
                raise OSError("warm_python: the server ended before the run reported")
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def _returncode_within(self, timeout) -> bool:
        """Whether the run's exit status came within timeout seconds (then kept in returncode)."""
        message = self._message(timeout)
        if message is None:
            return False
        self.returncode = message["returncode"]
        self._reply.close()
        return True

    def poll(self):
        if self.returncode is None:
            self._returncode_within(0)
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None and not self._returncode_within(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, signum):
        if self.returncode is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def communicate(self, input=None, timeout=None):
        """(stdout, stderr) bytes (None where not a pipe), read until both close; then waits."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.stdin is not None:
            if input:
                self.stdin.write(input)
            self.stdin.close()
        chunks = {1: [], 2: []}
        with selectors.DefaultSelector() as selector:
            for fd, stream in ((1, self.stdout), (2, self.stderr)):
                if stream is not None:
                    selector.register(stream, selectors.EVENT_READ, fd)
            while selector.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout)
                for key, _ in selector.select(left):
                    data = os.read(key.fd, 1 << 16)
                    if data:
                        chunks[key.data].append(data)
                    else:
                        selector.unregister(key.fileobj)
                        key.fileobj.close()
        self.wait(None if deadline is None else max(deadline - time.monotonic(), 0.001))
        return (None if self.stdout is None else b"".join(chunks[1]),
                None if self.stderr is None else b"".join(chunks[2]))


def run(args, cwd=None, env=None, input=None, capture_output=False, text=False, timeout=None,
        check=False) -> subprocess.CompletedProcess:
    """subprocess.run's subset the tests use, through the fork server."""
    pipe = subprocess.PIPE if capture_output else None
    process = WarmPopen(args, stdin=subprocess.PIPE if input is not None else None,
                        stdout=pipe, stderr=pipe, cwd=cwd, env=env)
    if text and input is not None:
        input = input.encode()
    try:
        out, err = process.communicate(input, timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    if text:
        out, err = (None if b is None else b.decode("utf-8", "replace") for b in (out, err))
    done = subprocess.CompletedProcess(args, process.returncode, out, err)
    if check:
        done.check_returncode()
    return done
