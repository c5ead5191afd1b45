"""``kinterval lm-eval ARGS...``: lm-evaluation-harness's own command line with the ``kinterval`` model.

lm-eval has no plugin discovery, so ``lm_eval --model kinterval`` cannot find the adapter; this command
imports it (which registers the model) and hands ARGS to lm-eval's CLI entry point
(``lm_eval.__main__.cli_evaluate``, its ``run`` subcommand), with ``--model kinterval`` and, when not given,
``--device`` set to ``cuda`` if available else ``cpu`` (lm-eval's own default is ``cuda:0``).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

# Task YAMLs that kinterval ships for the paper's battery (App. C.3, layer 3): sciq_nosupport
TASKS_DIR = Path(__file__).with_name("lm_eval_tasks")


def missing_lm_eval(command: str, err: ImportError) -> ValueError:
    """The one-line error of a command that needs lm-eval where it is missing (or fails to import)."""
    return ValueError(f"kinterval {command} needs lm-eval: pip install 'kinterval[eval]' ({err})")


def _lm_eval(args: argparse.Namespace) -> int:
    try:
        from lm_eval.__main__ import cli_evaluate

        import kinterval.eval.lm_eval_adapter  # noqa: F401  (registers the lm-eval model "kinterval")
    except ImportError as err:
        raise missing_lm_eval("lm-eval", err) from None
    import torch

    rest = list(args.lm_eval_args)
    if any(a == "--model" or a.startswith(("--model=", "-M")) for a in rest):
        raise ValueError("kinterval lm-eval sets --model kinterval itself; use lm_eval for other models")
    named = {a.split("=", 1)[0] for a in rest}
    if not named & {"--tasks", "-t", "--config", "-C", "--help", "-h"}:  # lm-eval raised its own traceback
        raise ValueError("kinterval lm-eval needs --tasks TASK [TASK ...] (or --config FILE); see --help")
    if not any(a == "--device" or a.startswith("--device=") for a in rest):
        rest += ["--device", "cuda" if torch.cuda.is_available() else "cpu"]
    if not any(a == "--include_path" or a.startswith("--include_path=") for a in rest):
        rest += ["--include_path", str(TASKS_DIR)]  # lm-eval takes one folder: a user's replaces this one
    run = ["run"] if importlib.util.find_spec("lm_eval._cli") else []  # lm-eval < 0.4.10 has no subcommands
    argv, sys.argv = sys.argv, ["lm-eval", *run, "--model", "kinterval", *rest]
    try:
        cli_evaluate()
    except SystemExit as exit_:  # lm-eval's argparse (e.g. --help, a bad option), or its sys.exit()
        return _exit_status(exit_.code)
    except ValueError as err:  # lm-eval's own checks of its options (unknown task, no task, bad config)
        if not _raised_in(err, "lm_eval.config."):
            raise
        raise ValueError(f"lm-eval: {err}") from None
    except ConnectionError as err:  # a task's dataset on the Hub, without network
        raise ValueError(hub_error(err, "--include_path")) from None
    finally:
        sys.argv = argv
    return 0


def _exit_status(code) -> int:
    """The exit status of ``SystemExit(code)``, as Python gives it: None is 0 (success), an integer itself,
    anything else (a message) is printed to stderr and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def hub_error(err: ConnectionError, include_flag: str) -> str:
    """The one-line message for a task dataset that could not be downloaded (``datasets`` raises
    ``ConnectionError`` when the Hub cannot be reached or ``HF_HUB_OFFLINE`` is set)."""
    return (
        f"lm-eval could not download a task's dataset from the Hugging Face Hub: {err}. Check the network "
        f"(or HF_HUB_OFFLINE), or use local tasks: task YAMLs in a folder given with {include_flag} DIR"
    )


def _raised_in(err: BaseException, prefix: str) -> bool:
    """Whether the innermost frame of ``err``'s traceback is in a module whose name starts with ``prefix``."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_globals.get("__name__", "").startswith(prefix)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "lm-eval",
        help="lm-evaluation-harness's CLI with the kinterval model (--model_args run=RUN,...)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,  # --help goes to lm-eval's run command
    )
    p.set_defaults(func=_lm_eval, lm_eval_args=[], pass_through=True)
