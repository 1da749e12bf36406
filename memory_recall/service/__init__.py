"""The HTTP service for chat hosts (FastAPI on uvicorn): the recall hook, chat events, records and the graph.

Usage::

    from memory_recall.service import create_app, serve
    serve("127.0.0.1", 8765, data_dir=None, token=None, settings=load_settings())

Needs the ``service`` extra (``fastapi``, ``uvicorn``). Route table and status codes:
:mod:`memory_recall.service.app`.
"""

from memory_recall.service.app import API_VERSION, create_app, serve
from memory_recall.service.auth import check_bind, is_loopback

__all__ = ["API_VERSION", "check_bind", "create_app", "is_loopback", "serve"]
