"""Write the LoCoMo development split the dataset tests and the evaluation docs use, from the public release.

Usage::

    python scripts/locomo_dev_split.py path/to/locomo10.json ../shared/datasets/locomo/locomo_dev.json

``locomo10.json`` is the public LoCoMo release (snap-research/locomo on GitHub, ``data/locomo10.json``; a
non-commercial research licence: use it for evaluation only). The development split is 5 of its 10
conversations, :data:`DEV_SAMPLE_IDS` in that order (2,760 dialog turns, 999 questions), written as compact JSON
(``json.dumps`` defaults, UTF-8 text kept as is). The tests find it at ``../shared/datasets/locomo/locomo_dev.json``
beside the repository, or wherever ``LOCOMO_DEV_PATH`` points.

Exit status 2 with a one-line error when the input is not a LoCoMo file or lacks one of the conversations.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

DEV_SAMPLE_IDS: tuple[str, ...] = ("conv-26", "conv-30", "conv-41", "conv-42", "conv-43")


def dev_split(conversations: Any) -> list[dict[str, Any]]:
    """The :data:`DEV_SAMPLE_IDS` conversations of a LoCoMo release, in that order; ``ValueError`` naming what is
    missing."""
    if not isinstance(conversations, list) or not all(isinstance(c, dict) for c in conversations):
        raise ValueError("not a LoCoMo file: expected a JSON array of conversations")
    by_id = {c.get("sample_id"): c for c in conversations}
    missing = [sample for sample in DEV_SAMPLE_IDS if sample not in by_id]
    if missing:
        raise ValueError(f"conversation(s) {', '.join(missing)} not in the file")
    return [by_id[sample] for sample in DEV_SAMPLE_IDS]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("release", type=Path, help="locomo10.json")
    parser.add_argument("out", type=Path, help="where to write locomo_dev.json")
    args = parser.parse_args(argv)
    try:
        split = dev_split(json.loads(args.release.read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        print(f"error: {args.release}: {exc}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(split, ensure_ascii=False), encoding="utf-8")
    turns = sum(
        len(turns) for c in split for key, turns in c["conversation"].items()
        if key.startswith("session_") and isinstance(turns, list)
    )
    print(f"{args.out}: {len(split)} conversations, {turns} dialog turns, {sum(len(c['qa']) for c in split)} questions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
