"""kinterval.report: tables (Markdown + LaTeX) and figures regenerated from suite result files only."""

__all__ = ["build_report", "demo_report"]


def __getattr__(name: str):
    """``build_report`` and ``demo_report``, imported at first use: the report's modules load scipy and
    matplotlib (a second or more), which commands that import a ``report`` submodule need not."""
    if name in __all__:
        from kinterval.report import build

        return getattr(build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
