"""kinterval.report: tables (Markdown + LaTeX) and figures regenerated from suite result files only."""

from kinterval.report.build import build_report, demo_report

__all__ = ["build_report", "demo_report"]
