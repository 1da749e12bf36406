"""Injector: turns a recall result into the bucketed prompt block (reference §4, recall-spec departures 2, 5).

Usage::

    from injector import render
    text = render(result, settings.injector).text
"""

from __future__ import annotations

from .render import Injection, InjectionBlock, InjectionSummaryEntry, OmittedEntry, render, render_parts
from .tables import InjectionTable

__all__ = [
    "Injection",
    "InjectionBlock",
    "InjectionSummaryEntry",
    "InjectionTable",
    "OmittedEntry",
    "render",
    "render_parts",
]
