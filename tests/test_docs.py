"""The docs as a user reads them: every ``kinterval`` command in a code block of README.md or docs/ parses
with the CLI's own parser, every command named in the prose exists with its flags, and the Python code
blocks run as written (shortened only where a test must be short; each shortening names the exact text it
replaces, so a changed snippet fails here instead of going unrun)."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from kinterval.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def code_blocks(text: str, lang: str | None = None) -> list[str]:
    """The fenced code blocks of a markdown text (only those tagged ``lang`` if given)."""
    return [
        body for tag, body in re.findall(r"```([^\n]*)\n(.*?)```", text, re.S) if lang in (None, tag.strip())
    ]


def documented_commands(text: str) -> list[str]:
    """Every ``kinterval ...`` command of a page's code blocks, continuation lines joined, with what a shell
    puts around it stripped: a ``$ `` prompt, ``VAR=value`` prefixes, ``python -m`` / ``torchrun ... -m``,
    the other commands of a ``&&``/``;``/``|`` chain and a trailing ``# comment``."""
    commands = []
    for block in code_blocks(text):
        for line in re.sub(r"\s*\\\n\s*", " ", block).splitlines():
            line = line.strip().removeprefix("$ ")
            for part in re.split(r"&&|;|\|\|?", line):
                part = re.sub(r"^(\w+=\S+\s+)+", "", part.strip())
                part = re.sub(r"^(python3? -m |torchrun .*?-m )kinterval\b", "kinterval", part)
                if part.startswith("kinterval "):
                    commands.append(re.split(r"\s+#", part)[0].strip())
    return commands


def parse_error(command: str) -> str | None:
    """argparse's complaint about a documented command line, or None when it parses."""
    argv = shlex.split(command)[1:]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser = build_parser()
            args, rest = parser.parse_known_args(argv)
            if rest and not getattr(args, "pass_through", False):  # as kinterval.cli.main does
                parser.error(f"unrecognized arguments: {' '.join(rest)}")
    except SystemExit as exit_:
        if exit_.code:
            return (err.getvalue().strip().splitlines() or [f"exit {exit_.code}"])[-1]
    return None


def test_the_command_extractor_finds_every_form_and_catches_drift():
    page = """
```bash
kinterval data prepare --source synthetic --out data/s   # a comment
OMP_NUM_THREADS=1 kinterval train --data data/s \\
    --model tiny --out runs/a
torchrun --nproc-per-node 2 -m kinterval train --config 124m-100m --data D --out R
cd x && python -m kinterval report SUITE | tail
$ kinterval train --data D --out R --no-such-flag 3
kinterval no-such-command
```
"""
    commands = documented_commands(page)
    assert commands == [
        "kinterval data prepare --source synthetic --out data/s",
        "kinterval train --data data/s --model tiny --out runs/a",
        "kinterval train --config 124m-100m --data D --out R",
        "kinterval report SUITE",
        "kinterval train --data D --out R --no-such-flag 3",
        "kinterval no-such-command",
    ]
    errors = [parse_error(c) for c in commands]
    assert errors[:4] == [None] * 4
    assert "--no-such-flag" in errors[4] and "no-such-command" in errors[5]


def test_every_documented_command_parses():
    """A renamed or removed flag, or a subcommand the docs still show, fails here (55+ commands)."""
    found, bad = 0, []
    for page in PAGES:
        for command in documented_commands(page.read_text(encoding="utf-8")):
            found += 1
            if (error := parse_error(command)) is not None:
                bad.append(f"{page.relative_to(ROOT)}: {command}\n    {error}")
    assert found >= 50, f"only {found} documented commands found: the extractor no longer sees the docs"
    assert not bad, "\n".join(bad)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})


def inline_command_error(span: str) -> str | None:
    """What is wrong with a command named in the prose (`` `kinterval probes --run RUN [--out DIR]` ``): a
    subcommand that does not exist, or a ``--flag`` its subcommand does not have. Prose spans are often
    fragments (a flag without its value, ``list|show|run`` alternatives, ``[optional]`` parts), so they are
    not parsed whole; placeholders such as ``<command>`` or ``...`` end the subcommand path."""
    tokens = span.replace("[", " ").replace("]", " ").split()[1:]
    path, parsers = ["kinterval"], [build_parser()]
    while tokens and not tokens[0].startswith("-") and (choices := _subcommands(parsers[0])):
        names = tokens[0].split("|")
        if not all(name in choices for name in names):
            if unknown := [n for n in names if n not in choices and re.fullmatch(r"[a-z][a-z-]*", n)]:
                return f"{' '.join(path)} has no subcommand {unknown[0]!r}"
            return None
        parsers = [choices[name] for name in names]
        path.append(tokens.pop(0))
    for flag in (t.split("=")[0] for t in tokens if t.startswith("--")):
        if any(flag not in p._option_string_actions for p in parsers):
            return f"{flag} is not an option of {' '.join(path)}"
    return None


def test_inline_commands_check_subcommands_and_flags():
    assert inline_command_error("kinterval probes --run RUN [--operator NAME] [--out DIR]") is None
    assert inline_command_error("kinterval suite list|show|run|gate") is None
    assert inline_command_error("kinterval <command>: error: ...") is None
    assert inline_command_error("kinterval --version") is None
    assert "--outdir" in inline_command_error("kinterval probes --run RUN [--outdir DIR]")
    assert "'lst'" in inline_command_error("kinterval suite lst|show")
    assert "'evaluate'" in inline_command_error("kinterval evaluate --data")


def test_every_command_named_in_the_prose_exists():
    found, bad = 0, []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for block in code_blocks(text):
            text = text.replace(block, "")
        for span in re.findall(r"`(kinterval [^`]+)`", text):
            found += 1
            if (error := inline_command_error(span)) is not None:
                bad.append(f"{page.relative_to(ROOT)}: `{span}`: {error}")
    assert found >= 40, f"only {found} commands found in the prose"
    assert not bad, "\n".join(bad)


def snippet(page: str, index: int, replace: dict[str, str] | None = None) -> str:
    """The ``index``-th Python block of ``page``, each key of ``replace`` (which must occur) replaced."""
    code = code_blocks((ROOT / page).read_text(encoding="utf-8"), "python")[index]
    for old, new in (replace or {}).items():
        assert old in code, f"{page} python block {index} no longer contains {old!r}: update this test"
        code = code.replace(old, new)
    return code


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """A fresh working folder holding the small synthetic corpus at the paths the docs use."""
    import torch

    from kinterval.data.prepare import prepare

    prepare("synthetic", tmp_path / "data" / "synthetic", tokens=60_000, seed=0, progress=False)
    (tmp_path / "data" / "syn").symlink_to("synthetic")
    monkeypatch.chdir(tmp_path)
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tmp_path
    torch.set_num_threads(old)


def test_readme_operator_snippet_runs():
    namespace: dict = {}
    exec(snippet("README.md", 0), namespace)
    P, out = namespace["P"], namespace["out"]
    assert P.shape == (2, 8, 8) and out.shape == (2, 4, 8, 16)
    assert bool((P.sum(-1) - 1).abs().max() < 1e-5) and bool(P.triu(1).eq(0).all())  # rows of P, causal


def test_data_snippet_runs(in_tmp):
    namespace: dict = {}
    exec(snippet("docs/data.md", 0), namespace)
    x, y = namespace["x"], namespace["y"]
    assert x.shape == y.shape == (8, 1024) and bool((x[:, 1:] == y[:, :-1]).all())


def test_trainer_snippet_runs(in_tmp):
    """docs/training.md's hand-driven loop, on 4 steps instead of tiny-cpu's 293."""
    namespace: dict = {}
    short = '{"data.dir": "data/synthetic", "schedule.tokens": 8192, "schedule.warmup_tokens": 2048}'
    exec(snippet("docs/training.md", 0, {'{"data.dir": "data/synthetic"}': short}), namespace)
    result = namespace["result"]
    assert (result.status, result.steps, result.tokens) == ("completed", 4, 8192)
    assert result.last_checkpoint is not None and result.last_checkpoint.is_dir()


def test_huggingface_snippets_run(in_tmp, capsys):
    """docs/huggingface.md: the training example (3 steps of its 100), then the name swap of the first block
    on its model config, then the reload of the third block from the folder the example saved."""
    pytest.importorskip("transformers")
    namespace: dict = {}
    exec(snippet("docs/huggingface.md", 1, {"range(100)": "range(3)"}), namespace)
    first = re.search(r"step   0  loss (\d+\.\d+)", capsys.readouterr().out)
    documented = re.search(r"`step 0 loss (\d+\.\d+)`", (ROOT / "docs" / "huggingface.md").read_text())
    assert first and documented
    # step 0 is the loss of the random init: it does not depend on the thread count; the init scheme is
    # transformers', so only its first decimals are held to the documented value
    assert abs(float(first.group(1)) - float(documented.group(1))) < 0.05
    exec(snippet("docs/huggingface.md", 0), namespace)
    assert namespace["model"].config._attn_implementation == "kinterval-softmax"
    exec(snippet("docs/huggingface.md", 2, {'"hf-run"': '"llama-fwm-prob-k4"'}), namespace)
    assert namespace["model"].config._attn_implementation == "kinterval"


def test_the_llama_pretraining_example_is_the_20_line_example_the_readme_promises():
    """README.md points to "the 20-line Llama pretraining example" (issue: a 20-line example that pretrains a
    Llama-style model with fwm-prob-k4); formatted one argument a line it had grown to 31 lines of code."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert re.search(r"20-line\s+Llama\s+pretraining\s+example", readme)
    code = snippet("docs/huggingface.md", 1)
    assert "LlamaConfig" in code and "fwm-prob-k4" in code and "for step in range(" in code
    lines = [line for line in code.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert len(lines) <= 21, f"{len(lines)} lines of code"


def test_readme_lists_every_command():
    """README.md's "Command line" paragraph is where a user looks first: a new subcommand belongs there."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Command line", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`kinterval ([a-z][a-z0-9-]*)", section))
    assert set(_subcommands(build_parser())) <= named, "README.md's command list misses a subcommand"
    # the actions too (`kinterval data prepare|overlap`): `data overlap` was left out of the list
    actions = {}
    for command, rest in re.findall(r"`kinterval ([a-z][a-z0-9-]*) \[?([a-z|-]+)", section):
        actions.setdefault(command, set()).update(rest.split("|"))
    for command, sub in _subcommands(build_parser()).items():
        missing = set(_subcommands(sub)) - actions.get(command, set())
        assert not missing, f"README.md's command list misses kinterval {command} {'|'.join(sorted(missing))}"


def table_cells(row: str) -> int:
    """The cells of a markdown table row: the `|` outside code spans and not escaped, less the two edges."""
    n, code, i = 0, False, 0
    while i < len(row):
        if row[i] == "\\":
            i += 2
            continue
        code ^= row[i] == "`"
        n += row[i] == "|" and not code
        i += 1
    return n - 1


def test_table_rows_have_the_header_s_cells():
    """A row with a cell more than its header renders without it: a sitting's column once went into the
    rows of another table of the same page."""
    assert table_cells("| a | `x|y` | b \\| c |") == 3
    bad = []
    for page in PAGES:
        header = None
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if not line.startswith("|"):
                header = None
            elif header is None:
                header = table_cells(line)
            elif table_cells(line) != header:
                bad.append(f"{page.relative_to(ROOT)}:{n}: {table_cells(line)} cells, its header {header}")
    assert not bad, "\n".join(bad)
