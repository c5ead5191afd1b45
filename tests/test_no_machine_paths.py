"""The product stands alone: no source file, doc, suite file or benchmark names a folder of one machine."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# /work, /home/<user>, the shared folder beside a developer's clone, and data sources given as absolute paths
MACHINE_PATH = re.compile(r"(?<![\w.])/work\b|/home/\w|\.\./shared\b|\bshared/(corpora|tokenizers|paper)\b|"
                          r"\b(bin|text):/|(?<![\w.])/tmp/\w")  # fmt: skip
TEXT = {".py", ".md", ".toml", ".txt", ".rst", ".sh", ".tex", ".json", ".cfg", ".yaml", ".yml"}


def product_files() -> list[Path]:
    files = [ROOT / "README.md", *(p for d in ("src", "docs") for p in (ROOT / d).rglob("*"))]
    files += [*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "benchmarks").glob("*.sh")]
    # docs/results/<suite>/ holds a suite's recorded results and report, which name the folders the suite ran
    # in (a record, not an instruction); docs/results/README.md (how each folder was made) is checked
    return sorted(
        p
        for p in files
        if p.is_file()
        and p.suffix in TEXT
        and "__pycache__" not in p.parts
        # pip's build record (src/*.egg-info) is no product file: the scan is the same installed or not
        and not any(part.endswith(".egg-info") for part in p.parts)
        and (ROOT / "docs" / "results") not in p.parents[1:]
    )


def test_the_scan_sees_the_suites_and_docs():
    names = {p.relative_to(ROOT).as_posix() for p in product_files()}
    assert "src/kinterval/suite/suites/mini.toml" in names and "docs/measurement.md" in names
    assert not [n for n in names if ".egg-info/" in n]  # pip's build record of an installed checkout
    assert MACHINE_PATH.search("--source bin:/data/docs") and MACHINE_PATH.search("see ../shared/x")
    assert not MACHINE_PATH.search("--source bin:data/docs  runs/mini  data/tmp/x")


@pytest.mark.parametrize("path", product_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_machine_path(path):
    hits = [
        f"{i}: {line.strip()[:120]}"
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if MACHINE_PATH.search(line)
    ]
    assert not hits, f"{path.relative_to(ROOT)} names a machine's folder:\n" + "\n".join(hits)
