"""Dependencies point one way: ops ← model ← train/eval ← suite/report ← cli (docs: README's layer table).

Every ``import`` of a ``kinterval`` package in ``src/`` (at module level or inside a function) is read with
``ast`` and held to the layer order below: a package imports only packages of a lower layer. ``ops``, ``data``
and ``stats`` are the foundations and import no other kinterval package; ``eval`` may use ``train`` (it loads
runs) and ``report`` may use ``suite`` (it reads suite folders), never the other way round. The top-level
``kinterval`` package (its ``__version__`` and the re-exported operator API) may be imported from anywhere.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "kinterval"

LAYER = {
    "atomic": -1,  # file writes that a kill cannot tear: no kinterval imports, usable by every layer
    "arglists": -1,  # command-line number lists: no kinterval imports, for every layer's commands
    "environment": -1,  # the machine a run or evaluation ran on: no kinterval imports, for every layer
    "graph_break": -1,  # torch.compiler.disable applied at the first call: no kinterval imports
    "ops": 0,
    "data": 0,
    "stats": 0,
    "model": 1,
    "train": 2,
    "eval": 3,
    "integrations": 3,
    "suite": 4,
    "report": 5,
    "demo": 6,
    "cli": 7,
    "__main__": 8,
}


def imported_packages(path: Path) -> set[str]:
    """The kinterval packages (``ops``, ``train``, ...) a source file imports, relative imports resolved."""
    package = path.relative_to(SRC.parent).with_suffix("").parts[:-1]  # ("kinterval", "train", ...)
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            # ``from kinterval import eval`` imports the package named after the dot
            names = [f"{module}.{a.name}" if module == "kinterval" else module for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "kinterval" and len(parts) > 1 and parts[1] in LAYER:
                found.add(parts[1])
    return found


def layer_violations() -> list[str]:
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        own = rel.parts[0].removesuffix(".py")
        if own == "__init__":
            continue  # the top-level package: the public API, and load_run imported on first use
        assert own in LAYER, f"{rel}: a new kinterval package; give it its place in LAYER"
        for dep in imported_packages(path) - {own}:
            if LAYER[dep] >= LAYER[own]:
                bad.append(f"{rel} imports kinterval.{dep} (layer {LAYER[dep]} >= {own}'s {LAYER[own]})")
    return bad


def test_dependencies_point_one_way():
    assert layer_violations() == []


def test_the_layer_check_sees_every_form_of_import(tmp_path, monkeypatch):
    """A planted upward import is found in each form: module level, in a function, relative, from-package."""
    root = tmp_path / "kinterval"
    for pkg, code in {
        "ops": "import kinterval.model\n",
        "data": "def f():\n    from kinterval.train.loop import train\n",
        "model": "from ..eval import nll\n",
        "train": "from kinterval import report\n",
        "stats": "from . import bootstrap\nimport kinterval\n",  # own package and the top level: allowed
    }.items():
        (root / pkg).mkdir(parents=True)
        (root / pkg / "x.py").write_text(code)
    monkeypatch.setattr(sys.modules[__name__], "SRC", root)
    assert sorted(layer_violations()) == [
        "data/x.py imports kinterval.train (layer 2 >= data's 0)",
        "model/x.py imports kinterval.eval (layer 3 >= model's 1)",
        "ops/x.py imports kinterval.model (layer 1 >= ops's 0)",
        "train/x.py imports kinterval.report (layer 5 >= train's 2)",
    ]
