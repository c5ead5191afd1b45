"""The README's table of versions states the lower bounds of pyproject.toml: the two must not drift apart
(each bound is the oldest release the whole suite was run with)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def declared_floors() -> dict[str, str]:
    """Package -> lower bound, over the dependencies and every extra (the strictest where several)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"]) + [
        r for extra in project["optional-dependencies"].values() for r in extra
    ]
    floors: dict[str, str] = {}
    for req in reqs:
        m = re.match(r"([A-Za-z0-9_.-]+)\s*(?:\[[^\]]*\])?\s*[^;]*?>=\s*([0-9.]+)", req)
        if m:
            name, floor = m.group(1).lower(), m.group(2)
            old = floors.get(name)
            if old is None or tuple(map(int, floor.split("."))) > tuple(map(int, old.split("."))):
                floors[name] = floor
    floors["python"] = re.match(r">=\s*([0-9.]+)", project["requires-python"]).group(1)
    return floors


def readme_oldest() -> dict[str, str]:
    text = (ROOT / "README.md").read_text()
    table = text.split("### Versions", 1)[1].split("\n\n")[2]
    rows = [line.split("|")[1:3] for line in table.splitlines()[2:]]
    return {name.strip().lower(): oldest.split()[0] for name, oldest in rows}  # "0.4.4 (a note)" -> "0.4.4"


def test_the_readme_states_every_lower_bound_of_pyproject():
    floors, stated = declared_floors(), readme_oldest()
    floors.pop("pytest"), floors.pop("pytest-timeout"), floors.pop("pytest-xdist")  # test tools
    floors.pop("hypothesis"), floors.pop("ruff"), floors.pop("submitit"), floors.pop("tomli")
    assert stated == floors
