"""``report.md`` and ``recall_at_k.png`` of an evaluation, rendered from ``metrics.json`` data.

:func:`render_report` writes Markdown tables: overall recall@k per system, recall excluding category 5,
recall_all@k, nDCG@10, MRR and latency (with and without the query embedding), recall per category, and an
ablation table (each ``no-<stage>`` system against ``memory-recall``: the drop is what the stage contributes).
:func:`plot_recall` draws recall against k, one line per system (matplotlib, Agg backend).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["CATEGORY_NAMES", "plot_recall", "render_report"]

#: LoCoMo categories (dataset README).
CATEGORY_NAMES = {"1": "multi-hop", "2": "temporal", "3": "open-domain", "4": "single-hop", "5": "adversarial"}
FULL = "memory-recall"


def _f(value: float) -> str:
    return f"{value:.3f}"


def render_report(metrics: Mapping[str, Any], details: Mapping[str, Any] | None = None) -> str:
    """The Markdown report of one run."""
    details = details or {}
    ks = [str(k) for k in metrics["k"]]
    systems: Mapping[str, Any] = metrics["systems"]
    no_embed = details.get("latency_ms_without_query_embedding", {})
    out = [f"# Recall evaluation: {metrics['dataset']}", ""]
    out.append(f"{metrics['questions']} questions, unit `{metrics['unit']}`.")
    if details:
        out.append(
            f"Context: {details.get('context', '?')}; questions without evidence (left out of the averages): "
            f"{details.get('questions_without_evidence', 0)}; embedder `{details.get('embedder')}`; "
            f"settings overrides `{details.get('settings_overrides')}`."
        )
    out += ["", "## Overall", ""]
    head = ["system", *[f"R@{k}" for k in ks], *[f"R@{k} excl. cat 5" for k in ks], *[f"R_all@{k}" for k in ks],
            "nDCG@10", "MRR", "p50 ms", "p95 ms", "p50 ms w/o q-emb", "p95 ms w/o q-emb"]
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in systems.items():
        lat = s["latency_ms"]
        lat2 = no_embed.get(name, {"p50": float("nan"), "p95": float("nan")})
        row = [name, *[_f(s["recall"][k]) for k in ks], *[_f(s["recall_excluding_adversarial"][k]) for k in ks],
               *[_f(s["recall_all"][k]) for k in ks], _f(s["ndcg@10"]), _f(s["mrr"]),
               f"{lat['p50']:.1f}", f"{lat['p95']:.1f}", f"{lat2['p50']:.1f}", f"{lat2['p95']:.1f}"]
        out.append("| " + " | ".join(row) + " |")
    cats = sorted({c for s in systems.values() for c in s["recall_by_category"]}, key=int)
    if cats:
        out += ["", "## Recall by category", ""]
        head = ["system", *[f"{c} {CATEGORY_NAMES.get(c, '')} R@{k}".replace("  ", " ") for c in cats for k in ks]]
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for name, s in systems.items():
            by = s["recall_by_category"]
            out.append("| " + " | ".join([name, *[_f(by[c][k]) if c in by else "—" for c in cats for k in ks]])
                       + " |")
    ablations = [name for name in systems if name.startswith("no-")]
    if ablations and FULL in systems:
        full = systems[FULL]
        out += ["", "## Ablations (difference to memory-recall; negative = the stage helps)", ""]
        head = ["system", *[f"ΔR@{k}" for k in ks], "ΔnDCG@10", "ΔMRR"]
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for name in ablations:
            s = systems[name]
            row = [name, *[f"{s['recall'][k] - full['recall'][k]:+.3f}" for k in ks],
                   f"{s['ndcg@10'] - full['ndcg@10']:+.3f}", f"{s['mrr'] - full['mrr']:+.3f}"]
            out.append("| " + " | ".join(row) + " |")
    return "\n".join(out) + "\n"


def plot_recall(metrics: Mapping[str, Any], path: str | Path) -> None:
    """Recall against k, one line per system, saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = list(metrics["k"])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        for name, s in metrics["systems"].items():
            ax.plot(ks, [s["recall"][str(k)] for k in ks], marker="o", label=name,
                    linewidth=2.5 if name == FULL else 1.2)
        ax.set_xlabel("k (turns)")
        ax.set_ylabel("evidence Recall@k")
        ax.set_title(f"{metrics['dataset']}: {metrics['questions']} questions")
        ax.set_ylim(0, 1)
        ax.set_xticks(ks)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
