"""Loads the scripts as modules, so the fast tests run exactly the code of the long runs (not a test module;
imported by ``test_crash.py`` and ``test_load.py``, for which pytest puts tests/reliability on sys.path, and by
``tests/test_bench.py`` as ``reliability.rel_crash_helpers``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as module ``rel_script_<name>`` (registered in ``sys.modules`` for dataclasses)."""
    mod_name = f"rel_script_{name}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    spec.loader.exec_module(module)
    return module
