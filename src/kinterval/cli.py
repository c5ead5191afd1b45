"""The ``kinterval`` command line.

Each layer that offers commands has a ``commands.py`` with ``register(subparsers)``; this file only lists
them, so that dependencies keep pointing one way (cli imports everything, nothing imports cli).
"""

from __future__ import annotations

import argparse
import importlib
import linecache
import os
import re
import sys
import warnings
from pathlib import Path

from kinterval import __version__, atomic

# One line per layer; each module defines ``register(subparsers) -> None``.
COMMAND_MODULES = (
    "kinterval.ops.commands",
    "kinterval.data.commands",
    "kinterval.train.commands",
    "kinterval.eval.commands",
    "kinterval.eval.downstream_commands",
    "kinterval.eval.lm_eval_commands",
    "kinterval.integrations.hf_export",
    "kinterval.suite.commands",
    "kinterval.report.commands",
    "kinterval.demo",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kinterval",
        description="K-interval quantized attention: operators, pretraining and measurement.",
    )
    parser.add_argument("--version", action="version", version=f"kinterval {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def is_input_error(err: BaseException) -> bool:
    """Whether ``err`` reports bad input (one line, exit 2) rather than a bug (traceback kept).

    The rule: a ``FileNotFoundError`` names a path the user gave, and so does a ``FileExistsError``,
    ``NotADirectoryError`` or ``IsADirectoryError`` that carries a file name (an output folder such as
    ``--out`` that is a file, a file such as a run's ``metrics.jsonl`` that is a folder); a
    ``ValueError`` (``CheckpointError``
    included) is bad input only when one of kinterval's own input checks raised it, i.e. the innermost frame
    of its traceback is a ``raise`` statement in a kinterval module. A ``ValueError`` raised inside torch,
    numpy or any other library, or by a builtin called on the wrong internal value, is a bug, and so is any
    other exception type (``TypeError``, ``KeyError``, ``IndexError``, ...).
    """
    if isinstance(err, FileNotFoundError):
        return True
    if isinstance(err, (FileExistsError, NotADirectoryError, IsADirectoryError)):
        return err.filename is not None
    if not isinstance(err, ValueError) or err.__traceback__ is None:
        return False
    tb = err.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    module = tb.tb_frame.f_globals.get("__name__", "")
    if module != "kinterval" and not module.startswith("kinterval."):
        return False
    return linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno).lstrip().startswith("raise")


def input_error_message(err: BaseException, flags: dict[str, str] | None = None) -> str:
    """The one-line text of an input error. A library check names its Python parameter (``batch_size must
    be ...``): where the command has a flag for it (``flags``: parameter -> option), the flag is named."""
    if isinstance(err, FileExistsError):
        return f"{err.filename} exists and is not a folder (an output folder is needed there)"
    if isinstance(err, NotADirectoryError):
        return f"{err.filename}: a part of this path is a file, not a folder"
    if isinstance(err, IsADirectoryError):
        return f"{err.filename} is a folder (a file is needed there)"
    if isinstance(err, FileNotFoundError) and err.errno is not None and err.filename:
        # the system's own "[Errno 2] No such file or directory: 'X'" (kinterval's own say what is missing)
        return (
            f"{err.filename}: no such file or folder (a path to read that is missing, or a folder to write "
            "that cannot be made there)"
        )
    text = " ".join(str(err).split("\n"))
    name = re.match(r"(\w+) must ", text)
    if name and name[1] in (flags or {}):
        text = flags[name[1]] + text[len(name[1]) :]
    return text


# Arguments that name a file or folder: an empty value (`--out ""`, an unset shell variable) would be read as
# the current folder, where a command wrote its outputs, trained or looked for a dataset.
PATH_ARGUMENTS = {
    "out", "run", "data", "dir", "dirs", "runs", "json", "config", "bpe_file", "include_path", "against_data",
    "clean_blocks", "skip_gated", "src", "dst", "baseline", "conditions", "reference", "downstream",
    "nll_from",
}  # fmt: skip
# Every other text argument given as "" would mostly fall back to its default without a word (`--range-grad
# ""` ran `full`); these take "" as a value of its own (`--prompt ""`: the end-of-text token).
EMPTY_ALLOWED = {"prompt"}


def chosen_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)command that ``args`` ran."""
    while sub := next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None):
        parser = sub.choices[getattr(args, sub.dest)]
    return parser


def empty_argument(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """The error for the first text argument of the chosen (sub)command given as "" (blank), or None."""
    parser = chosen_parser(parser, args)
    for action in parser._actions:
        if action.dest in EMPTY_ALLOWED or action.type not in (None, str):
            continue
        value = getattr(args, action.dest, None)
        if any(isinstance(v, str) and not v.strip() for v in (value if isinstance(value, list) else [value])):
            name = "/".join(action.option_strings) or action.dest
            if action.dest in PATH_ARGUMENTS:
                return f"argument {name}: an empty path; give a file or folder"
            return f"argument {name}: an empty value"
    return None


PACKAGE = Path(__file__).resolve().parent


def warning_lines(command: str):
    """A ``warnings.showwarning`` that prints kinterval's own warnings (a UserWarning attributed to a file of
    this package) as one ``kinterval COMMAND: warning: ...`` line, as errors are; others as Python does."""
    default = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, UserWarning) and Path(filename).resolve().is_relative_to(PACKAGE):
            print(f"kinterval {command}: warning: {message}", file=sys.stderr if file is None else file)
        else:
            default(message, category, filename, lineno, file, line)

    return show


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C while the command modules load (a command's own: in _run)
        print("kinterval: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    if (sys.argv[1:] if argv is None else argv) == ["--version"]:  # without loading every command's module
        print(f"kinterval {__version__}")
        return 0
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if getattr(args, "pass_through", False):  # a wrapped CLI (kinterval lm-eval) parses its own arguments
        args.lm_eval_args = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if empty := empty_argument(parser, args):  # "" would name the current folder, or the default
        print(f"kinterval {args.command}: error: {empty}", file=sys.stderr)
        return 2
    with warnings.catch_warnings():
        warnings.showwarning = warning_lines(args.command)
        warnings.filterwarnings("always", category=UserWarning, module=r"kinterval(\.|$)")  # each one
        flags = {  # the flags given: a check of a config file's field (seed) does not name --seed
            a.dest: a.option_strings[-1]
            for a in chosen_parser(parser, args)._actions
            if a.option_strings and getattr(args, a.dest, a.default) != a.default
        }
        return _run(args, flags)


def _run(args, flags: dict[str, str] | None = None) -> int:
    try:
        result = args.func(args)
    except BrokenPipeError:  # `kinterval ... | head`: the reader left; stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 141  # 128 + SIGPIPE
    except KeyboardInterrupt:  # Ctrl-C: files are written atomically, so this is a kill, not a traceback
        print(f"kinterval {args.command}: interrupted", file=sys.stderr)
        return 130  # 128 + SIGINT
    except (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError) as err:
        if not is_input_error(err):
            raise  # an internal bug: keep its traceback
        print(f"kinterval {args.command}: error: {input_error_message(err, flags)}", file=sys.stderr)
        return 2
    except OSError as err:
        if err.errno not in SYSTEM_ERRNOS:
            raise
        print(f"kinterval {args.command}: error: {system_error_message(err)}", file=sys.stderr)
        return 1
    except (RuntimeError, MemoryError) as err:
        if not is_out_of_memory(err):
            raise
        print(f"kinterval {args.command}: error: {out_of_memory_message(err, args.command)}", file=sys.stderr)
        return 1
    return int(result or 0)


def is_out_of_memory(err: BaseException) -> bool:
    """An allocation the machine refused: ``torch.OutOfMemoryError`` (CUDA), the CPU allocator's RuntimeError,
    a CUDA "out of memory" error, or Python's and numpy's ``MemoryError``."""
    text = str(err)
    return isinstance(err, MemoryError) or (
        isinstance(err, RuntimeError)
        and (
            type(err).__name__ == "OutOfMemoryError"
            or "can't allocate memory" in text
            or "CUDA error: out of memory" in text
        )
    )


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} bytes" if unit == "bytes" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError


def out_of_memory_message(err: BaseException, command: str = "") -> str:
    """One line for an allocation failure: the size that could not be allocated, where, and what to do."""
    text = str(err)
    gpu = "CUDA" in text or type(err).__name__ == "OutOfMemoryError"
    size = re.search(r"[Tt]ried to allocate (\d+) bytes", text)
    tried = _size(int(size[1])) if size else None
    said = re.search(r"(?:[Tt]ried to|Unable to) allocate ([\d.]+ [KMGTPE]?i?B)", text)
    if tried is None and said:
        tried = said[1].replace(". ", " ")  # numpy's "256. TiB"
    advice = (
        "lower --micro-batch and raise --accum by the same factor (the same tokens per step; a resumed run "
        "keeps its block size), or give --block-size a smaller value in a new run; the checkpoints written "
        "so far are kept and --resume continues from the newest"
        if command == "train"
        else "this command needs more memory than is free on the device"
    )
    where = "the GPU" if gpu else "the CPU"
    return f"out of memory on {where}" + (f" (tried to allocate {tried})" if tried else "") + f": {advice}"


# A file system that refuses a read or write: not a bug (no traceback) and not bad input (exit 1, not 2)
SYSTEM_ERRNOS = atomic.SYSTEM_ERRNOS
system_error_message = atomic.system_error_message


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
