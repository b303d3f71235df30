"""`pip install .` and `pip install -e .` work, and from any folder the installed package imports
and its console scripts run (into a fresh virtualenv, on a copy of the checkout)."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow


def make_venv(folder: Path) -> Path:
    """A fresh virtualenv that sees this environment's packages (torch etc.) through a .pth file,
    so the install needs no downloads. Returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    python = folder / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    here = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(site, "outer_env.pth").write_text("\n".join(sorted(here)) + "\n")
    return python


def run(cmd, cwd, timeout=300):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def pip_install(python, *args, cwd):
    # pip of this environment, installing into the venv (--python); the build backend
    # (setuptools) comes from this environment too: nothing is downloaded.
    return run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps",
                "--no-build-isolation", "--no-input", "-q", *args], cwd=cwd)


def test_install_and_editable_install_work_from_outside_the_checkout(tmp_path):
    source = tmp_path / "project"  # a copy: building writes build/ and *.egg-info beside the code
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", "runs", "checkpoints", "__pycache__", ".pytest_cache", "build", "*.egg-info"))
    elsewhere = tmp_path / "assignment"
    elsewhere.mkdir()
    python = make_venv(tmp_path / "venv")

    proc = pip_install(python, str(source), cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr[-3000:]
    where = run([python, "-c", "import gpt2, spec_decoding, spec_decoding_generate as s; "
                 "print(gpt2.__file__); print(spec_decoding.__file__); print(s.__file__)"], cwd=elsewhere)
    assert where.returncode == 0, where.stderr[-3000:]
    site = str(tmp_path / "venv")
    assert all(line.startswith(site) for line in where.stdout.split()), where.stdout  # not the copy
    # the C kernel's source travels with the package (it is compiled where it runs)
    kernel = run([python, "-c", "from gpt2.speed import native; print(native.SOURCE.is_file(), native.SOURCE)"], cwd=elsewhere)
    assert kernel.stdout.startswith(f"True {site}"), kernel.stdout + kernel.stderr[-2000:]

    # the console scripts: make a tiny stand-in pair, then run the main job on it
    bin_dir = tmp_path / "venv" / "bin"
    proc = run([bin_dir / "gpt2-standins", "--size", "tiny", "--draft-layers", "2", "--out", "pair"],
               cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run([bin_dir / "spec-decode", "--target", "pair/target", "--draft", "pair/draft",
                "--max-gen", "5", "--json"], cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert len(report["tokens"]) == 5 and report["settings"]["dtype"] == "float32"

    proc = pip_install(python, "-e", str(source), cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr[-3000:]
    where = run([python, "-c", "import gpt2, spec_decoding; print(gpt2.__file__); print(spec_decoding.__file__)"],
                cwd=elsewhere)
    assert where.returncode == 0, where.stderr[-3000:]
    assert all(line.startswith(str(source)) for line in where.stdout.split()), where.stdout  # the code itself
