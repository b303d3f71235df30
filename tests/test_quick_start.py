"""The README's offline quick start, as a new user runs it: from a fresh copy of the checkout
(the files git tracks), with nothing exported (no TIKTOKEN_CACHE_DIR, no HF_* variables), the two
commands of the "No hub?" block succeed, twice in a row, and write the pair and the trace page, and the README's
Python example then runs on that pair as it is written. On a trained pair (the shared fixture's),
the example prints text: not mostly whitespace, not a loop (spec_decoding/presentation/loops.py).

The only change to the commands: the training is cut to 1 step per model on one file (appended
options win in argparse), so that the test takes seconds instead of the default run's 10 minutes."""

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

QUICK = {"offline.train_pair": ["--steps", "1", "--text", "offline/train_pair.py"],
         "spec_decoding_generate.py": ["--max-gen", "5"]}


def readme_offline_commands() -> list[list[str]]:
    """The commands of the README's code block that follows "No hub?"."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"No hub\?.*?```bash\n(.*?)```", readme, flags=re.S).group(1)
    return [shlex.split(line) for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def readme_python_example() -> str:
    """The README's Python code block (the API example)."""
    return re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S).group(1)


@pytest.mark.slow
def test_readme_offline_quick_start_runs_from_a_fresh_copy_with_nothing_exported(tmp_path):
    clone = tmp_path / "clone"
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, clone / name)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TIKTOKEN", "HF_", "DATA_GYM")) and k not in ("PYTHONPATH", "GPT2_TARGET", "GPT2_DRAFT")}
    env["TRAIN_PAIR_PROGRESS"] = "0"
    commands = readme_offline_commands()
    assert [c[:3] for c in commands] == [["python", "-m", "offline.train_pair"],
                                        ["python", "spec_decoding_generate.py", "--target"]]
    for attempt in ("first", "second"):  # verbatim, twice in a row: the second run finds the first's output
        for command in commands:
            key = command[2] if command[1] == "-m" else command[1]
            proc = subprocess.run([sys.executable, *command[1:], *QUICK[key]], cwd=clone, env=env,
                                  capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, f"{attempt} run: {shlex.join(command)}\n{proc.stderr[-3000:]}"
    assert (clone / "runs" / "trained_pair" / "target" / "model.safetensors").is_file()
    assert (clone / "runs" / "trace.html").is_file()
    example = readme_python_example()
    assert len(example.strip().splitlines()) <= 6, "the README's example is a few lines"
    proc = subprocess.run([sys.executable, "-c", example], cwd=clone, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"{example}\n{proc.stderr[-3000:]}"
    text, tokens_per_call = proc.stdout.rsplit(" ", 1)
    assert text.strip() and float(tokens_per_call) >= 1


def test_readme_python_example_prints_text_on_a_trained_pair(trained_pair_dirs, tmp_path):
    """The README's example, verbatim, run where runs/trained_pair is a trained pair (the suite's
    60-step one): its text is not mostly whitespace, nor a loop. Shown to fail with the example's
    former settings (greedy, temperature=0), which printed a newline and a run of spaces."""
    from gpt2 import encode
    from spec_decoding.presentation.loops import loop_share, looped

    pair = tmp_path / "runs" / "trained_pair"
    pair.mkdir(parents=True)
    for name, folder in zip(("target", "draft"), trained_pair_dirs):
        (pair / name).symlink_to(folder, target_is_directory=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    example = readme_python_example()
    proc = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"{example}\n{proc.stderr[-3000:]}"
    text, tokens_per_call = proc.stdout.rstrip("\n").rsplit(" ", 1)
    assert float(tokens_per_call) >= 1 and len(text) >= 40, proc.stdout
    whitespace = sum(c.isspace() for c in text) / len(text)
    assert whitespace < 0.5, f"mostly whitespace ({whitespace:.0%}): {text!r}"
    assert not looped(encode(text)), f"a loop ({loop_share(encode(text)):.0%} repeats): {text!r}"
    assert "kernels:" not in proc.stderr  # loading is quiet: the kernel choice is logged, not printed
