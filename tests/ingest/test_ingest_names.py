"""Name detection: exact mention lists (name, kind, start) for English and Chinese text."""

from __future__ import annotations

import pytest

from memory_recall.ingest.names import KnownNames, Mention, detect_names, fold_name

CASES: list[tuple[str, str, list[str], list[tuple[str, str, int]]]] = [
    ("sentence-start interjection dropped, accented, multiword",
     "Hey Caroline, I met Zoë at Lake Tahoe!", [],
     [("Caroline", "name", 4), ("Zoë", "name", 20), ("Lake Tahoe", "name", 27)]),
    ("possessive, weekday, sentence-start article",
     "Caroline's mom went to New York last Monday. The Beatles played.", [],
     [("Caroline", "name", 0), ("New York", "name", 23), ("Beatles", "name", 49)]),
    ("title abbreviation, apostrophe and Mc names",
     "Thanks Mel! Yesterday I saw Mr. Smith and O'Neil at McDonald's.", [],
     [("Mel", "name", 7), ("Mr. Smith", "name", 28), ("O'Neil", "name", 42), ("McDonald", "name", 52)]),
    ("hyphenated names, contractions, acronyms",
     "Self-care matters. Jean-Luc Picard agrees. Don't worry about LGBTQ stuff in São Paulo.", [],
     [("Jean-Luc Picard", "name", 19), ("LGBTQ", "name", 61), ("São Paulo", "name", 76)]),
    ("sentence openers: gerund, exclamation",
     "Biking is fun. Adding NYC to the list. Cute! Sweden is lovely.", [],
     [("NYC", "name", 22), ("Sweden", "name", 45)]),
    ("lone starter mid-sentence, weekday",
     "Yeah, Here's the thing: on Friday we watched TV.", [],
     [("TV", "name", 45)]),
    ("quoted titles; dialogue is not a name",
     'I read "The Name of the Wind" and "Finding Freedom." yesterday. "Come here," he said.', [],
     [("The Name of the Wind", "quoted", 8), ("Finding Freedom", "quoted", 35)]),
    ("scare quotes and quoted starters rejected, curly quotes",
     'She called it "me-time" and said “Becoming Nicole” was "That".', [],
     [("Becoming Nicole", "quoted", 34)]),
    ("Chinese: brackets and known names only",
     "我们明天去「摩耶山」看夜景吧，林晚说《三体》很好看。", ["林晚", "苏言"],
     [("摩耶山", "quoted", 6), ("林晚", "known", 15), ("三体", "quoted", 19)]),
    ("Chinese: 『』 quoted; a sentence in 【】 is not a name",
     "林晚，你昨天见到苏言了吗？『星之卡比』呢？【系统提示：好的。】", ["林晚", "苏言"],
     [("林晚", "known", 0), ("苏言", "known", 8), ("星之卡比", "quoted", 14)]),
    ("known names case-insensitive, longest first, lower-case starter ignored",
     "mary jane and Mary went to the park. will you come, Will?", ["Mary Jane", "Mary", "Will"],
     [("Mary Jane", "known", 0), ("Mary", "known", 14), ("Will", "known", 52)]),
    ("known possessive lower-case",
     "caroline's dog met Melanie.", ["Caroline"],
     [("Caroline", "known", 0), ("Melanie", "name", 19)]),
    ("action and emoji start sentences",
     "*smiles* 🎉 Congrats Caroline! I went hiking with Tim and john.", ["John"],
     [("Caroline", "name", 20), ("Tim", "name", 49), ("John", "known", 57)]),
    ("title-cased sentence is not a name",
     "We Are Going To The Big Party Tonight, said Ann.", [],
     [("Ann", "name", 44)]),
    ("empty", "", [], []),
    ("no names", "no names here at all.", [], []),
]


class TestDetectNames:
    @pytest.mark.parametrize(("text", "known", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
    def test_exact_mentions(self, text: str, known: list[str], expected: list[tuple[str, str, int]]) -> None:
        got = detect_names(text, known)
        assert [(m.name, m.kind, m.start) for m in got] == expected
        for m in got:
            if m.kind != "known":
                assert text[m.start:m.end] == m.name

    def test_dedup_by_casefolded_name_keeps_first(self) -> None:
        assert detect_names("Paris is big. I love Paris and PARIS.") == [Mention("Paris", "name", 0, 5)]

    def test_known_index_grows(self) -> None:
        index = KnownNames(["林晚"])
        assert [m.name for m in detect_names("苏言和林晚", index)] == ["林晚"]
        index.add("苏言")
        assert [(m.name, m.start) for m in detect_names("苏言和林晚", index)] == [("苏言", 0), ("林晚", 3)]
        index.add("X")  # one character: ignored
        assert len(index) == 2 and "苏言" in index

    def test_known_string_and_index_agree(self) -> None:
        text = "Caroline met 林晚 in New York."
        names = ["林晚", "Caroline"]
        assert detect_names(text, names) == detect_names(text, KnownNames(names))

    def test_fold_name(self) -> None:
        assert fold_name("  Ｍary\u3000 JANE ") == "mary jane"
