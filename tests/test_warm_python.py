"""tests/warm_python.py (how the tests start the scripts they run as `python ...`) against the
reference it stands in for: a fresh interpreter started by subprocess, on the same commands."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import warm_python

# What a run can see of how it was started.
PROBE = textwrap.dedent("""
    import json, os, sys
    print(json.dumps({"argv": sys.argv, "path": sys.path, "cwd": os.getcwd(), "env": os.environ.get("PROBE"),
                      "stdin": sys.stdin.read(), "encoding": [sys.stdout.encoding, sys.stderr.errors],
                      "main": __name__, "file": globals().get("__file__")}))
    print("to stderr", file=sys.stderr)
""")


def both(args, **kwargs):
    """(fresh, warm) CompletedProcess of the same command."""
    return (subprocess.run(args, capture_output=True, text=True, timeout=120, **kwargs),
            warm_python.run(args, capture_output=True, text=True, timeout=120, **kwargs))


@pytest.fixture(scope="module")
def probe_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("warm")
    (folder / "pkg").mkdir()
    (folder / "pkg" / "__init__.py").write_text("")
    (folder / "pkg" / "probe.py").write_text(PROBE)
    (folder / "probe.py").write_text(PROBE)
    (folder / "elsewhere").mkdir()
    return folder


@pytest.mark.parametrize("kind", ["script", "-m", "-c"])
def test_a_run_sees_what_a_fresh_interpreter_sees(probe_files, kind):
    """argv, sys.path (the script's folder, the working folder or "", then PYTHONPATH, then the
    interpreter's), working folder, environment, stdin, stdout's encoding, __name__, __file__."""
    command = {"script": [str(probe_files / "probe.py")], "-m": ["-m", "pkg.probe"], "-c": ["-c", PROBE]}[kind]
    env = {**os.environ, "PROBE": "yes", "PYTHONPATH": str(probe_files / "elsewhere")}
    cwd = probe_files if kind == "-m" else probe_files / "elsewhere"
    fresh, warm = both([sys.executable, *command, "one", "two words"], cwd=cwd, env=env, input="given")
    assert fresh.returncode == warm.returncode == 0, (fresh.stderr, warm.stderr)
    assert json.loads(warm.stdout) == json.loads(fresh.stdout)
    assert json.loads(warm.stdout)["stdin"] == "given" and warm.stderr == fresh.stderr == "to stderr\n"


@pytest.mark.parametrize("code, returncode", [
    ("import sys; sys.exit(3)", 3),
    ("import sys; sys.exit('a message')", 1),
    ("raise ValueError('boom')", 1),
    ("import atexit, threading, time; atexit.register(print, 'at exit');"
     "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()", 0),
])
def test_exit_status_traceback_atexit_and_threads_as_a_fresh_interpreter(code, returncode):
    """The exit status, what is printed on the way out (a message, a traceback from the run's own
    first frame), atexit handlers, and the wait for the threads it started."""
    fresh, warm = both([sys.executable, "-c", code])
    assert fresh.returncode == warm.returncode == returncode
    assert (warm.stdout, warm.stderr) == (fresh.stdout, fresh.stderr)


def test_each_run_draws_its_own_random_numbers():
    """A fork copies the server's state, its random generator's too (torch imports random);
    random reseeds itself in a forked child, so each run draws its own numbers, as a new process."""
    code = "import random; print(random.random())"
    runs = [warm_python.run([sys.executable, "-c", code], capture_output=True, text=True).stdout for _ in range(3)]
    assert len(set(runs)) == 3, runs


def test_a_start_up_setting_gets_a_server_of_its_own():
    """OMP_NUM_THREADS is read when torch is imported: a run that sets it another way is started
    from a server that imported torch with it, as a fresh interpreter would have."""
    code = "import torch; print(torch.get_num_threads())"
    for threads in ("1", "2"):
        env = {**os.environ, "OMP_NUM_THREADS": threads}
        warm = warm_python.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert warm.stdout.strip() == threads, warm.stderr


def test_a_timeout_kills_the_run_and_popen_polls_and_waits():
    with pytest.raises(subprocess.TimeoutExpired):
        warm_python.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.5)
    process = warm_python.WarmPopen([sys.executable, "-c", "import sys; sys.stdin.read(); sys.exit(5)"],
                                    stdin=subprocess.PIPE)
    assert process.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=0.2)
    process.stdin.close()
    assert process.wait(timeout=60) == 5 and process.poll() == 5


def test_interpreter_options_are_refused():
    with pytest.raises(ValueError, match="interpreter options"):
        warm_python.run([sys.executable, "-u", "-c", "pass"])
