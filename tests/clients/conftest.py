"""The client tests run the real service with the service tests' in-thread server (``service_live``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))
