"""Figures the end-to-end tests measure on the way (timings, block sizes), printed at the end of the session by
``conftest.pytest_terminal_summary``. Not a test module (``e2e_figures``)."""

from __future__ import annotations

from collections import defaultdict

#: version → figure name → values, in the order recorded.
FIGURES: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))


def record(version: str, name: str, value: float) -> None:
    """Remember one measured ``value`` of figure ``name`` for SillyTavern ``version``."""
    FIGURES[version][name].append(float(value))


def summary_lines() -> list[str]:
    """One line per version and figure: count, median, min and max (values as measured, no unit conversion)."""
    lines = []
    for version in sorted(FIGURES):
        for name, values in FIGURES[version].items():
            ordered = sorted(values)
            median = ordered[len(ordered) // 2]
            lines.append(f"e2e figure SillyTavern {version} {name}: n={len(values)} median={median:.1f} "
                         f"min={ordered[0]:.1f} max={ordered[-1]:.1f} values={[round(v, 1) for v in values]}")
    return lines
