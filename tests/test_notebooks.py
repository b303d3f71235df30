"""The notebooks run end to end, offline, on a small trained pair (offline.train_pair, seconds).

Each notebook's source is the jupytext percent-format notebooks/NN_name.py; the .ipynb beside it is
generated from it by notebooks/sync.py and must be in sync. Each notebook is executed in a fresh "python3" Jupyter kernel (this interpreter) with nbclient, with
GPT2_TARGET / GPT2_DRAFT pointing at a small agreeing pair made here; any failing cell (including
the notebooks' own asserts) fails the test. The committed notebooks must carry no outputs.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("jupytext")


ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS_DIR = ROOT / "notebooks"
sys.path.insert(0, str(NOTEBOOKS_DIR))
import sync  # noqa: E402  (notebooks/sync.py: .py source -> .ipynb)

SOURCES = sync.notebook_sources()
NOTEBOOKS = [source.with_suffix(".ipynb").name for source in SOURCES]
CELL_TIMEOUT = 120  # seconds per cell
KERNEL = "python3"

@pytest.fixture(scope="session")
def notebook_pair(trained_pair_dirs):
    """The notebooks' offline default is a pair made by offline.train_pair; this one is trained for
    seconds (tests/conftest.py), enough for real rejections and residuals."""
    return trained_pair_dirs


@pytest.fixture(scope="session")
def python3_kernel(tmp_path_factory):
    """Make sure a "python3" kernel spec exists. jupyter_client provides one whenever ipykernel is
    importable (and runs it with this interpreter); if not, install one into a temporary prefix."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec(KERNEL)
    except NoSuchKernel:
        prefix = tmp_path_factory.mktemp("jupyter-prefix")
        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--prefix", str(prefix),
                        "--name", KERNEL], check=True, capture_output=True)
        data_dir = str(prefix / "share" / "jupyter")
        os.environ["JUPYTER_PATH"] = os.pathsep.join(
            p for p in (data_dir, os.environ.get("JUPYTER_PATH")) if p)
        KernelSpecManager().get_kernel_spec(KERNEL)  # raises if that did not work either
    return KERNEL


@pytest.fixture
def notebook_env(monkeypatch, notebook_pair, python3_kernel, tmp_path):
    """The kernel inherits this process's environment when it starts."""
    target_dir, draft_dir = notebook_pair
    monkeypatch.setenv("GPT2_TARGET", str(target_dir))
    monkeypatch.setenv("GPT2_DRAFT", str(draft_dir))
    monkeypatch.setenv("DEVICE", "cpu")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # Notebook 4 measures inline unless told where benchmark results are: point it at a missing
    # file so the run does not depend on whether a benchmark has been run in this checkout.
    monkeypatch.setenv("BENCHMARK_RESULTS", str(tmp_path / "no-such-results.json"))
    monkeypatch.setenv("BATCH_RESULTS", str(tmp_path / "no-such-batch-results.json"))  # notebook 9, likewise
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    return monkeypatch


def execute(name: str) -> tuple[nbformat.NotebookNode, float]:
    nb = nbformat.read(NOTEBOOKS_DIR / name, as_version=4)
    # shutdown_kernel="immediate": the kernel is killed once the last cell ran (a graceful shutdown
    # waits about a second for an interpreter with torch loaded to tear itself down)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name=KERNEL, shutdown_kernel="immediate",
                                     resources={"metadata": {"path": str(NOTEBOOKS_DIR)}})
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError (with the traceback) if any cell fails
    return nb, time.perf_counter() - start


def outputs(nb):
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]


def text_of(nb) -> str:
    parts = []
    for out in outputs(nb):
        if out.output_type == "stream":
            parts.append(out.text)
        elif "data" in out and "text/plain" in out.data:
            parts.append(out.data["text/plain"])
    return "\n".join(parts)


def count_images(nb) -> int:
    return sum("image/png" in out.get("data", {}) for out in outputs(nb))


def test_every_notebook_has_its_source():
    assert len(NOTEBOOKS) >= 4
    assert sorted(p.name for p in NOTEBOOKS_DIR.glob("*.ipynb")) == NOTEBOOKS, (
        "each notebooks/NN_name.ipynb needs its source notebooks/NN_name.py (and vice versa)")


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_ipynb_in_sync_with_its_source(source):
    committed = source.with_suffix(".ipynb").read_text()
    assert committed == sync.to_ipynb(source), (
        f"{source.with_suffix('.ipynb').name} differs from {source.name}: run python notebooks/sync.py")


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_without_outputs(name):
    nb = nbformat.read(NOTEBOOKS_DIR / name, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == KERNEL
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{name}: cell {i} has outputs; clear them before committing"
            assert cell.execution_count is None, f"{name}: cell {i} has an execution count"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, notebook_env):
    nb, seconds = execute(name)
    print(f"{name}: {seconds:.1f} s")
    errors = [out for out in outputs(nb) if out.output_type == "error"]
    assert not errors, errors
    assert count_images(nb) >= 1, f"{name} drew no figure"
    text = text_of(nb)
    if name.startswith("04"):
        assert "Measuring a small result inline" in text
        assert count_images(nb) >= 3  # theory, measured, acceptance by position
    if name.startswith("03"):
        assert "rounds ended in a rejection" in text
        assert any("text/html" in out.get("data", {}) and "srcdoc" in out.data["text/html"]
                   for out in outputs(nb)), "notebook 3 should show the trace page inline"
    if name.startswith("02"):
        assert "all checks passed" in text
        # the cost curve, or (on a machine too busy to measure it) the sentence saying so
        assert count_images(nb) >= 2 or "This machine is too noisy to show the curve" in text
    if name.startswith("09"):
        assert "every row is identical to the target's own greedy output" in text
        assert "Measuring a small result inline" in text and "crossover: measured" in text
        assert count_images(nb) >= 2  # costs by rows, speed-up by batch size


def test_speedup_notebook_reads_benchmark_results(notebook_env, tmp_path):
    """With a results.json, notebook 4 plots its cells instead of measuring."""
    results = {
        "cells": [
            {"gamma": g, "max_gen": 64, "temperature": t, "speedup_median": s, "acceptance_rate": a,
             "predicted_speedup": ps}
            for g, t, s, a, ps in [(1, 0.0, 1.3, 0.8, 1.5), (2, 0.0, 1.6, 0.78, 1.9),
                                   (4, 0.0, 1.8, 0.75, 2.1), (4, 1.0, 1.4, 0.6, 1.6)]
        ],
        "costs": {"c": 0.18, "verify_cost_by_gamma": {"1": 1.05, "2": 1.1, "4": 1.2}},
    }
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    notebook_env.setenv("BENCHMARK_RESULTS", str(path))
    nb, _ = execute("04_speedup_theory.ipynb")
    text = text_of(nb)
    assert f"Read 4 cells from {path}" in text
    assert "Measuring a small result inline" not in text
    assert count_images(nb) >= 2


def test_relative_model_paths_are_read_from_the_repository_root(monkeypatch, tmp_path):
    """GPT2_TARGET=runs/standins/target means the folder under the repository root (where the
    README's commands make it), not under notebooks/ where Jupyter runs; a path that is found
    nowhere fails with a message saying where it was looked for."""
    import importlib
    monkeypatch.setenv("GPT2_TARGET", "runs/no-such-target")
    monkeypatch.setenv("GPT2_DRAFT", "gpt2")
    monkeypatch.syspath_prepend(str(NOTEBOOKS_DIR))
    import notebook_setup
    setup = importlib.reload(notebook_setup)
    monkeypatch.setattr(setup, "ROOT", tmp_path)
    (tmp_path / "runs" / "standins" / "target").mkdir(parents=True)
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")
    assert setup.from_root("runs/standins/target") == str(tmp_path / "runs" / "standins" / "target")
    assert setup.from_root("gpt2") == "gpt2" and setup.from_root("/abs/model") == "/abs/model"
    from gpt2 import CheckpointError
    with pytest.raises(CheckpointError, match="a relative path is read from the repository root"):
        setup.load_pair()
