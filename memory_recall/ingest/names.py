"""Name detection in chat text, without any model: the rules that turn a message into entity mentions.

:func:`detect_names` finds three kinds of mentions and returns them in text order, one per casefolded name:

``"name"`` — capitalised words (Latin script, accented letters included):
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

Chinese (and Japanese/Korean) text has no capitals: only the quoted and known rules apply to it.

Overlaps: every quoted mention is kept; a known mention is dropped when it overlaps a longer known
mention (``Mary`` inside ``Mary Jane``); a capitalised mention is dropped when it overlaps a quoted or known
one (``The Name`` inside ``"The Name of the Wind"``). Among identical casefolded names only the first
occurrence is reported. Output order: start offset, then longer span first.

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
    "NEVER_NAMES",
    "SENTENCE_STARTERS",
    "KnownNames",
    "Mention",
    "MentionKind",
    "detect_names",
    "fold_name",
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
    if quoted or kept_known:
        taken = [(m.start, m.end) for m in quoted] + [(m.start, m.end) for m in kept_known]
        capitals = [m for m in capitals if not _overlaps(m, taken)]
        merged = sorted(quoted + kept_known + capitals,
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
