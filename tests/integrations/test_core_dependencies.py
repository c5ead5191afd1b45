"""The core install works without the optional extras: no rich, transformers, lm-eval or datasets."""

import subprocess
import sys

BLOCK = "import sys\nfor m in ('rich', 'transformers', 'lm_eval', 'datasets'):\n    sys.modules[m] = None\n"


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + code], capture_output=True, text=True, timeout=120)


def test_cli_and_ops_table_without_extras():
    res = run(
        "from kinterval import cli\nsys.exit(cli.main(['ops', '--T', '8', '--operators', 'softmax,lerp-k4']))"
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[1].split() == ["operator", "TV", "to", "softmax", "(mean)", "TV", "max", "zero-sum",
                                "residual", "(median)", "residual", "max"]  # fmt: skip
    assert lines[3].startswith("softmax ") and lines[4].startswith("lerp-k4 ") and len(lines) == 5


def test_export_and_lm_eval_commands_name_their_extra():
    res = run("from kinterval import cli\nsys.exit(cli.main(['lm-eval', '--tasks', 'x']))")
    assert (
        res.returncode == 2
        and "pip install 'kinterval[eval]'" in res.stderr
        and "Traceback" not in res.stderr
    )
    res = run("from kinterval import cli\nsys.exit(cli.main(['export-hf', '--run', 'r', '--out', 'o']))")
    assert (
        res.returncode == 2 and "pip install 'kinterval[hf]'" in res.stderr and "Traceback" not in res.stderr
    )
