"""Suffix stemmers of the BM25 channel: exact Porter (1980), Snowball English and S-stemmer outputs, and what is
left alone."""

from __future__ import annotations

import pytest

from memory_recall.text.stem import STEM_METHODS, english_stem, porter_stem, s_stem, stem_term

# Examples from Porter's paper (steps 1–5) plus everyday chat words.
PORTER = {
    "caresses": "caress", "ponies": "poni", "ties": "ti", "caress": "caress", "cats": "cat", "feed": "feed",
    "agreed": "agre", "plastered": "plaster", "bled": "bled", "motoring": "motor", "sing": "sing",
    "conflated": "conflat", "troubled": "troubl", "sized": "size", "hopping": "hop", "tanned": "tan",
    "falling": "fall", "hissing": "hiss", "fizzed": "fizz", "failing": "fail", "filing": "file", "happy": "happi",
    "sky": "sky", "relational": "relat", "conditional": "condit", "rational": "ration", "valenci": "valenc",
    "digitizer": "digit", "vietnamization": "vietnam", "predication": "predic", "operator": "oper",
    "feudalism": "feudal", "decisiveness": "decis", "hopefulness": "hope", "callousness": "callous",
    "sensibiliti": "sensibl", "triplicate": "triplic", "formative": "form", "formalize": "formal",
    "electrical": "electr", "goodness": "good", "revival": "reviv", "allowance": "allow", "inference": "infer",
    "airliner": "airlin", "adjustable": "adjust", "defensible": "defens", "irritant": "irrit",
    "replacement": "replac", "adjustment": "adjust", "dependent": "depend", "adoption": "adopt",
    "communism": "commun", "activate": "activ", "homologous": "homolog", "effective": "effect",
    "bowdlerize": "bowdler", "probate": "probat", "rate": "rate", "cease": "ceas", "controll": "control",
    "roll": "roll", "generalizations": "gener", "oscillators": "oscil",
    "painting": "paint", "painted": "paint", "paints": "paint", "running": "run", "movies": "movi",
    "movie": "movi", "adopted": "adopt", "adopting": "adopt",
}  # fmt: skip


@pytest.mark.parametrize(("word", "stem"), sorted(PORTER.items()))
def test_porter_examples(word: str, stem: str) -> None:
    assert porter_stem(word) == stem
    assert stem_term(word, "porter") == stem


# The Snowball English examples (snowballstem.org's vocabulary list) and the rules Porter2 added: special forms
# ("skies", "news", "dying") and the shorter "general" of step 2.
ENGLISH = {
    "consign": "consign", "consigned": "consign", "consigning": "consign", "consignment": "consign",
    "consist": "consist", "consisted": "consist", "knack": "knack", "knackeries": "knackeri", "knavish": "knavish",
    "skies": "sky", "news": "news", "dying": "die", "generalizations": "general", "painting": "paint",
}  # fmt: skip


@pytest.mark.parametrize(("word", "stem"), sorted(ENGLISH.items()))
def test_english_examples(word: str, stem: str) -> None:
    assert english_stem(word) == stem
    assert stem_term(word, "english") == stem


def test_s_stemmer_rules_and_exceptions() -> None:
    got = [s_stem(w) for w in ("ponies", "aies", "eies", "shoes", "toes", "dogs", "glass", "bus", "is", "was")]
    # "aies"/"eies" and "oes" are Harman's exceptions; two-letter words and -us/-ss endings stay; "was" is
    # over-stemmed as in the published rules (it is a stop word, never indexed).
    assert got == ["pony", "aie", "eie", "shoe", "toe", "dog", "glass", "bus", "is", "wa"]


@pytest.mark.parametrize("method", ["s", "porter", "english"])
def test_only_ascii_lower_case_words_of_three_letters_or_more(method: str) -> None:
    left = ["café", "2023", "1.5", "钟楼", "cats2", "Cats", "as", "книги", ""]
    assert [stem_term(w, method) for w in left] == left


def test_none_and_unknown_method() -> None:
    assert stem_term("paintings", "none") == "paintings"
    assert STEM_METHODS == ("none", "s", "porter", "english")
    with pytest.raises(ValueError, match="unknown stem method 'snowball'"):
        stem_term("paintings", "snowball")
