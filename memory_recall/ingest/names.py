"""Name detection in chat text, without any model: the rules that turn a message into entity mentions.

:func:`detect_names` finds three kinds of mentions and returns them in text order, one per casefolded name:

``"name"`` — capitalised words (Latin script, accented letters included), and in Han script the names of the
    Chinese rules below. Capitalised words:
    a maximal run of Capitalised words separated only by spaces (``New York``, ``Lake Tahoe``, ``Zoë``,
    ``O'Neil``, ``McDonald``, ``Jean-Luc``; every part of a hyphenated or apostrophe word must be capitalised,
    so ``Self-care`` and ``Don't`` are not names). A possessive ``'s``/``’s`` is dropped (``Caroline's`` →
    ``Caroline``). ``Mr. Smith``: a title abbreviation does not end a sentence and stays in the run.
    At a sentence start (text start, after ``. ! ? … 。 ！ ？ :``, a line break, an emoji, or the opening of a
    quotation or an ``*action*``) leading words of :data:`SENTENCE_STARTERS` (pronouns, articles,
    interjections, auxiliaries, weekdays, months, common openers, …) are dropped (``Hey Caroline`` →
    ``Caroline``, ``The`` → nothing), an opening word ending in -ing/-ed/-ly is dropped (``Adding NYC`` →
    ``NYC``; alone: ``Biking``, ``Thankfully``), and a lone opening word followed at once by punctuation
    (``Cute!``, ``Nah,``) is not a name. Anywhere, leading and trailing words of :data:`NEVER_NAMES` (``I``,
    weekdays, months, ``OK``, ``LOL``, interjections) are dropped (``on Monday`` yields nothing), and a lone
    word of :data:`SENTENCE_STARTERS` (``Yeah, Here's``), a lone title (``Mr``) or a lone letter is not a
    name; nor is a run of more than 6 words (a title-cased sentence or headline).
``"quoted"`` — text inside ``“…”``, ``"…"``, ``「…」``, ``『…』``, ``《…》``, ``【…】`` that looks like a
    name or a title rather than dialogue: 2–40 characters, at most 5 words, no sentence punctuation inside
    (``. ! ? … 。 ！ ？``; one trailing ``.`` is tolerated and dropped, as American style puts it inside the
    quotes: ``"Finding Freedom."``), no comma/semicolon/enumeration comma (dialogue: ``"Come here," he
    said``), at least one letter, starting with an upper-case letter when it starts with a Latin letter
    (lower-case quoted phrases are scare quotes: ``"me-time"``), and not a lone sentence starter
    (``"That"``).
``"known"`` — every occurrence of a caller-supplied known name (speakers, entity names). Latin names match
    case-insensitively on word boundaries (``caroline`` → ``Caroline``), except that an all-lower-case
    occurrence of a known name that is itself a sentence starter (``will`` for a speaker ``Will``) is
    ignored; names with CJK or other characters the Latin word pattern cannot spell match as substrings.
    The mention's ``name`` is the known spelling.

Chinese (Han script, CJK ideographs) has no capitals and no spaces. Besides quoted and known names, a run of Han
characters yields a ``"name"`` mention (2–5 characters) for

* a name before a title (:data:`CJK_TITLES`: ``玄机子长老`` → 玄机子, ``叶行先生`` → 叶行), bounded on its left by
  the run's start, a function character (:data:`CJK_BOUNDARY`) or a role word; before the everyday titles
  (先生, 姑娘, 修女 …, which also follow adjectives) the name must look like one (a surname from
  :data:`CJK_SURNAMES` + 1–2 characters, a compound surname, 阿 + one character, or transliteration characters
  :data:`CJK_TRANSLIT`). A one-character surname keeps its title (``刘师叔``), and is reported as a ``"known"``
  mention of the one known 2–3 character name with that surname when there is exactly one (``苏师姐`` → 苏晚);
* a name after a role word (:data:`CJK_ROLES`: ``内门弟子苏晚``, ``调查官艾琳``, ``头领王大山``) or an introducer
  (:data:`CJK_INTRODUCERS`, or 叫 after a pronoun: ``他叫赵恒``, ``它叫阿雪``): a surname name up to the next
  function character when that is 2–3 characters away, 阿 + one character, or transliteration characters; after
  an introducer also a place (a run ending in a place suffix, :data:`CJK_PLACE_SUFFIXES`);
* a run of transliteration characters holding one of :data:`CJK_TRANSLIT_STRONG` (``小米娅`` → 米娅, ``卡尔``),
  cut after its last strong character;
* a named event, two characters + 之乱/之战/之役/之变/之盟 (``狐妖之乱``).

Words of :data:`CJK_STOPWORDS` are never such names. Names that a chat only ever repeats (露西亚, 钟楼, 青云宗)
are not visible in one message: :func:`recurring_names` finds them across a batch, and the ingest passes them as
known names. Kana and hangul get only the quoted and known rules.

Overlaps: every quoted mention is kept; a known mention is dropped when it overlaps a longer known
mention (``Mary`` inside ``Mary Jane``); a capitalised or Han-rule mention is dropped when it overlaps a quoted or
known one (``The Name`` inside ``"The Name of the Wind"``), and of overlapping Han-rule names the one that starts
first (then the longer) is kept. Among identical casefolded names only the first occurrence is reported. Output
order: start offset, then longer span first. The Han rules do not run on text without Han characters.

All patterns are compiled once at import; :class:`KnownNames` is an index that grows without recompiling
anything, so a batch ingest can add names found in earlier messages at O(1) cost.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "CJK_BOUNDARY",
    "CJK_COMPOUND_SURNAMES",
    "CJK_INTRODUCERS",
    "CJK_PLACE_SUFFIXES",
    "CJK_PLACE_SUFFIXES_WEAK",
    "CJK_ROLES",
    "CJK_STOPWORDS",
    "CJK_SURNAMES",
    "CJK_TITLES",
    "CJK_TITLES_COMMON",
    "CJK_TITLES_SECT",
    "CJK_TRANSLIT",
    "CJK_TRANSLIT_STRONG",
    "NEVER_NAMES",
    "RECURRING_MAX_CHARS",
    "RECURRING_MAX_NAMES",
    "RECURRING_MIN_MESSAGES",
    "SENTENCE_STARTERS",
    "KnownNames",
    "Mention",
    "MentionKind",
    "detect_names",
    "fold_name",
    "recurring_names",
]

MentionKind = Literal["name", "quoted", "known"]

_LATIN = "0-9A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u1e00-\u1eff"
#: A Latin word: letters/digits, with inner apostrophes and hyphens (O'Neil, Jean-Luc, Caroline's).
_WORD_RE = re.compile(rf"[{_LATIN}]+(?:['’\-][{_LATIN}]+)*")
# A word that starts with an upper-case Latin letter (the scan for names visits only these; lower-case words
# are skipped by the regex engine). Latin Extended mixes cases, so the first letter is checked again.
_CAP_WORD_RE = re.compile(
    rf"(?<![{_LATIN}'’\-])[A-Z\u00c0-\u00d6\u00d8-\u00de\u0100-\u024f\u1e00-\u1eff][{_LATIN}]*(?:['’\-][{_LATIN}]+)*"
)
_PART_SPLIT = re.compile(r"['’\-]")
_POSSESSIVE_RE = re.compile(r"['’][sS]$")
_WS_RE = re.compile(r"\s+")
# Quote pairs; unbounded inner classes so an over-long quotation is consumed whole and never re-paired
# with the next quote (the length limit is applied afterwards).
_QUOTE_RE = re.compile(
    r"“([^“”\n]*)”|\"([^\"\n]*)\"|「([^「」\n]*)」|『([^『』\n]*)』|《([^《》\n]*)》|【([^【】\n]*)】"
)
_TERMINAL = frozenset(".!?…。！？")
_OPENER_SUFFIXES = ("ing", "ed", "ly")
_MAX_RUN_WORDS = 6
_EXCLAMATION_PUNCT = frozenset(",.!?…:;")
_DIALOGUE_MARKS = frozenset(",，、;；")
_SENTENCE_ENDERS = frozenset(".!?…。！？:：\n\r")
# Characters skipped when looking back for a sentence end: quotes, brackets, emphasis marks, dashes.
_SKIP_BACK = frozenset("'”’»)]}_~-–—」』》】")
_OPENERS = frozenset("\"“‘«([{*「『《【")
_TRAILING_WORD_RE = re.compile(rf"[{_LATIN}]+$")
#: Title abbreviations whose period does not end a sentence (``Mr. Smith``).
_TITLES = frozenset({"mr", "mrs", "ms", "mx", "dr", "prof", "st", "mt", "jr", "sr", "sir", "madam"})

_WEEKDAYS = (
    "monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday", "mon", "tue", "tues", "wed",
    "thu", "thur", "thurs", "fri", "sat",
)
_MONTHS = (
    "january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
    "november", "december", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov",
    "dec",
)

#: Words that are never a name on their own, wherever they stand (compared lower-case).
NEVER_NAMES: frozenset[str] = frozenset({
    "i", "i'm", "i’m", "i've", "i’ve", "i'll", "i’ll", "i'd", "i’d", "a",
    "ok", "okay", "lol", "lmao", "rofl", "omg", "btw", "tbh", "idk", "imo", "imho", "asap", "fyi", "pls",
    "thx", "ty", "haha", "hahaha", "hehe", "wow", "yay", "hey", "hi", "hello", "oh", "ah", "aww", "awww",
    "ugh", "hmm", "hmmm", "um", "uh", "yeah", "yep", "yup", "nope", "yes", "no", "thanks", "thank",
    "congrats", "congratulations", "sorry", "please", "cheers", "bye", "goodbye",
    *_WEEKDAYS, *_MONTHS,
})

#: Common sentence starters: a capitalised word at a sentence start is a name only if it is not one of these.
SENTENCE_STARTERS: frozenset[str] = NEVER_NAMES | frozenset({
    # pronouns, determiners, possessives
    "he", "she", "we", "they", "it", "you", "me", "us", "them", "him", "my", "your", "our", "their", "his",
    "her", "its", "mine", "yours", "ours", "theirs", "myself", "yourself", "the", "an", "this", "that",
    "these", "those", "there", "here", "some", "any", "all", "every", "each", "both", "many", "much", "most",
    "more", "few", "such", "one", "two", "three", "another", "other", "someone", "something", "everyone",
    "everything", "anyone", "anything", "nobody", "nothing", "none",
    # contractions
    "it's", "that's", "let's", "you're", "we're", "they're", "he's", "she's", "there's", "here's", "what's",
    "who's", "where's", "how's", "don't", "didn't", "doesn't", "can't", "won't", "isn't", "wasn't", "aren't",
    "weren't", "haven't", "hasn't", "couldn't", "wouldn't", "shouldn't", "you've", "we've", "they've",
    "you'll", "we'll", "they'll", "you'd", "we'd", "they'd", "he'd", "she'd", "that'll", "y'all",
    # conjunctions, prepositions
    "and", "but", "or", "so", "because", "if", "although", "though", "while", "as", "at", "in", "on", "for",
    "with", "by", "from", "to", "of", "about", "after", "before", "since", "until", "during", "into",
    "through", "over", "under", "between", "without", "like", "unlike", "than", "then", "once", "whether",
    # interrogatives, auxiliaries
    "what", "when", "where", "why", "how", "who", "whom", "whose", "which", "do", "did", "does", "done",
    "can", "could", "would", "should", "shall", "will", "might", "must", "is", "are", "was", "were", "be",
    "been", "being", "have", "has", "had", "having", "am",
    # adverbs and discourse markers
    "just", "also", "maybe", "perhaps", "really", "actually", "anyway", "anyways", "honestly", "definitely",
    "absolutely", "totally", "certainly", "probably", "hopefully", "luckily", "unfortunately", "fortunately",
    "sometimes", "recently", "lately", "usually", "always", "never", "often", "still", "even", "only",
    "now", "today", "tonight", "tomorrow", "yesterday", "soon", "later", "again", "already", "finally",
    "first", "second", "last", "next", "not", "very", "too", "quite", "pretty", "kinda", "sorta", "oops",
    "instead", "otherwise", "besides", "plus", "speaking", "talking", "btw", "well", "right", "exactly",
    "indeed", "true", "agreed", "fair", "morning", "afternoon", "evening", "night", "spring", "summer",
    "autumn", "fall", "winter", "weekend",
    # interjections and reactions
    "sure", "good", "great", "nice", "awesome", "cool", "sounds", "glad", "happy", "welcome", "amazing",
    "wonderful", "beautiful", "lovely", "fantastic", "incredible", "interesting", "sweet", "perfect",
    "excellent", "brilliant", "love", "hope", "wish", "guess", "remember", "look", "listen", "wait",
    "aw", "whoa", "woah", "yikes", "damn", "gosh", "jeez", "alright", "ahh", "ooh", "oooh", "dear",
    "hm", "mhm", "huh", "eh", "meh", "yo", "hiya", "heya", "lots", "tell", "take", "keep", "let", "make",
    "check", "got", "get", "go", "went", "made", "seeing", "going", "getting", "thinking", "feeling",
    "know", "think", "see", "said", "say", "says", "come", "give", "try", "stop", "help", "enjoy", "stay",
    "bring", "call", "find", "send", "show", "put", "read", "watch", "meet", "hold", "turn", "leave", "play",
    "start", "feel", "need", "want", "tried", "loved", "saw", "took", "gave", "found", "felt", "gonna",
    "wanna", "gotta", "nah", "phew", "bet", "cute", "super", "almost", "ever", "whenever", "wherever",
    "whatever", "however", "especially", "makes", "takes", "looks", "reminds", "seems", "means", "feels",
    "life", "time", "stuff", "thoughts", "long", "strong", "young", "appreciate", "respect", "talk",
    "create", "gather", "spill", "excited", "exciting", "lucky", "proud", "wonder", "imagine",
})


def fold_name(name: str) -> str:
    """Comparison key of a name: NFKC, whitespace runs collapsed to one space, trimmed, casefolded."""
    return _WS_RE.sub(" ", unicodedata.normalize("NFKC", name)).strip().casefold()


@dataclass(frozen=True, slots=True)
class Mention:
    """One name found in a text: ``text[start:end]`` is the surface, ``name`` the reported spelling."""

    name: str
    kind: MentionKind
    start: int
    end: int


def _strip_possessive(word: str) -> str:
    return _POSSESSIVE_RE.sub("", word)


def _lower_core(word: str) -> str:
    low = word.lower()
    return low[:-2] if low.endswith(("'s", "’s")) else low


def _is_capitalised(word: str) -> bool:
    # Every part of O'Neil / Jean-Luc must start upper-case; "Don't" and "Self-care" fail.
    if "'" not in word and "’" not in word and "-" not in word:
        return word[0].isupper()
    return all(part[:1].isupper() for part in _PART_SPLIT.split(word))


def _at_sentence_start(text: str, pos: int) -> bool:
    i = pos - 1
    while i >= 0:
        ch = text[i]
        if ch == " ":
            i -= 1
            continue
        # Line breaks, emoji and the opening of a quotation or an *action* all begin a new sentence.
        if ch in "\n\r" or ch in _OPENERS or unicodedata.category(ch) == "So":
            return True
        if ch in _SKIP_BACK or ch.isspace() or unicodedata.category(ch)[0] == "S":
            i -= 1
            continue
        if ch in _SENTENCE_ENDERS:
            if ch == ".":
                m = _TRAILING_WORD_RE.search(text, max(0, i - 8), i)
                if m and m.group(0).lower() in _TITLES:
                    return False
            return True
        return False
    return True


class KnownNames:
    """An index of known names (speakers, entity names).

    Latin names whose words the Latin word pattern spells exactly are matched case-insensitively on word
    boundaries by one alternation pattern, compiled lazily and again only after a Latin name is added (a batch
    ingest adds its speakers once). Every other name (CJK, ``C++``) is matched as a substring through an index
    by first character, which grows at O(1) cost (case-insensitively when lower-casing keeps the text length).
    Names shorter than 2 characters are ignored: a one-character substring is noise.
    """

    __slots__ = ("_latin", "_latin_re", "_by_first_char", "_seen")

    def __init__(self, names: Iterable[str] = ()) -> None:
        self._latin: dict[str, str] = {}  # lower-case, single-spaced spelling → reported name
        self._latin_re: re.Pattern[str] | None = None
        self._by_first_char: dict[str, list[tuple[str, str]]] = {}
        self._seen: set[str] = set()
        for name in names:
            self.add(name)

    def __len__(self) -> int:
        return len(self._seen)

    def copy(self) -> KnownNames:
        """An independent index with the same names in the same order (and the same compiled pattern, which is
        immutable): adding to the copy leaves this one unchanged."""
        other = KnownNames()
        other._latin = dict(self._latin)
        other._latin_re = self._latin_re
        other._by_first_char = {ch: list(bucket) for ch, bucket in self._by_first_char.items()}
        other._seen = set(self._seen)
        return other

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and fold_name(name) in self._seen

    def add(self, name: str) -> None:
        """Add one name (its first spelling is the one reported); blank or 1-character names are ignored."""
        clean = _WS_RE.sub(" ", unicodedata.normalize("NFKC", name)).strip()
        key = clean.casefold()
        if len(clean) < 2 or key in self._seen:
            return
        self._seen.add(key)
        words = [m.group(0) for m in _WORD_RE.finditer(clean)]
        if words and " ".join(words) == clean:
            self._latin.setdefault(clean.lower(), clean)
            self._latin_re = None
        else:
            low = clean.lower()
            bucket = self._by_first_char.setdefault(low[0], [])
            bucket.append((low, clean))
            bucket.sort(key=lambda item: (-len(item[0]), item[1]))

    def unique_han_name_with_surname(self, surname: str) -> str | None:
        """The one known 2–3 character Han name that starts with ``surname`` (苏 → 苏晚), else ``None`` (none, or
        several: 苏师姐 cannot tell 苏晚 from 苏言)."""
        found = [name for _, name in self._by_first_char.get(surname, ())
                 if 2 <= len(name) <= 3 and all(_is_han(ch) for ch in name)]
        return found[0] if len(found) == 1 else None

    def _pattern(self) -> re.Pattern[str]:
        if self._latin_re is None:
            alternatives = "|".join(
                r"\s+".join(re.escape(w) for w in low.split(" "))
                for low in sorted(self._latin, key=lambda n: (-len(n), n))
            )
            self._latin_re = re.compile(
                rf"(?<![{_LATIN}'’\-])(?:{alternatives})(?:['’][sS])?(?![{_LATIN}'’\-])", re.IGNORECASE
            )
        return self._latin_re

    def find(self, text: str) -> list[Mention]:
        """Every occurrence of a known name in ``text``: Latin names first, then substring names."""
        out: list[Mention] = []
        if self._latin:
            for m in self._pattern().finditer(text):
                start, end = m.span()
                surface = text[start:end]
                if surface[-2:] in ("'s", "’s", "'S", "’S") and surface.lower() not in self._latin:
                    end -= 2
                    surface = surface[:-2]
                name = self._latin.get(_WS_RE.sub(" ", surface).lower())
                if name is None:
                    continue
                if surface.islower() and " " not in name and name.lower() in SENTENCE_STARTERS:
                    continue  # "will" is not the speaker Will
                out.append(Mention(name, "known", start, end))
        if self._by_first_char:
            low = text.lower()
            if len(low) != len(text):
                low = text
            i = 0
            size = len(low)
            while i < size:
                candidates = self._by_first_char.get(low[i])
                matched = 0
                if candidates:
                    for name_low, name in candidates:
                        if low.startswith(name_low, i):
                            out.append(Mention(name, "known", i, i + len(name_low)))
                            matched = len(name_low)
                            break
                i += matched or 1
        return out


def _opener_form(word: str) -> bool:
    core = _strip_possessive(word).lower()
    return len(core) > 4 and core.endswith(_OPENER_SUFFIXES)


def _plausible_opener(text: str, word: tuple[int, int, str]) -> bool:
    """Whether a lone capitalised word that opens a sentence can be a name.

    Not when it ends in -ing/-ed/-ly (``Biking``, ``Started``, ``Thankfully``: sentence-opening gerunds,
    participles and adverbs) or when punctuation follows it at once (``Cute!``, ``Nah,``: a one-word
    exclamation). Known names are found by the known-name rule regardless.
    """
    start, end, raw = word
    if _opener_form(raw):
        return False
    nxt = text[end:end + 1]
    return not (nxt == "" or nxt in _EXCLAMATION_PUNCT)


def _capitalised_mentions(text: str) -> list[Mention]:
    out: list[Mention] = []
    run: list[tuple[int, int, str]] = []

    def flush() -> None:
        if not run:
            return
        items = list(run)
        run.clear()
        if len(items) > _MAX_RUN_WORDS:
            return  # a title-cased sentence or headline, not a name
        first = items[0]
        at_start = _at_sentence_start(text, first[0])
        if at_start:
            while items and (items[0][2].lower() in SENTENCE_STARTERS
                             or _strip_possessive(items[0][2]).lower() in SENTENCE_STARTERS):
                items.pop(0)
            if len(items) > 1 and items[0] is first and _opener_form(first[2]):
                items.pop(0)  # "Adding NYC", "Learning German"
        while items and _strip_possessive(items[0][2]).lower() in NEVER_NAMES:
            items.pop(0)
        while items and _strip_possessive(items[-1][2]).lower() in NEVER_NAMES:
            items.pop()
        if not items:
            return
        if len(items) == 1:
            core = _strip_possessive(items[0][2]).lower()
            if len(core) < 2 or core in _TITLES or core in SENTENCE_STARTERS:
                return
            if at_start and items[0] is first and not _plausible_opener(text, first):
                return
        start, end = items[0][0], items[-1][1]
        last = items[-1][2]
        stripped = _strip_possessive(last)
        end -= len(last) - len(stripped)
        out.append(Mention(text[start:end], "name", start, end))

    for m in _CAP_WORD_RE.finditer(text):
        word = m.group(0)
        core = _strip_possessive(word)
        if not _is_capitalised(core):
            if run:
                flush()
            continue
        if run:
            prev_start, prev_end, prev_word = run[-1]
            gap = text[prev_end:m.start()]
            joined = bool(gap) and all(ch in " \t\u00a0" for ch in gap)
            if not joined and gap[:1] == "." and len(gap) > 1 and all(ch in " \t\u00a0" for ch in gap[1:]):
                joined = prev_word.lower() in _TITLES
            # A possessive ends a name: "Caroline's Mom" is two things.
            if not joined or prev_word != _strip_possessive(prev_word):
                flush()
        run.append((m.start(), m.end(), word))
    flush()
    return out


def _quoted_mentions(text: str) -> list[Mention]:
    out: list[Mention] = []
    for m in _QUOTE_RE.finditer(text):
        group = next(g for g in range(1, 7) if m.group(g) is not None)
        raw = m.group(group)
        content = raw.strip()
        if content.endswith(".") and not content.endswith(".."):
            content = content[:-1].rstrip()
        if not 2 <= len(content) <= 40 or len(content.split()) > 5:
            continue
        if any(ch in _TERMINAL or ch in _DIALOGUE_MARKS for ch in content):
            continue
        if not any(ch.isalpha() for ch in content):
            continue
        first = content[0]
        if re.match(rf"[{_LATIN}]", first) and first.isalpha() and not first.isupper():
            continue
        if " " not in content and content.lower() in SENTENCE_STARTERS:
            continue
        start = m.start(group) + (len(raw) - len(raw.lstrip()))
        out.append(Mention(content, "quoted", start, start + len(content)))
    return out


# --- Chinese (Han script) -------------------------------------------------------------------------------------
#
# Han text has no capitals and no spaces. The rules below find names by their shape (a surname, transliteration
# characters, a place suffix) and by what stands next to them (a title after, a role word or 叫 before), and the
# batch-level :func:`recurring_names` finds the ones a chat keeps repeating. Every list is a closed, hand-written
# set; nothing is downloaded or learned.

_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_HAN_RE = re.compile(f"[{_HAN}]")
_HAN_RUN_RE = re.compile(f"[{_HAN}]+")


def _chars(text: str) -> frozenset[str]:
    return frozenset(text.replace(" ", "").replace("\n", ""))


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


#: Function characters (particles, pronouns, prepositions, negations, measure words, speech verbs, the verbs that
#: take a person: 找, 帮, 陪 …): a name never starts or ends with one, so they bound the name next to a title or
#: role word. 道/地/都 and the numerals 二/三
#: are missing on purpose (下水道, 禁地, 王都, 李三, 孙二娘).
CJK_BOUNDARY: frozenset[str] = _chars("""
    的了着过是在和与跟同及或就也还又再才便却但而把被让给对向朝从往到由于为以将请问说讲这那哪此其每各某该
    一两几个位名只些种我你他她它咱您们谁啥什么吗呢吧啊呀哦嗯哈嘛啦呐哟喔哎唉嘿哼噢咦不没很太最更非已正刚
    要会能可得若如且并虽因所去来找帮见陪带替叫喊求劝扶推护救看
""")

#: Common single-character surnames. Surnames that start everyday words far more often than names are left out
#: (黄昏, 马上, 何处, 高大, 金色, 石板, 方向, 白色, 江湖, 明天, 钟声, 安静, 任何, 万一, 温柔, 雷声, 钱袋 …).
CJK_SURNAMES: frozenset[str] = _chars("""
    王李张刘陈杨赵吴周徐孙朱郭林罗郑梁宋唐韩冯邓曹彭肖董袁潘蒋蔡杜叶苏魏吕丁沈姚卢姜崔谭陆汪范廖贾韦邹孟熊
    秦邱尹薛闫段侯史陶黎贺顾郝龚邵覃孔萧柳楚燕凌沐傅裴纪谢祝岳宁
""")
#: Compound surnames (欧阳锋, 上官婉儿).
CJK_COMPOUND_SURNAMES: frozenset[str] = _words("""
    欧阳 上官 司马 诸葛 南宫 独孤 令狐 公孙 皇甫 轩辕 端木 慕容 长孙 宇文 尉迟 夏侯 司徒 呼延
""")
#: Characters of transliterated foreign names (露西亚, 卡尔, 艾琳). Most of them also occur in ordinary words, so
#: the per-message rule needs one of :data:`CJK_TRANSLIT_STRONG`; the recurrence rule accepts any run of them.
CJK_TRANSLIT: frozenset[str] = _chars("""
    阿埃艾爱安昂奥巴拜班邦贝本比彼宾波伯布察查达戴丹德迪蒂丁杜敦多厄恩法凡菲费芬弗福盖冈戈格贡海汉豪赫亨
    霍基吉加贾简杰卡凯坎康柯科克肯库奎拉莱兰朗劳勒雷蕾黎里理丽利莉连列林琳留卢鲁路露伦罗洛玛迈麦曼梅蒙米密
    缪莫默姆穆纳娜奈南内尼妮涅宁纽努诺欧帕派佩皮珀普齐奇乔琴琼丘萨塞赛桑瑟森莎沙史舒斯索塔泰坦汤唐特提图托
    瓦威韦维温沃乌西希辛休雅亚扬耶伊尤约泽扎詹薇琪茜黛缇娅娃尔
""")
#: Transliteration characters that ordinary words almost never use.
CJK_TRANSLIT_STRONG: frozenset[str] = _chars("娅娜妮莎莉蕾琳黛蒂珀菲薇琪茜缇艾奥埃赫弗尔斯")
#: Place and organisation suffixes (青云宗, 藏经阁, 清河镇, 钟楼, 卫队). ``_WEAK`` ones also end everyday words
#: (门口, 知道, 现场, 上山), so they count only on a name of 3 or more characters or in a recurring one.
CJK_PLACE_SUFFIXES: frozenset[str] = _chars("楼宫殿寺庙阁镇村寨府宗派城都港岛峰谷崖湖坛市区塔庄郡州县洲")
CJK_PLACE_SUFFIXES_WEAK: frozenset[str] = _chars("口门道场院园室山林河海洞街巷桥队堂国居店铺馆池泉江坡岗滩湾渡关原岭")
#: Titles and forms of address that follow a name (玄机子长老, 刘师叔, 叶行先生). After ``_SECT`` titles any
#: cleanly bounded name counts; the everyday ones (姑娘, 先生 …) also follow adjectives (年轻姑娘), so the name
#: before them must look like a name.
CJK_TITLES_SECT: frozenset[str] = _words("""
    师兄 师姐 师弟 师妹 师父 师傅 师叔 师伯 师祖 师尊 长老 掌门 宗主 门主 阁主 谷主 庄主 帮主 教主 殿主 真人 道长
    道人 上人 法师 禅师 大师 前辈 殿下 陛下 阁下 王爷
""")
CJK_TITLES_COMMON: frozenset[str] = _words("""
    先生 姑娘 小姐 公子 少爷 老爷 夫人 娘子 大人 大哥 大姐 姐姐 哥哥 妹妹 弟弟 老师 同学 医生 大夫 阿姨 叔叔
    修女 神父 牧师 将军 掌柜 城主 队长 村长 镇长 船长
""")
CJK_TITLES: frozenset[str] = CJK_TITLES_SECT | CJK_TITLES_COMMON
#: Role words a name follows in apposition (内门弟子苏晚, 调查官艾琳, 头领王大山).
CJK_ROLES: frozenset[str] = CJK_TITLES | _words("""
    弟子 药师 医师 调查官 侦探 骑士 卫兵 侍卫 守卫 头领 首领 管事 老板 商人 猎户 猎人 国王 王子 公主 女王 皇帝
    少年 少女 女子 男子 学长 学姐 徒弟 丫鬟 侍女 书生 剑客 捕快 县令 知府 管家
""")
#: Words that introduce a name (名叫林晚, 人称剑圣); 叫 alone only after a pronoun or 名字 (他叫赵恒).
CJK_INTRODUCERS: frozenset[str] = _words("名叫 叫做 叫作 名为 唤作 人称 号称 自称 外号 绰号 法号 道号")
_CJK_JIAO_AFTER = _chars("他她它我你您字")
#: Named events: two characters + 之乱/之战/之役/之变/之盟 (狐妖之乱).
_CJK_EVENT_RE = re.compile(f"([{_HAN}]{{2}})之[乱战役变盟]")
#: First characters that make a two-character word with a place suffix a motion or position, not a place
#: (上山, 下楼, 出门, 进城, 回国, 入口, 大门, 一口).
_CJK_NOT_PLACE_HEAD = _chars("上下出进入回开关过去到来登爬离走大小一全整满每各")

#: Everyday words that pass the shape rules (a surname, a suffix or transliteration characters) but are not names,
#: and the greetings and descriptions that stand before a title (多谢师姐, 拜见长老, 年轻修女).
CJK_STOPWORDS: frozenset[str] = _words("""
    周围 周身 周遭 周全 张开 张望 张嘴 张口 陈旧 陈设 徐徐 孙子 朱红 林子 林间 林中 郑重 唐突 杜绝 叶子 叶片 苏醒
    范围 熊熊 段落 陶醉 黎明 顾不 顾客 顾虑 萧瑟 柳树 楚楚 燕子 凌乱 凌晨 沐浴 纪念 李子 罗列 杨树 宁可 宁愿 岳父
    岳母 王国 王子 王位 王者 王冠 王权 王妃 王爷 王后 谢谢 祝福 陆续 董事 贺礼 史书 孔洞 知道 味道 通道 难道 街道
    霸道 地道 公道 厚道 笑道 喊道 叫道 骂道 叹道 怒道 哭道 答道 问道 门口 路口 伤口 胸口 窗口 洞口 人口 借口 家门
    房门 侧门 正门 后门 院门 专门 部门 宗门 师门 现场 当场 广场 市场 战场 立场 医院 庭院 学院 花园 公园 家园 果园
    菜园 城市 超市 地区 城区 社区 教室 卧室 密室 高楼 阁楼 酒楼 深山 火山 靠山 江山 树林 森林 山林 竹林 武林 人海
    山洞 漏洞 空洞 军队 排队 部队 车队 门派 帮派 气派 食堂 课堂 天堂 礼堂 首都 中国 外国 祖国 邻居 故居 商店 酒店
    饭店 书店 店铺 床铺 城镇 乡镇 乡村 农村 山村 政府 官府 城府 山谷 山峰 高峰 顶峰 悬崖 山崖 温泉 源泉 水池 酒坛
    花坛 论坛 文坛 祖宗 皇宫 宫殿 迷宫 子宫 寺庙 宝塔 海港 半岛 阿姨 阿谀 瓦斯
    多谢 谢过 见过 拜见 参见 拜别 恭喜 有劳 辛苦 麻烦 感谢 请教 告诉 听说 禀告 启禀 拜托 原谅 饶命 救命 年轻
""")


def _is_han(ch: str) -> bool:
    return bool(_HAN_RE.match(ch))


def _name_shape(name: str) -> bool:
    """Whether a 2–4 character Han string looks like a name on its own: a surname (+1–2 characters; a compound
    surname +1–2), 阿 + one character (阿雪), or transliteration characters only (艾琳, 露西亚)."""
    n = len(name)
    if n < 2 or name in CJK_STOPWORDS:
        return False
    if name[:2] in CJK_COMPOUND_SURNAMES and 3 <= n <= 4:
        return True
    if name[0] in CJK_SURNAMES and n <= 3:
        return True
    if name[0] == "阿" and n == 2:
        return True
    return all(ch in CJK_TRANSLIT for ch in name)


def _place_shape(name: str) -> bool:
    """Whether a 2–5 character Han string ends like a place or organisation (see the suffix lists)."""
    n = len(name)
    if n < 2 or name in CJK_STOPWORDS or any(ch in CJK_BOUNDARY for ch in name):
        return False
    last = name[-1]
    if last in CJK_PLACE_SUFFIXES:
        return not (n == 2 and name[0] in _CJK_NOT_PLACE_HEAD)
    return last in CJK_PLACE_SUFFIXES_WEAK and n >= 3


def _role_before(text: str, pos: int, start: int) -> bool:
    """Whether a role word or title ends at ``pos`` (inside the Han run that starts at ``start``)."""
    return any(pos - k >= start and text[pos - k:pos] in CJK_ROLES for k in (3, 2))


def _alternation(words: Iterable[str]) -> re.Pattern[str]:
    # A lookahead finds every position a listed word starts at, overlapping ones included (大师 and 师兄 in 大师兄).
    return re.compile("(?=(" + "|".join(sorted(words, key=lambda w: (-len(w), w))) + "))")


_TITLE_AT = _alternation(CJK_TITLES)
_ROLE_AT = _alternation(CJK_ROLES)
_INTRODUCER_AT = _alternation(CJK_INTRODUCERS | {ch + "叫" for ch in _CJK_JIAO_AFTER})
_TRANSLIT_RUN_RE = re.compile("[" + "".join(sorted(CJK_TRANSLIT)) + "]+")


def _title_mentions(text: str, start: int, end: int, known: KnownNames) -> list[Mention]:
    out: list[Mention] = []
    for m in _TITLE_AT.finditer(text, start + 1, end):
        j = m.start()
        title = m.group(1)
        i = j
        while i > start and j - i < 4 and text[i - 1] not in CJK_BOUNDARY and not _role_before(text, i, start):
            i -= 1
        # The name is cleanly bounded on the left: the run's start, a function character or a role word.
        clean = i == start or text[i - 1] in CJK_BOUNDARY or _role_before(text, i, start)
        name = text[i:j]
        if not clean or not name or name in CJK_STOPWORDS or name in CJK_ROLES:
            continue
        if len(name) > 1 and text[j - 1] in CJK_SURNAMES and not _name_shape(name):
            i, name = j - 1, text[j - 1]  # 去帮刘师叔: the surname next to the title, not what stands before it
        if len(name) == 1:
            if name not in CJK_SURNAMES:
                continue  # 大师兄, 小姑娘, 二长老
            # 苏师姐 is 苏晚 when 苏晚 is the one known name with that surname; otherwise the addressed form.
            full = known.unique_han_name_with_surname(name)
            if full is not None:
                out.append(Mention(full, "known", i, j + 2))
            else:
                out.append(Mention(text[i:j + 2], "name", i, j + 2))
        elif title in CJK_TITLES_SECT or _name_shape(name):
            out.append(Mention(name, "name", i, j))
    return out


def _name_after(text: str, i: int, end: int, *, places: bool) -> str:
    """The name that starts at ``i`` (after a role word or an introducer), or ``""``.

    A surname name is the run up to the next function character when that is 2–3 characters long (4 with a
    compound surname); a transliterated name is the longest run of transliteration characters (trimmed after its
    last strong one); 阿 + one character; with ``places`` (after an introducer: 叫做青云山), the run when it ends in
    a place suffix.
    """
    j = i
    while j < end and j - i < 5 and text[j] not in CJK_BOUNDARY:
        j += 1
    run = text[i:j]
    if len(run) < 2 or run in CJK_STOPWORDS or run in CJK_ROLES:
        return ""
    bounded = j == end or text[j] in CJK_BOUNDARY
    if run[:2] in CJK_COMPOUND_SURNAMES:
        return run if bounded and 3 <= len(run) <= 4 else ""
    if run[0] in CJK_SURNAMES:
        return run if bounded and len(run) <= 3 else ""
    if run[0] == "阿":
        return run[:2]
    translit = _translit_prefix(run)
    if translit:
        return translit
    return run if places and bounded and _place_shape(run) else ""


def _translit_prefix(run: str) -> str:
    k = 0
    while k < len(run) and run[k] in CJK_TRANSLIT:
        k += 1
    strong = [x for x in range(k) if run[x] in CJK_TRANSLIT_STRONG]
    if not strong:
        return ""
    name = run[:strong[-1] + 1]
    return name if len(name) >= 2 and name not in CJK_STOPWORDS else ""


def _role_mentions(text: str, start: int, end: int) -> list[Mention]:
    # Where a name may start: after a role word, or after an introducer (which may also name a place).
    places: dict[int, bool] = {}
    for m in _ROLE_AT.finditer(text, start, end):
        places.setdefault(m.start() + len(m.group(1)), False)
    for m in _INTRODUCER_AT.finditer(text, start, end):
        places[m.start() + len(m.group(1))] = True
    out: list[Mention] = []
    for i in sorted(places):
        name = _name_after(text, i, end, places=places[i])
        if name:
            out.append(Mention(name, "name", i, i + len(name)))
    return out


def _translit_mentions(text: str, start: int, end: int) -> list[Mention]:
    out: list[Mention] = []
    for m in _TRANSLIT_RUN_RE.finditer(text, start, end):
        name = _translit_prefix(m.group(0))
        if name:
            out.append(Mention(name, "name", m.start(), m.start() + len(name)))
    return out


def _cjk_mentions(text: str, known: KnownNames) -> tuple[list[Mention], list[Mention]]:
    """``(names, known-name mentions)`` found by the Han rules in ``text``; names do not overlap each other."""
    found: list[Mention] = []
    mapped: list[Mention] = []
    for run in _HAN_RUN_RE.finditer(text):
        start, end = run.span()
        if end - start < 2:
            continue
        for mention in _title_mentions(text, start, end, known):
            (mapped if mention.kind == "known" else found).append(mention)
        found.extend(_role_mentions(text, start, end))
        found.extend(_translit_mentions(text, start, end))
        for event in _CJK_EVENT_RE.finditer(text, start, end):
            if not any(ch in CJK_BOUNDARY for ch in event.group(1)):
                found.append(Mention(event.group(0), "name", event.start(), event.end()))
    found.sort(key=lambda m: (m.start, -(m.end - m.start), m.name))
    names: list[Mention] = []
    for m in found:
        if not names or m.start >= names[-1].end:
            names.append(m)
    return names, mapped


#: :func:`recurring_names` defaults: in at least 3 messages of the batch, at most 200 names, about 100,000 characters
#: read (≈ 0.5 s of CPU on one shared core; a 650-message chat of 150-character turns is read whole).
RECURRING_MIN_MESSAGES = 3
RECURRING_MAX_NAMES = 200
RECURRING_MAX_CHARS = 100_000
# Only the start of a very long message is read: a name a message never shows in its first 5,000 characters is
# not what makes it recur.
_RECURRING_TEXT_CHARS = 5_000
# Characters a substring that recurs only as part of a longer word starts with (下储藏室 is 地下储藏室 or 走下储藏室).
_CJK_WEAK_EDGE = _chars("上下进出回去来到走入往向过里外内中前后")


def recurring_names(
    texts: Iterable[str],
    *,
    min_messages: int = RECURRING_MIN_MESSAGES,
    max_names: int = RECURRING_MAX_NAMES,
    max_chars: int = RECURRING_MAX_CHARS,
) -> list[str]:
    """Han names that recur across ``texts`` (one text per message), for a batch ingest to add as known names.

    A candidate is a 2–4 character substring of a Han run that

    * appears in at least ``min_messages`` texts;
    * neither starts nor ends with a function character (:data:`CJK_BOUNDARY`), is not in
      :data:`CJK_STOPWORDS` and is not itself a title or role word;
    * is not always next to the same Han character on one side: a substring always followed by 亚 is a fragment of
      a longer word (露西 of 露西亚); punctuation, a quote or the text's edge next to it is a word boundary;
    * looks like a name (a surname, 阿 + one character, transliteration characters only), a place (a place or
      organisation suffix, see :data:`CJK_PLACE_SUFFIXES`), or is followed by a title somewhere (玄机子长老).

    A candidate that is another accepted candidate plus one leading or trailing position/motion character and is
    rarer than it is dropped (下储藏室 next to 储藏室). The ``max_names`` most frequent survive (ties by the name).
    Returns the names sorted by message count (descending), then by the name. Deterministic; text without Han
    characters costs one regex scan.

    Bounded: only the first 5,000 characters of a text are read, and when the texts with Han characters hold more
    than ``max_chars`` of them, every k-th such text is read (k = ⌈characters / ``max_chars``⌉), so about
    ``max_chars`` characters at most; ``min_messages`` then counts the texts read. Cost: O(characters read × 3)
    dictionary updates.
    """
    if min_messages < 1:
        raise ValueError(f"The 'min_messages' parameter must be an int in the range [1, inf). Got {min_messages}.")
    if max_chars < 1:
        raise ValueError(f"The 'max_chars' parameter must be an int in the range [1, inf). Got {max_chars}.")
    items = [text[:_RECURRING_TEXT_CHARS] for text in texts if _HAN_RE.search(text)]
    if len(items) < min_messages:
        return []
    total = sum(map(len, items))
    if total > max_chars:
        items = items[::-(-total // max_chars)]
    df: dict[str, int] = {}
    # The one Han character seen next to a substring on each side so far, or "" once it had two different ones or
    # the run's edge (then it is not a fragment on that side).
    left: dict[str, str] = {}
    right: dict[str, str] = {}
    context: set[str] = set()
    for text in items:
        seen: set[str] = set()
        for run in _HAN_RUN_RE.finditer(text):
            start, end = run.span()
            for i in range(start, end - 1):
                if text[i] in CJK_BOUNDARY:
                    continue
                for j in range(i + 2, min(i + 4, end) + 1):
                    if text[j - 1] in CJK_BOUNDARY:
                        continue
                    sub = text[i:j]
                    if sub not in seen:
                        seen.add(sub)
                        df[sub] = df.get(sub, 0) + 1
                    # Inlined (the hot loop): keep the one Han neighbour, or "" once there are two or an edge.
                    ch = text[i - 1] if i > start else ""
                    old = left.get(sub)
                    if old is None:
                        left[sub] = ch
                    elif old and old != ch:
                        left[sub] = ""
                    ch = text[j] if j < end else ""
                    old = right.get(sub)
                    if old is None:
                        right[sub] = ch
                    elif old and old != ch:
                        right[sub] = ""
                    if text[j:j + 2] in CJK_TITLES:
                        context.add(sub)
    accepted: dict[str, int] = {}
    for sub, count in df.items():
        if count < min_messages or sub in CJK_STOPWORDS or sub in CJK_ROLES:
            continue
        if left[sub] or right[sub]:
            continue  # always the same character on one side: a fragment (露西 of 露西亚)
        if _name_shape(sub) or _recurring_place(sub) or sub in context:
            accepted[sub] = count
    dropped = {
        sub for sub, count in accepted.items()
        if any(edge in _CJK_WEAK_EDGE and accepted.get(inner, 0) > count
               for inner, edge in ((sub[1:], sub[0]), (sub[:-1], sub[-1])))
    }
    ranked = sorted((name for name in accepted if name not in dropped), key=lambda n: (-accepted[n], n))
    return ranked[:max_names]


def _recurring_place(sub: str) -> bool:
    # A recurring two-character word may end in a weak suffix too (山门, 卫队, 港口) unless it is a motion.
    if _place_shape(sub):
        return True
    return (len(sub) == 2 and sub[-1] in CJK_PLACE_SUFFIXES_WEAK and sub[0] not in _CJK_NOT_PLACE_HEAD
            and sub not in CJK_STOPWORDS)


_RANK = {"known": 0, "quoted": 1, "name": 2}


def _overlaps(m: Mention, spans: list[tuple[int, int]]) -> bool:
    return any(m.start < e and s < m.end for s, e in spans)


def detect_names(text: str, known: Iterable[str] | KnownNames = ()) -> list[Mention]:
    """Names mentioned in ``text``, in text order, one per casefolded name (see the module docstring).

    >>> [m.name for m in detect_names("Hey Caroline, I met Zoë at Lake Tahoe!")]
    ['Caroline', 'Zoë', 'Lake Tahoe']

    Cost: linear in the text length (plus the candidates of each word/character in ``known``).
    """
    if not text:
        return []
    index = known if isinstance(known, KnownNames) else KnownNames(known)
    quoted = _quoted_mentions(text)
    known_hits = index.find(text) if len(index) else []
    # A known mention inside a longer known mention is a fragment of it (Mary in Mary Jane).
    kept_known: list[Mention] = []
    if known_hits:
        known_hits.sort(key=lambda m: (-(m.end - m.start), m.start))
        spans: list[tuple[int, int]] = []
        for m in known_hits:
            if not _overlaps(m, spans):
                kept_known.append(m)
                spans.append((m.start, m.end))
    capitals = _capitalised_mentions(text)
    cjk: list[Mention] = []
    if _HAN_RE.search(text):
        cjk, addressed = _cjk_mentions(text, index)
        # 苏师姐 read as the known 苏晚 is a known mention, unless a known name is written there already.
        spans = [(m.start, m.end) for m in kept_known]
        kept_known.extend(m for m in addressed if not _overlaps(m, spans))
    if quoted or kept_known or cjk:
        taken = [(m.start, m.end) for m in quoted] + [(m.start, m.end) for m in kept_known]
        names = [m for m in capitals + cjk if not _overlaps(m, taken)]
        merged = sorted(quoted + kept_known + names,
                        key=lambda m: (m.start, -(m.end - m.start), _RANK[m.kind]))
    else:
        merged = capitals  # already in text order, spans disjoint
    seen: set[str] = set()
    out: list[Mention] = []
    for m in merged:
        key = fold_name(m.name)
        if key and key not in seen:
            seen.add(key)
            out.append(m)
    return out
