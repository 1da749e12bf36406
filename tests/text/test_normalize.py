"""normalize_query (NQ) and js_len against their definitions (stbme-reference §0)."""

from __future__ import annotations

import re
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from memory_recall.text.normalize import js_len, normalize_query

_WHITESPACE = [chr(cp) for cp in range(sys.maxunicode + 1) if re.fullmatch(r"\s", chr(cp))]


def nq_reference(text: str, max_len: int = 400) -> str:
    """NQ as the reference writes it: CRLF→LF, every ``\\s`` run → one space, trim, cut to ``max_len`` JS units."""
    s = re.sub(r"\s+", " ", text.replace("\r\n", "\n")).strip()
    out, used = [], 0
    for ch in s:
        width = 2 if ord(ch) > 0xFFFF else 1
        if used + width > max_len:
            break
        out.append(ch)
        used += width
    return "".join(out)


def js_len_reference(text: str) -> int:
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


_TEXT = st.lists(
    st.one_of(st.sampled_from([*_WHITESPACE, "a", "B", "钟", "\U0001f600", "\ud800", "\r\n"]), st.characters()),
    max_size=40,
).map("".join)


class TestNormalizeQuery:
    def test_whitespace_set_is_str_isspace(self):
        # NQ splits with str.split(): the same characters as regex \s, every one of them a separator.
        assert _WHITESPACE == [chr(cp) for cp in range(sys.maxunicode + 1) if chr(cp).isspace()]
        for ch in _WHITESPACE:
            assert normalize_query(f"{ch}a{ch}{ch}b{ch}") == "a b"

    def test_examples(self):
        assert normalize_query("  Hello\r\n\r\n  World\t ") == "Hello World"
        assert normalize_query(None) == ""
        assert normalize_query(12) == "12"
        assert normalize_query("ab\U0001f600c", 3) == "ab"  # a surrogate pair is dropped, never split

    @settings(max_examples=300)
    @given(_TEXT, st.integers(0, 12))
    def test_matches_the_regex_definition(self, text: str, max_len: int):
        assert normalize_query(text, max_len) == nq_reference(text, max_len)
        assert normalize_query(text) == nq_reference(text)


class TestJsLen:
    def test_examples(self):
        assert js_len("") == 0
        assert js_len("abc") == 3
        assert js_len("钟楼") == 2
        assert js_len("a\U0001f600") == 3
        assert js_len("\ud800x") == 2  # a lone surrogate is one UTF-16 unit

    @settings(max_examples=300)
    @given(_TEXT)
    def test_matches_the_definition(self, text: str):
        assert js_len(text) == js_len_reference(text)
