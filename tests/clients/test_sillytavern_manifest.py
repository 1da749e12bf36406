"""The extension's two manifests (its folder, for a copy; the repository root, for *Install extension* from a
repository URL) describe one extension."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_root_manifest_is_the_folder_manifest_with_the_path_to_it() -> None:
    folder = json.loads((ROOT / "clients" / "sillytavern" / "manifest.json").read_text(encoding="utf-8"))
    root = json.loads((ROOT / "manifest.json").read_text(encoding="utf-8"))
    assert folder["js"] == "index.js" and root["js"] == "clients/sillytavern/index.js"
    assert (ROOT / root["js"]).is_file()
    assert {k: v for k, v in root.items() if k != "js"} == {k: v for k, v in folder.items() if k != "js"}
    # The recall runs in the generation interceptor: the name the extension registers.
    extension = (ROOT / "clients" / "sillytavern" / "lib" / "extension.js").read_text(encoding="utf-8")
    assert f"export const INTERCEPTOR = '{folder['generate_interceptor']}';" in extension
