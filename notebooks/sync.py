"""Write each notebook's .ipynb from its source, the jupytext percent-format .py beside it.

    python notebooks/sync.py           # after editing a notebooks/NN_*.py
    python notebooks/sync.py --check   # exit 1 if an .ipynb is out of date (the tests check this)

Edit the .py files (plain Python: `# %%` starts a code cell, `# %% [markdown]` a text cell). The
.ipynb files are written without outputs and with fixed cell ids, so regenerating gives a clean
diff. In Jupyter with jupytext installed, the pair also stays in sync when you save either one.
"""

import sys
from pathlib import Path

import jupytext
import nbformat

HERE = Path(__file__).resolve().parent
KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}


def notebook_sources() -> list[Path]:
    """The notebooks' .py sources: NN_name.py (not this script nor notebook_setup.py)."""
    return sorted(p for p in HERE.glob("[0-9][0-9]_*.py"))


def to_ipynb(source: Path) -> str:
    """The .ipynb text for one .py source: no outputs, fixed cell ids, fixed metadata."""
    nb = jupytext.read(source, fmt="py:percent")
    nb.metadata = {"jupytext": {"formats": "ipynb,py:percent"}, "kernelspec": KERNELSPEC,
                   "language_info": {"name": "python"}}
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i:02d}"
        cell.metadata = {}
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    nb.nbformat, nb.nbformat_minor = 4, 5
    nbformat.validate(nb)
    return nbformat.writes(nb) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for source in notebook_sources():
        target = source.with_suffix(".ipynb")
        text = to_ipynb(source)
        if target.is_file() and target.read_text() == text:
            continue
        if check:
            stale.append(target.name)
        else:
            target.write_text(text)
            print("wrote", target)
    if stale:
        print("out of date (run python notebooks/sync.py):", ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
