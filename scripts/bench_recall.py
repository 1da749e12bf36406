"""Recall benchmark at 1k, 10k and 100k nodes (issue 8); see :mod:`memory_recall.bench`.

Usage: python scripts/bench_recall.py [--sizes 1000,10000,100000] [--repeat 5] [--out bench.json] [--profile PREFIX]
       [--store-dir DIR]  (keep the generated stores in DIR and reuse them next time)
"""

from __future__ import annotations

import sys

from memory_recall.bench import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
