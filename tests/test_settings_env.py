"""Environment variables of the settings: an unknown ``MEMORY_RECALL_*`` variable is refused with its name, and
a bad value from the environment names the variable (and the setting), not only the setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from memory_recall.errors import ConfigError
from memory_recall.settings import load_settings


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.upper().startswith("MEMORY_RECALL_"):
            monkeypatch.delenv(name)


def _error(monkeypatch: pytest.MonkeyPatch, name: str, value: str, toml: Path | None = None) -> str:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as err:
        load_settings(toml)
    return str(err.value)


class TestUnknownVariables:
    @pytest.mark.parametrize(("name", "message"), [
        ("MEMORY_RECALL_DIFUSION__DECAY",
         "MEMORY_RECALL_DIFUSION__DECAY: unknown setting; did you mean MEMORY_RECALL_DIFFUSION__DECAY?"),
        ("MEMORY_RECALL_DIFFUSION_DECAY",
         "MEMORY_RECALL_DIFFUSION_DECAY: unknown setting; did you mean MEMORY_RECALL_DIFFUSION__DECAY?"),
        ("MEMORY_RECALL_DATADIR", "MEMORY_RECALL_DATADIR: unknown setting; did you mean MEMORY_RECALL_DATA_DIR?"),
        ("MEMORY_RECALL_DIFFUSION__NOPE", "MEMORY_RECALL_DIFFUSION__NOPE: unknown setting (no such settings section "
         "or key)"),
        ("memory_recall_bogus", "memory_recall_bogus: unknown setting (no such settings section or key)"),
    ])
    def test_refused_with_its_name(self, monkeypatch: pytest.MonkeyPatch, name: str, message: str) -> None:
        assert _error(monkeypatch, name, "0.5") == message

    @pytest.mark.parametrize(("name", "value"), [
        ("MEMORY_RECALL_DATA_DIR", "/tmp/x"), ("MEMORY_RECALL_CONFIG", ""), ("MEMORY_RECALL_PROFILE", "transcript"),
        ("MEMORY_RECALL_EMBEDDING_API_KEY", "k"), ("MEMORY_RECALL_LLM_API_KEY", "k"),
        ("MEMORY_RECALL_E2E", "require"), ("MEMORY_RECALL_E2E_CACHE", "/tmp"), ("MEMORY_RECALL_TEST_ANYTHING", "1"),
        ("MEMORY_RECALL_URL", "http://127.0.0.1:1"), ("MEMORY_RECALL_FUZZ_EXAMPLES", "5000"),
        ("MEMORY_RECALL_DIFFUSION__DECAY", "0.5"), ("MEMORY_RECALL_INJECTOR__HEADINGS__CORE", "[Core]"),
        ("MEMORY_RECALL_SELECTION", '{"top_k": 5}'),
    ])
    def test_known_names_load(self, monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
        monkeypatch.setenv(name, value)
        load_settings()

    def test_the_api_key_variable_the_settings_name(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("MEMORY_RECALL_EMBEDDING__API_KEY_ENV", "MEMORY_RECALL_MY_KEY")
        monkeypatch.setenv("MEMORY_RECALL_MY_KEY", "secret")
        assert load_settings().embedding.api_key_env == "MEMORY_RECALL_MY_KEY"
        monkeypatch.delenv("MEMORY_RECALL_EMBEDDING__API_KEY_ENV")
        with pytest.raises(ConfigError, match="^MEMORY_RECALL_MY_KEY: unknown setting"):
            load_settings()


class TestValuesNameTheVariable:
    @pytest.mark.parametrize(("name", "value", "message"), [
        ("MEMORY_RECALL_DIFFUSION__DECAY", "5",
         "MEMORY_RECALL_DIFFUSION__DECAY: Input should be less than or equal to 1 (setting diffusion.decay; got '5')"),
        ("MEMORY_RECALL_DIFFUSION__DECAY", "abc", "MEMORY_RECALL_DIFFUSION__DECAY: Input should be a valid number, "
         "unable to parse string as a number (setting diffusion.decay; got 'abc')"),
        ("MEMORY_RECALL_DIFFUSION", '{"decay": 5}',
         "MEMORY_RECALL_DIFFUSION: Input should be less than or equal to 1 (setting diffusion.decay; got 5)"),
        ("MEMORY_RECALL_DIFFUSION", '{"nope": 1}', "MEMORY_RECALL_DIFFUSION: unknown setting (setting diffusion.nope; "
         "got 1)"),
        ("MEMORY_RECALL_DIFFUSION", "bad", """MEMORY_RECALL_DIFFUSION: must be JSON (an object, e.g. '{"key": 1}'); \
got 'bad'"""),
        ("MEMORY_RECALL_SERVICE__CORS_ORIGINS", "http://x", """MEMORY_RECALL_SERVICE__CORS_ORIGINS: must be JSON (a \
list, e.g. '["a", "b"]'); got 'http://x'"""),
        ("MEMORY_RECALL_SERVICE__MALLOC_ARENAS", "-1", "MEMORY_RECALL_SERVICE__MALLOC_ARENAS: Input should be greater "
         "than or equal to 0 (setting service.malloc_arenas; got '-1')"),
        ("MEMORY_RECALL_SERVICE__HEAP_TRIM_S", "-5", "MEMORY_RECALL_SERVICE__HEAP_TRIM_S: Input should be greater "
         "than or equal to 0 (setting service.heap_trim_s; got '-5')"),
        ("MEMORY_RECALL_PROFILE", "bogus",
         "MEMORY_RECALL_PROFILE: unknown profile 'bogus'; expected one of default, app, fallback, transcript"),
    ])
    def test_env_value(self, monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str) -> None:
        assert _error(monkeypatch, name, value) == message

    def test_a_file_value_names_the_setting(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        """A bad value from the file is reported as the setting; a variable of another key is not blamed."""
        toml = tmp_path / "settings.toml"
        toml.write_text("[diffusion]\ndecay = 5\n", encoding="utf-8")
        assert _error(monkeypatch, "MEMORY_RECALL_DIFFUSION__TOP_K", "50", toml) == (
            "diffusion.decay: Input should be less than or equal to 1"
        )

    def test_a_variable_over_a_file_value_is_the_one_named(self, monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
        toml = tmp_path / "settings.toml"
        toml.write_text("[diffusion]\ndecay = 0.5\n", encoding="utf-8")
        assert _error(monkeypatch, "MEMORY_RECALL_DIFFUSION__DECAY", "5", toml) == (
            "MEMORY_RECALL_DIFFUSION__DECAY: Input should be less than or equal to 1 (setting diffusion.decay; got '5')"
        )


class TestPrecedence:
    """Profile defaults < settings file < environment < overrides, key by key; the profile by the same order."""

    def _file(self, tmp_path: Path, text: str) -> Path:
        toml = tmp_path / "settings.toml"
        toml.write_text(text, encoding="utf-8")
        return toml

    def test_a_variable_beats_the_file_for_its_key_only(self, monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
        toml = self._file(tmp_path, "[diffusion]\ndecay = 0.6\ntop_k = 40\n")
        monkeypatch.setenv("MEMORY_RECALL_DIFFUSION__DECAY", "0.5")
        s = load_settings(toml)
        assert (s.diffusion.decay, s.diffusion.top_k) == (0.5, 40)

    def test_a_section_variable_merges_into_the_files_section(self, monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
        toml = self._file(tmp_path, "[service]\nport = 9000\ncors_origins = [\"http://a:1\"]\n")
        monkeypatch.setenv("MEMORY_RECALL_SERVICE", '{"cors_origins": ["http://b:2"]}')
        s = load_settings(toml)
        assert (s.service.port, s.service.cors_origins) == (9000, ("http://b:2",))

    def test_overrides_beat_the_environment(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        toml = self._file(tmp_path, "[diffusion]\ndecay = 0.6\n")
        monkeypatch.setenv("MEMORY_RECALL_DIFFUSION__DECAY", "0.5")
        assert load_settings(toml, overrides={"diffusion": {"decay": 0.4}}).diffusion.decay == 0.4

    def test_the_environment_beats_the_profile_default(self, monkeypatch: pytest.MonkeyPatch) -> None:
        transcript = load_settings(profile="transcript")
        assert transcript.lexical.stem == "porter"
        monkeypatch.setenv("MEMORY_RECALL_LEXICAL__STEM", "none")
        assert load_settings(profile="transcript").lexical.stem == "none"

    def test_profile_argument_then_variable_then_file(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        toml = self._file(tmp_path, 'profile = "fallback"\n')
        assert load_settings(toml).profile == "fallback"
        monkeypatch.setenv("MEMORY_RECALL_PROFILE", "transcript")
        assert load_settings(toml).profile == "transcript"
        assert load_settings(toml, profile="app").profile == "app"

    @pytest.mark.parametrize(("content", "message"), [
        (b"\xff\xfe[x]", "not UTF-8 text: invalid start byte at byte 0"),
    ])
    def test_unreadable_file(self, tmp_path: Path, content: bytes, message: str) -> None:
        toml = tmp_path / "settings.toml"
        toml.write_bytes(content)
        with pytest.raises(ConfigError) as err:
            load_settings(toml)
        assert str(err.value) == f"{toml}: {message}"
        with pytest.raises(ConfigError) as err:
            load_settings(tmp_path)
        assert str(err.value) == f"{tmp_path}: is a directory, not a TOML file"
