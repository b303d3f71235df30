"""Errors a learner meets first, offline: each names the way forward, and comes quickly: before any
weights load, and (with no hub) without trying the network. The cases run in a folder holding a
tiny pair at runs/trained_pair (target/ and draft/, as offline.train_pair writes); the no-hub case
in a fresh interpreter, as a user would, the others through the scripts' main(). Nothing here times
the error (a busy machine makes any time limit flaky): what makes it quick, that no model loads and
no connection is tried, is what is checked."""

import os
import subprocess
import sys

import pytest

from conftest import ROOT
from gpt2.loading import STANDINS_COMMAND, TRAIN_PAIR_COMMAND

# The script run as `python script ...`, but with every socket connection refused and reported
# on stderr: an offline error must not wait on the network.
NO_NETWORK = """
import runpy, socket, sys
def refuse(*args):
    print(f"NETWORK ATTEMPTED: {args[1] if len(args) > 1 else args}", file=sys.stderr)
    raise OSError("the test forbids network connections")
socket.socket.connect = socket.socket.connect_ex = refuse
socket.getaddrinfo = lambda *args, **kwargs: refuse(None, args)
sys.argv = sys.argv[1:]
sys.path.insert(0, sys.argv[0].rpartition("/")[0])
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, make_checkpoint):
    """A folder with runs/trained_pair/{target,draft}: tiny models of GPT-2's vocabulary with a
    context window of 128 tokens (conftest.TINY_TEXT)."""
    from conftest import TINY_TEXT
    folder = tmp_path_factory.mktemp("learner")
    pair = folder / "runs" / "trained_pair"
    pair.mkdir(parents=True)
    for name in ("target", "draft"):
        os.symlink(make_checkpoint(TINY_TEXT), pair / name)
    return folder


def run_cli(args, cwd, script="spec_decoding_generate.py"):
    """(returncode, stderr): the script run with nothing exported but HF_HUB_OFFLINE=1 and an empty
    hub cache (as on a fresh offline machine), every network connection refused (NO_NETWORK)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIKTOKEN", "HF_"))}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cwd / "empty_hub_cache"))
    proc = subprocess.run([sys.executable, "-c", NO_NETWORK, str(ROOT / script), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)  # a hang guard, not a time limit
    return proc.returncode, proc.stderr


def assert_quick_error(code, err):
    """One clear error, no traceback, no connection tried."""
    assert code == 2 and err.count("error:") == 1 and "Traceback" not in err, err
    assert "NETWORK ATTEMPTED" not in err, err


def test_no_hub_error_gives_the_offline_commands(tmp_path):
    """The defaults (gpt2-large, gpt2) with no hub, in a folder with no trained pair yet: the
    message names both offline commands, as command lines to paste, and no connection was tried."""
    code, err = run_cli(["--max-gen", "3"], tmp_path)
    assert_quick_error(code, err)
    assert "HF_HUB_OFFLINE is set" in err
    assert f"\n      {TRAIN_PAIR_COMMAND}\n" in err and f"\n      {STANDINS_COMMAND}\n" in err
    assert "--target runs/trained_pair/target --draft runs/trained_pair/draft" in err



def test_forgotten_draft_offers_the_trained_pair_already_here(workdir, capsys, monkeypatch):
    """--target runs/trained_pair/target without --draft: the draft defaults to gpt2, which the
    hub cannot give; runs/trained_pair/draft is right there, so the message offers it (not
    training another pair)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(workdir / "empty_hub_cache"))
    code, err = run_main(["--target", "runs/trained_pair/target", "--max-gen", "3"], workdir, capsys, monkeypatch)
    assert_quick_error(code, err)
    assert "--draft gpt2" in err
    assert "use the small pair already trained here (runs/trained_pair): pass both" in err
    assert "--target runs/trained_pair/target --draft runs/trained_pair/draft" in err
    assert TRAIN_PAIR_COMMAND not in err


def test_help_names_the_offline_path(capsys):
    import benchmark
    import spec_decoding_generate
    for parse_args in (spec_decoding_generate.parse_args, benchmark.parse_args):
        with pytest.raises(SystemExit):
            parse_args(["--help"])
        assert TRAIN_PAIR_COMMAND in " ".join(capsys.readouterr().out.split())  # argparse wraps lines


def run_main(args, cwd, capsys, monkeypatch, script="spec_decoding_generate"):
    """(returncode, stderr) of the script's main() run in this process from cwd: the messages are
    the same as on the command line, without a fresh interpreter's start-up."""
    import importlib
    module = importlib.import_module(script)
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    try:
        code = module.main(args)
    except SystemExit as e:  # benchmark.py exits with the message
        code, message = 2, str(e.code)
        print(message, file=sys.stderr)
    return code, capsys.readouterr().err


def test_mistyped_path_says_missing_and_offers_the_closest(workdir, capsys, monkeypatch):
    """--draft runs/trained_pair/draf: the folder does not exist; runs/trained_pair/draft does. It is
    reported before the target loads (no "Loading target" line)."""
    code, err = run_main(["--target", "runs/trained_pair/target", "--draft",
                                   "runs/trained_pair/draf"], workdir, capsys, monkeypatch)
    assert_quick_error(code, err)
    assert ("error: --draft runs/trained_pair/draf: No such file or folder: runs/trained_pair/draf "
            "(did you mean runs/trained_pair/draft?)") in err
    assert "Loading" not in err
    # a typo higher up the path: each part is matched
    code, err = run_main(["--target", "runs/trainedpair/target"], workdir, capsys, monkeypatch)
    assert_quick_error(code, err)
    assert "(did you mean runs/trained_pair/target?)" in err


def test_folder_of_a_pair_suggests_its_subfolders(workdir, capsys, monkeypatch):
    """--target runs/trained_pair (the parent, an easy mistake): recognised as a pair, no hub advice."""
    code, err = run_main(["--target", "runs/trained_pair", "--draft", "runs/trained_pair/draft"],
                                  workdir, capsys, monkeypatch)
    assert_quick_error(code, err)
    assert "it holds a pair (target/ and draft/), not one model" in err
    assert "--target runs/trained_pair/target --draft runs/trained_pair/draft" in err
    assert "hub" not in err


def test_too_long_prompt_fails_before_any_weights_load(workdir, capsys, monkeypatch):
    """The context window is read from config.json: a prompt of 200 tokens for a 128-token window
    fails before the models load, and the message does not echo the prompt."""
    prompt = " ".join(["hello"] * 200)  # 200 tokens
    code, err = run_main(["--target", "runs/trained_pair/target", "--draft",
                                   "runs/trained_pair/draft", "--prompt", prompt], workdir, capsys, monkeypatch)
    assert_quick_error(code, err)
    assert ("error: --prompt has 200 tokens, but the target's context window "
            "(runs/trained_pair/target: n_positions=128) holds 128.") in err
    assert "Loading" not in err and "hello hello" not in err


def test_benchmark_checks_paths_and_prompts_before_loading(workdir, capsys, monkeypatch):
    """benchmark.py: the same path check, and a prompts file too long for the window, both before
    any model loads."""
    code, err = run_main(["--target", "runs/trained_pair/target", "--draft", "runs/trained_pair/draf",
                                   "--out", "runs/bench"], workdir, capsys, monkeypatch, script="benchmark")
    assert_quick_error(code, err)
    assert "No such file or folder: runs/trained_pair/draf (did you mean runs/trained_pair/draft?)" in err
    (workdir / "long.txt").write_text(" ".join(["hello"] * 200) + "\n")
    code, err = run_main(["--target", "runs/trained_pair/target", "--draft", "runs/trained_pair/draft",
                                   "--prompts", "long.txt", "--out", "runs/bench"], workdir, capsys, monkeypatch,
                                  script="benchmark")
    assert_quick_error(code, err)
    assert "a prompt has 200 tokens; the models' context window holds 128" in err
    assert "Loading" not in err and not (workdir / "runs" / "bench").exists()
