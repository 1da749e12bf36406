"""Ingest and embed one very long message (the local embedder), after a short chat: the cost of one long turn.

Usage::

    python scripts/bench_long_message.py [--chars 200000]

Prints, per language (English, Chinese), the ingest time and the embedding time of the message's nodes. The
local embedder cuts every text to the model's window (``LOCAL_WINDOW_TOKENS``), so the embedding time does not
grow with the message.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from memory_recall.blas import pin_single_thread
from memory_recall.ingest.messages import ingest_messages
from memory_recall.model.chat import ChatMessage
from memory_recall.providers import embed_missing
from memory_recall.providers.embedding import LocalEmbedder
from memory_recall.store import Store

TEXTS = {
    "en": "The lighthouse keeper Marcus said hello to Erin at the harbor. ",
    "zh": "灯塔看守人马库斯在港口向艾琳问好。",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chars", type=int, default=200_000, help="length of the long message (characters)")
    args = parser.parse_args()
    pin_single_thread()
    embedder = LocalEmbedder()
    embedder.embed_query("warm up")  # the model loads once, outside the timings
    base = [
        ChatMessage(floor=i, role="user" if i % 2 == 0 else "assistant", speaker="Ann" if i % 2 == 0 else "Bo",
                    text=f"Message {i} about the harbor.")
        for i in range(4)
    ]
    with tempfile.TemporaryDirectory() as tmp, Store.open(tmp) as store:
        for lang, unit in TEXTS.items():
            chat = f"long-{lang}"
            ingest_messages(store, chat, base, now_ms=1)
            embed_missing(store, chat, embedder)
            text = (unit * (args.chars // len(unit) + 1))[: args.chars]
            message = ChatMessage(floor=4, role="user", speaker="Ann", text=text)
            start = time.perf_counter()
            ingest_messages(store, chat, [message], now_ms=2)
            ingested = time.perf_counter()
            report = embed_missing(store, chat, embedder)
            done = time.perf_counter()
            print(f"{lang}: {len(text):,} characters: ingest {1000 * (ingested - start):.0f} ms, embed "
                  f"{report.embedded} node(s) {1000 * (done - ingested):.0f} ms, total {done - start:.2f} s")


if __name__ == "__main__":
    main()
