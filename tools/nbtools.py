"""Small helper for writing round notebooks from Python (cells as strings), used when authoring.

    from tools.nbtools import write_notebook, md, code, params
    write_notebook("notebooks/01_layout_verifier.ipynb", [md("# ..."), params("mode = 'auto'"), code("...")])

The committed .ipynb files are the source of truth; this only keeps them output-free and tagged.
"""
from __future__ import annotations

import nbformat


def md(s: str):
    return nbformat.v4.new_markdown_cell(s.strip("\n"))


def code(s: str):
    return nbformat.v4.new_code_cell(s.strip("\n"))


def params(s: str):
    c = nbformat.v4.new_code_cell(s.strip("\n"))
    c.metadata["tags"] = ["parameters"]
    return c


def write_notebook(path: str, cells) -> None:
    nb = nbformat.v4.new_notebook(cells=list(cells))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for i, c in enumerate(nb.cells):
        c["id"] = f"c{i:02d}"
    nbformat.validate(nb)
    nbformat.write(nb, path)
