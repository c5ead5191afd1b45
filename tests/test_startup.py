"""Start-up cost: every ``kinterval`` command, every suite run (``suite run-one``) and every rank of a
distributed run is a new Python process. Importing the CLI, the operators, the model and the statistics must
not load what only some commands use: torch._dynamo (``torch.compiler.disable`` at import: a second or more),
scipy.stats and matplotlib (half a second each). ``kinterval --help`` took 3x as long as ``import torch``."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch._dynamo", "scipy.stats", "matplotlib", "pandas", "transformers", "datasets", "lm_eval")


def test_the_command_line_and_the_core_modules_load_without_the_heavy_libraries():
    code = (
        "import sys\n"
        "from kinterval.cli import build_parser\n"
        "build_parser()  # every command module's register()\n"
        "import kinterval.ops, kinterval.model, kinterval.stats, kinterval.report, kinterval.train.config\n"
        "from kinterval.suite.definition import load_suite\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_report_package_still_offers_its_functions():
    """``kinterval.report`` loads ``build`` at the first use of its names (PEP 562)."""
    import kinterval.report as report
    from kinterval.report.build import build_report, demo_report

    assert report.build_report is build_report and report.demo_report is demo_report
    assert sorted(report.__all__) == ["build_report", "demo_report"]
    try:
        report.not_a_name  # noqa: B018
    except AttributeError as err:
        assert "not_a_name" in str(err)
    else:
        raise AssertionError("an unknown name must be an AttributeError")
