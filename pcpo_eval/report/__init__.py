"""The study report: one self-contained HTML file (:mod:`pcpo_eval.report.html`) and the
``study`` / ``report`` / ``demo`` commands (:mod:`pcpo_eval.report.commands`)."""

from __future__ import annotations

from pcpo_eval.report.html import render_report, write_report

__all__ = ["render_report", "write_report"]
