"""Chat messages → memory graph, without any LLM. Every rule of message ingestion lives in this module.

The same rules apply whether messages come from the chat host, a fixture or a benchmark (LoCoMo).

Usage::

    report = ingest_messages(store, "chat-1", messages, now_ms=now)   # one store transaction
    edit_message(store, "chat-1", edited, now_ms=now)                 # same floor, new text
    delete_message(store, "chat-1", 7, now_ms=now)
    plan = plan_messages(messages, view, now_ms)                      # pure: what would be written

Rules
-----
**Which messages.** ``user`` and ``assistant`` messages are ingested. ``system`` messages are not: in the host
they are command output, notes and injected prompts (including this engine's own recall text), and ingesting
them would let recall feed on itself. A ``system`` message at a floor that holds an ingested message retires
it (as :func:`delete_message`). Hidden messages (``hidden=True``) *are* ingested, marked ``extra.hidden =
true``: hosts hide old messages to save context once memory covers them, which is exactly when recall must
still find them. Role and the hidden flag go to ``Node.extra``, not ``fields``, because every field is part of
the node's embedding and lexical text. ``ChatMessage.extra`` is not stored. Two messages with one floor in a
call raise :class:`~memory_recall.errors.InputError`.

**Message node** ``msg:<floor>`` (ids are per chat), type ``message``: ``fields = {speaker, summary,
participants, date}`` in that order, ``summary`` = the text plus ``" [image: <caption>]"`` per attachment,
``participants = [speaker]``, ``date`` only when given, and a blank speaker leaves ``speaker`` empty and
``participants`` empty; ``seq = floor``, ``seq_range = (floor, floor)``; ``created_time`` = ``send_time_ms``,
else the parsed ``date`` (:func:`parse_message_date`: LoCoMo's ``"1:56 pm on 8 May, 2023"`` and ISO 8601, UTC
when no zone is given), else the existing node's ``created_time``, else ``now_ms``; ``story_time.label`` = the
date string (source ``extract``); ``evidence = (evidence_id,)`` when given; ``importance`` 5 for every
message: without a model nothing ranks a turn's salience, and 5 is the reference default, so reinforcement and
scoring treat turns like any new node. ``prev_id``/``next_id`` link the active message nodes in floor order
(the temporal chain); an archived message node has neither.

**Character node** ``char:<key>`` per distinct speaker (``key`` below; speakers are matched on their NFKC
casefolded name, so ``Caroline`` and ``caroline`` are one character), ``fields = {name}``, spelled as first
seen. The first ``user`` speaker of a chat that has no persona yet is the user persona: ``fields.core_note =
"user persona"``. ``seq_range`` spans the first to the last floor the character spoke or was mentioned at (it
grows, it never shrinks). Edge ``character —involved_in→ message``, strength 0.6: speaking a turn ties a
character to it for sure but structurally (every turn of a speaker gets one), so it sits below the reference's
0.8 for extracted facts and above the 0.5 of a mere mention.

**Mentions.** :func:`~memory_recall.ingest.names.detect_names` runs on the summary (captions included) with
the known names: every speaker name, the first word of a multi-word speaker name when no other speaker shares
it, entity names that contain non-Latin characters (CJK has no capitals, so a name once quoted is found
unquoted afterwards), and the Han names the batch repeats (:func:`~memory_recall.ingest.names.recurring_names`).
Latin entity names are not passed as known names: their capitalised occurrences are found anyway, and
case-insensitive matching of learned words (``"Perfect"``, ``Art``) would turn every
lower-case use into a mention. A mention of a speaker (full name, or unique first name) links to the
character; any other name to an ``entity`` node ``ent:<key>`` with ``fields = {name, kind, aliases}``
(``kind`` ``"name"`` or ``"quoted"`` as first seen, ``aliases`` other spellings seen, at most 8). One edge
``message —related→ target`` of strength 0.5 per message–target pair (half the reference's 0.8: a name in a
turn is evidence of relevance, not an extracted relation), id ``e:<message id>><target id>``; a message's
mention of its own speaker adds nothing (``involved_in`` links them already). When a new speaker's name (or
unique first name) is an existing entity, the entity is taken over: its mention edges move to the character
and the entity is archived, so ingesting one message at a time ends in the same active graph as one batch.
Limits (no model): a name is only linked once the detector can see it, so a CJK name mentioned before its
speaker's first turn is found by a batch (which knows all its speakers first) but not by one-by-one ingestion,
and a Han name that nothing but repetition reveals (露西亚, 钟楼: no title, role word or quotes) is found when
one batch repeats it (the host's whole-chat sync), not message by message; nicknames (``Mel`` for ``Melanie``)
become entities of their own.

**Ids.** ``key`` = NFKC casefolded name, whitespace collapsed; characters that are not letters or digits
become ``-``; when that changed anything (or the key had to be cut so the node id stays ≤ 100 characters,
which keeps every edge id ≤ 128: one end of an ingest edge is always a message), ``-`` and 8 hex of the name's
SHA-1 are appended: ``New York`` → ``ent:new-york-<hash>``, ``林晚`` → ``char:林晚``.

**Edits and deletions.** Re-ingesting a floor recomputes its node and its edges: edges of this module
(``e:<from>><to>`` with the message at one end) that are no longer wanted get ``invalid_at = now_ms``, new
ones are added, retired ones that are wanted again are re-validated. Deleting a message archives its node and
invalidates *all* its active edges; the chain is relinked around it. A character or entity left without any
active edge is archived; one that gets an active edge again is restored.

**Idempotence and determinism.** Nodes and edges that would not change are not written; a call with nothing to
change writes nothing and does not bump the chat version. Re-ingested nodes keep what this module does not own
(``access_count``, ``last_access_time``, ``importance``, ``scope``, …): reinforcement survives edits. Same
messages, same graph and same ``now_ms`` → byte-identical nodes and edges; outputs are sorted by id and no set
or hash order reaches them.

**Cost.** Planning is linear in the batch plus the chat's character/entity nodes and its chain of message
nodes. :func:`ingest_messages` reads with :func:`load_view_targeted`: the character and entity nodes, the
planned message nodes, the edges around them (and one "lasting" edge per character/entity they touch instead of
all of a speaker's edges), any other node only when the plan looks it up, and the chain as ``(seq, id, prev,
next)`` tuples extracted by SQLite from the index column. So a one-message call parses O(touched) node and edge
JSON. On a :class:`~memory_recall.store.sqlite.Store` the per-chat reads (character/entity nodes, the name maps
planning derives from them, the chain) come from the store's ingest cache, exact at the chat's version and
carried across this process's own writes (another process's write makes the next event read them again), and
the chain is cut to a few links around the planned floors while its stored links are consistent; so a warm
one-message event costs O(touched nodes) plus pointer copies of the owner list (``scripts/bench_after_write.py``,
``ingest_ms``). The first event of a process on a chat, and the first after another process wrote it, read the
chain and owners in full (a scan of the chat's message rows in C). A batch of more than 200 messages reads the
whole chat once (cheaper than per-node reads). Everything is written in one transaction; new edges are built
without re-validation, the one hot-path shortcut.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import itertools
import operator
import re
import unicodedata
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from memory_recall.errors import InputError, NotFound
from memory_recall.ingest.names import KnownNames, detect_names, fold_name, recurring_names
from memory_recall.model.chat import ChatMessage
from memory_recall.model.graph import Edge, MemoryScope, Node, StoryTime, StoryTimeSpan

__all__ = [
    "MENTION_STRENGTH",
    "MESSAGE_IMPORTANCE",
    "PERSONA_NOTE",
    "SPEAKER_STRENGTH",
    "GraphView",
    "IngestPlan",
    "IngestReport",
    "character_id",
    "delete_message",
    "edge_id",
    "edit_message",
    "entity_id",
    "ingest_messages",
    "load_view",
    "load_view_targeted",
    "message_id",
    "parse_message_date",
    "plan_deletions",
    "plan_messages",
    "plan_sync",
    "remove_message",
    "swipe_message",
    "sync_messages",
]

#: ``character —involved_in→ message`` (see the module docstring for why 0.6).
SPEAKER_STRENGTH = 0.6
#: ``message —related→ entity/character`` for a name the message mentions.
MENTION_STRENGTH = 0.5
#: Importance of every ingested node (the reference default).
MESSAGE_IMPORTANCE = 5.0
PERSONA_NOTE = "user persona"
_MAX_ALIASES = 8
_MAX_NODE_ID = 100
_MAX_MILLIS = 253_402_300_799_999
_HASH_HEX = 8
# Enough edges_of() calls; past this many touched nodes one get_edges() read is cheaper.
_EDGE_READ_LIMIT = 200
_WS = re.compile(r"\s+")
# Shared default sub-models: frozen, so one instance serves every node/edge (building a MemoryScope runs its
# region normaliser, which dominated planning time when each node made its own).
_OBJECTIVE_DEFAULT_STORY = StoryTime()
_SCOPE = MemoryScope()
_SPAN = StoryTimeSpan()
_SHARED: dict[str, Any] = {"scope": _SCOPE, "story_time_span": _SPAN}


# ------------------------------------------------------------------------------------------------------------
# Ids and dates
# ------------------------------------------------------------------------------------------------------------


def message_id(floor: int) -> str:
    """Id of the message node of ``floor``."""
    return f"msg:{floor}"


def _key(prefix: str, name: str) -> str:
    folded = fold_name(name)
    clean = "".join(ch if ch.isalnum() else "-" for ch in folded)
    room = _MAX_NODE_ID - len(prefix)
    if clean == folded and len(clean) <= room:
        return prefix + clean
    digest = hashlib.sha1(folded.encode("utf-8")).hexdigest()[:_HASH_HEX]
    return f"{prefix}{clean[: room - _HASH_HEX - 1]}-{digest}"


def character_id(name: str) -> str:
    """Id of the character node of a speaker name (see "Ids" in the module docstring)."""
    return _key("char:", name)


def entity_id(name: str) -> str:
    """Id of the entity node of a mentioned name."""
    return _key("ent:", name)


def edge_id(from_id: str, to_id: str) -> str:
    """Id of an ingest edge: ``e:<from>><to>``."""
    return f"e:{from_id}>{to_id}"


_MONTHS = {
    m: i + 1
    for i, names in enumerate((
        ("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"), ("may",),
        ("june", "jun"), ("july", "jul"), ("august", "aug"), ("september", "sep", "sept"),
        ("october", "oct"), ("november", "nov"), ("december", "dec"),
    ))
    for m in names
}
# LoCoMo: "1:56 pm on 8 May, 2023" (the time part optional: "8 May, 2023").
_LOCOMO_DATE = re.compile(
    r"^(?:(\d{1,2}):(\d{2})\s*([ap])\.?m\.?\s+on\s+)?(\d{1,2})\s+([a-z]+)\.?,?\s+(\d{4})$", re.IGNORECASE
)


@functools.lru_cache(maxsize=4096)
def parse_message_date(date: str) -> int | None:
    """Milliseconds since the epoch of a message date, or ``None`` when it does not parse.

    Understands LoCoMo's ``"1:56 pm on 8 May, 2023"`` (and ``"8 May, 2023"``) and ISO 8601
    (``"2023-05-08"``, ``"2023-05-08T13:56:00+02:00"``); a date without a zone is UTC. Dates before 1970 do
    not parse (time stamps are unsigned). Results are cached (a chat repeats its session dates).

    >>> parse_message_date("1:56 pm on 8 May, 2023")
    1683554160000
    """
    text = _WS.sub(" ", date).strip()
    if not text:
        return None
    dt: datetime | None = None
    m = _LOCOMO_DATE.match(text)
    if m:
        month = _MONTHS.get(m.group(5).lower())
        if month is None:
            return None
        hour = minute = 0
        if m.group(1) is not None:
            hour, minute = int(m.group(1)), int(m.group(2))
            if not (1 <= hour <= 12 and minute < 60):
                return None
            hour = hour % 12 + (12 if m.group(3).lower() == "p" else 0)
        try:
            dt = datetime(int(m.group(6)), month, int(m.group(4)), hour, minute, tzinfo=UTC)
        except ValueError:
            return None
    else:
        try:
            dt = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
        except ValueError:
            return None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
    ms = int(dt.timestamp() * 1000)
    return ms if 0 <= ms <= _MAX_MILLIS else None


# ------------------------------------------------------------------------------------------------------------
# Plan and report
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GraphView:
    """The part of one chat's graph a plan is computed against.

    Contract (full view, ``chain`` unset): ``nodes`` holds every ``message``, ``character`` and ``entity`` node
    of the chat (other types may be present and are ignored); ``edges`` holds at least every edge touching the
    message nodes at the planned floors, the character/entity nodes at the other end of those edges, and the
    entities a new speaker takes over. :func:`load_view` reads exactly that. A view missing edges makes a plan
    miss retirements; it never makes a plan write an invalid graph.

    Targeted view (``chain`` set; what :func:`load_view_targeted` reads): ``chain`` holds ``(seq, id, prev_id,
    next_id)`` of every active message node sorted by ``(seq, id)``; ``nodes`` holds every ``character`` and
    ``entity`` node, and its lookups (``get``, ``[]``, ``in``) answer for any node id of the chat (a mapping that
    reads on demand); ``edges`` holds every edge touching the planned message nodes, the entities a new speaker
    takes over and the message nodes at their other ends, and, per character/entity at their other ends, the
    edge of :meth:`~memory_recall.store.sqlite.StoreReader.lasting_edge` (whether it keeps an active edge the
    plan does not touch). A plan on it equals the plan on the full view.

    Cut chain (``runs`` set, ``chain`` unset; what :func:`load_view_targeted` reads from a store whose stored
    chain links all agree with the ``(seq, id)`` order): ``runs`` holds ``(at_start, at_end, links)`` pieces of
    that chain around every planned message node's old and new position, each bounded by a node the plan does
    not touch (or by an end of the chain); relinking inside them equals relinking the whole chain. ``names``
    (optional, with ``nodes``) holds the name maps the planner would derive from every character/entity node.
    """

    nodes: Mapping[str, Node] = field(default_factory=dict)
    edges: Mapping[str, Edge] = field(default_factory=dict)
    chain: tuple[tuple[int, str, str | None, str | None], ...] | None = None
    runs: tuple[Any, ...] | None = None
    names: _NameMaps | None = None

    @classmethod
    def of(cls, nodes: Iterable[Node], edges: Iterable[Edge] = ()) -> GraphView:
        """A view over lists of nodes and edges (e.g. a :class:`~memory_recall.model.MemoryGraph`)."""
        return cls({n.id: n for n in nodes}, {e.id: e for e in edges})


@dataclass(frozen=True)
class IngestPlan:
    """Node and edge upserts (retirement is an upsert of an archived node / invalidated edge).

    ``nodes`` and ``edges`` are sorted by id; every id appears in exactly one of the added/updated/retired
    lists of its kind (each sorted). Nodes are written before edges, so every edge end exists.
    """

    nodes: tuple[Node, ...] = ()
    edges: tuple[Edge, ...] = ()
    added_nodes: tuple[str, ...] = ()
    updated_nodes: tuple[str, ...] = ()
    retired_nodes: tuple[str, ...] = ()
    added_edges: tuple[str, ...] = ()
    updated_edges: tuple[str, ...] = ()
    retired_edges: tuple[str, ...] = ()
    messages: int = 0
    skipped: int = 0

    @property
    def empty(self) -> bool:
        """True when the plan writes nothing."""
        return not self.nodes and not self.edges


@dataclass(frozen=True)
class IngestReport:
    """What one ingest call changed. ``version`` is the chat version afterwards (unchanged if nothing was
    written); ``messages`` counts the messages planned, ``skipped`` the ``system`` messages not ingested."""

    chat_id: str
    version: int
    nodes_added: int
    nodes_updated: int
    nodes_retired: int
    edges_added: int
    edges_updated: int
    edges_retired: int
    node_ids: tuple[str, ...]
    edge_ids: tuple[str, ...]
    messages: int = 0
    skipped: int = 0

    @classmethod
    def of(cls, chat_id: str, version: int, plan: IngestPlan) -> IngestReport:
        return cls(
            chat_id=chat_id,
            version=version,
            nodes_added=len(plan.added_nodes),
            nodes_updated=len(plan.updated_nodes),
            nodes_retired=len(plan.retired_nodes),
            edges_added=len(plan.added_edges),
            edges_updated=len(plan.updated_edges),
            edges_retired=len(plan.retired_edges),
            node_ids=tuple(n.id for n in plan.nodes),
            edge_ids=tuple(e.id for e in plan.edges),
            messages=plan.messages,
            skipped=plan.skipped,
        )


# ------------------------------------------------------------------------------------------------------------
# Planning
# ------------------------------------------------------------------------------------------------------------


def _clean_name(name: str) -> str:
    return _WS.sub(" ", unicodedata.normalize("NFKC", name)).strip()


def _is_ingest_edge(edge: Edge) -> bool:
    return edge.id == edge_id(edge.from_id, edge.to_id)


def _summary(message: ChatMessage) -> str:
    return message.text + "".join(f" [image: {c.strip()}]" for c in message.attachments if c.strip())


@dataclass(frozen=True)
class _NameMaps:
    """What planning derives from a chat's character and entity nodes (see :class:`_OwnerNames`).

    ``speakers``: folded name → id of the first (by id) ``char:`` character with a non-blank name;
    ``names_by_key``: folded name → clean spelling of the first ``char:`` character with a string name;
    ``any_speakers``: the folded names of every character node; ``persona_taken``: a ``char:`` character is the
    user persona; ``entities_non_latin``: names of active ``ent:`` entities without Latin capitals, by id;
    ``firsts``: :func:`_first_names` of ``speakers``; ``known``: the :class:`KnownNames` a plan starts from when
    its batch brings no new speaker (characters, unique first names, non-Latin entities, in the planner's order).
    """

    speakers: Mapping[str, str]
    names_by_key: Mapping[str, str]
    any_speakers: frozenset[str]
    persona_taken: bool
    entities_non_latin: tuple[str, ...]
    firsts: Mapping[str, str]
    known: KnownNames


_NO_FACTS: tuple[Any, ...] = (None, None, None, False, None)


def _owner_facts(nid: str, n: Node | None) -> tuple[Any, ...]:
    """``(speaker key, (name key, clean name), any-speaker key, persona, non-Latin entity name)`` of one node:
    the parts of the planner's name maps it contributes (``None``/``False`` where it contributes nothing)."""
    if n is None:
        return _NO_FACTS
    if n.type == "character":
        any_key = fold_name(str(n.fields.get("name", "")))
        if not nid.startswith("char:"):
            return (None, None, any_key, False, None)
        name = n.fields.get("name")
        persona = n.fields.get("core_note") == PERSONA_NOTE
        if not isinstance(name, str):
            return (None, None, any_key, persona, None)
        key = fold_name(name)
        return (key if name.strip() else None, (key, _clean_name(name)), any_key, persona, None)
    if n.type == "entity" and nid.startswith("ent:") and not n.archived:
        name = n.fields.get("name")
        if isinstance(name, str) and _non_latin(name):
            return (None, None, None, False, name)
    return _NO_FACTS


class _OwnerNames:
    """The planner's name maps over a chat's character/entity nodes, kept up to date node by node (the store's
    ingest cache calls :meth:`update` for each written owner node), so an event does not loop over every owner.
    :meth:`snapshot` is rebuilt only after a change that alters a name map (a new speaker, a new non-Latin
    entity), not after the floor-range updates every event makes."""

    def __init__(self, nodes: Iterable[Node]) -> None:
        self._speaker_ids: dict[str, list[str]] = {}
        self._name_ids: dict[str, list[tuple[str, str]]] = {}
        self._any: dict[str, int] = {}
        self._persona = 0
        self._non_latin: dict[str, str] = {}
        self._non_latin_ids: list[str] = []
        self._snap: _NameMaps | None = None
        for n in nodes:
            self._add(n.id, _owner_facts(n.id, n))

    def update(self, node_id: str, old: Node | None, new: Node | None) -> None:
        """One owner node changed (``None``: absent)."""
        before, after = _owner_facts(node_id, old), _owner_facts(node_id, new)
        if before == after:
            return
        self._remove(node_id, before)
        self._add(node_id, after)
        self._snap = None

    def _add(self, nid: str, facts: tuple[Any, ...]) -> None:
        speaker, name_key, any_key, persona, non_latin = facts
        if speaker is not None:
            bisect.insort(self._speaker_ids.setdefault(speaker, []), nid)
        if name_key is not None:
            bisect.insort(self._name_ids.setdefault(name_key[0], []), (nid, name_key[1]))
        if any_key is not None:
            self._any[any_key] = self._any.get(any_key, 0) + 1
        self._persona += persona
        if non_latin is not None:
            self._non_latin[nid] = non_latin
            bisect.insort(self._non_latin_ids, nid)

    def _remove(self, nid: str, facts: tuple[Any, ...]) -> None:
        speaker, name_key, any_key, persona, non_latin = facts
        if speaker is not None:
            ids = self._speaker_ids[speaker]
            ids.remove(nid)
            if not ids:
                del self._speaker_ids[speaker]
        if name_key is not None:
            pairs = self._name_ids[name_key[0]]
            pairs.remove((nid, name_key[1]))
            if not pairs:
                del self._name_ids[name_key[0]]
        if any_key is not None:
            self._any[any_key] -= 1
            if not self._any[any_key]:
                del self._any[any_key]
        self._persona -= persona
        if non_latin is not None:
            del self._non_latin[nid]
            self._non_latin_ids.remove(nid)

    def snapshot(self) -> _NameMaps:
        """The current maps (one object until the next change of a name map; planners copy what they mutate)."""
        if self._snap is None:
            # In id order, as the planner's setdefault over sorted node ids builds them.
            speakers = {key: ids[0] for key, ids in sorted(self._speaker_ids.items(), key=lambda kv: kv[1][0])}
            names_by_key = {key: pairs[0][1]
                            for key, pairs in sorted(self._name_ids.items(), key=lambda kv: kv[1][0][0])}
            non_latin = tuple(self._non_latin[nid] for nid in self._non_latin_ids)
            firsts = _first_names(speakers)
            self._snap = _NameMaps(speakers, names_by_key, frozenset(self._any), self._persona > 0, non_latin,
                                   firsts, _base_known(names_by_key, firsts, non_latin))
        return self._snap


def _base_known(names_by_key: Mapping[str, str], firsts: Mapping[str, str],
                non_latin: Iterable[str]) -> KnownNames:
    """The known names every plan starts from: character names by folded name, unique first names, non-Latin
    entity names (in that order: the first spelling of a name is the one reported)."""
    known = KnownNames()
    for key in sorted(names_by_key):
        known.add(names_by_key[key])
    for first in sorted(firsts):
        full_name = names_by_key.get(firsts[first], firsts[first])
        known.add(full_name.split(" ")[0])
    for name in non_latin:
        known.add(name)
    return known


class _Planner:
    """Working state of one plan: current nodes/edges, their changes, and the name maps."""

    def __init__(self, view: GraphView | None, now_ms: int) -> None:
        if isinstance(now_ms, bool) or not isinstance(now_ms, int) or not 0 <= now_ms <= _MAX_MILLIS:
            raise InputError("now_ms", f"must be a non-negative int of milliseconds; got {now_ms!r}")
        self.now = now_ms
        view = view or GraphView()
        self.before_nodes: Mapping[str, Node] = view.nodes
        self.before_edges: Mapping[str, Edge] = view.edges
        self.chain = view.chain
        self.runs = view.runs
        self.names = view.names
        self.nodes: dict[str, Node] = {}
        self.edges: dict[str, Edge] = {}
        self.adj: dict[str, list[str]] = {}
        for eid in sorted(view.edges):
            e = view.edges[eid]
            self.adj.setdefault(e.from_id, []).append(eid)
            self.adj.setdefault(e.to_id, []).append(eid)
        # Character and entity name maps (folded name → id); characters by every name they answer to.
        self.speakers: dict[str, str] = {}
        self.entities_non_latin: list[str] = []
        self.persona_taken = False
        if view.names is not None:
            self.speakers = dict(view.names.speakers)
            self.entities_non_latin = list(view.names.entities_non_latin)
            self.persona_taken = view.names.persona_taken
        for nid in sorted(view.nodes) if view.names is None else ():
            n = view.nodes[nid]
            if n.type == "character" and nid.startswith("char:"):
                name = n.fields.get("name")
                if isinstance(name, str) and name.strip():
                    self.speakers.setdefault(fold_name(name), nid)
                if n.fields.get("core_note") == PERSONA_NOTE:
                    self.persona_taken = True
            elif n.type == "entity" and nid.startswith("ent:") and not n.archived:
                name = n.fields.get("name")
                if isinstance(name, str) and _non_latin(name):
                    self.entities_non_latin.append(name)
        self.touched_owners: set[str] = set()  # characters/entities whose edges changed (orphan check)

    # -- current state -------------------------------------------------------------------------------------

    def node(self, nid: str) -> Node | None:
        return self.nodes.get(nid) or self.before_nodes.get(nid)

    def edge(self, eid: str) -> Edge | None:
        return self.edges.get(eid) or self.before_edges.get(eid)

    def edges_at(self, nid: str) -> list[str]:
        return self.adj.get(nid, [])

    def put_node(self, node: Node) -> None:
        self.nodes[node.id] = node

    def put_edge(self, edge: Edge) -> None:
        if edge.id not in self.before_edges and edge.id not in self.edges:
            self.adj.setdefault(edge.from_id, []).append(edge.id)
            self.adj.setdefault(edge.to_id, []).append(edge.id)
        self.edges[edge.id] = edge

    # -- edges ---------------------------------------------------------------------------------------------

    def want_edge(self, from_id: str, to_id: str, relation: str, strength: float) -> str:
        eid = edge_id(from_id, to_id)
        old = self.edge(eid)
        if old is None:
            # Built without re-validation (the hot path of a bulk ingest): both ends are node ids this module
            # made or read from the store, one of them a message id, so the edge id stays within 128
            # characters; relation and strength are module constants; ``now`` was checked by the planner.
            self.put_edge(Edge.model_construct(
                id=eid, from_id=from_id, to_id=to_id, relation=relation, strength=strength, edge_type=0,
                valid_at=None, invalid_at=None, expired_at=None, created_time=self.now, updated_at=self.now,
                scope=_SCOPE, extra={},
            ))
        elif (old.relation, old.strength, old.invalid_at, old.expired_at) != (relation, strength, None, None):
            self.put_edge(old.model_copy(update={
                "relation": relation, "strength": strength, "invalid_at": None, "expired_at": None,
                "updated_at": self.now,
            }))
        return eid

    def retire_edge(self, eid: str) -> None:
        old = self.edge(eid)
        if old is not None and old.invalid_at is None:
            self.put_edge(old.model_copy(update={"invalid_at": self.now, "updated_at": self.now}))
            for end in (old.from_id, old.to_id):
                if end.startswith(("char:", "ent:")):
                    self.touched_owners.add(end)

    # -- owners (characters and entities) ------------------------------------------------------------------

    def touch_owner(self, nid: str, floor: int, make: Any) -> None:
        """Create the character/entity ``nid`` (via ``make()``) or extend its floor range and restore it."""
        old = self.node(nid)
        if old is None:
            self.put_node(make())
            return
        start, end = old.seq_range if old.seq_range is not None else (floor, floor)
        rng = (min(start, floor), max(end, floor))
        if rng != old.seq_range or old.seq != rng[0] or old.archived:
            self.put_node(old.model_copy(update={
                "seq": rng[0], "seq_range": rng, "archived": False, "updated_at": self.now,
            }))

    def add_alias(self, nid: str, surface: str) -> None:
        node = self.node(nid)
        if node is None or node.type != "entity":
            return
        name = node.fields.get("name", "")
        aliases = list(node.fields.get("aliases") or [])
        if surface == name or surface in aliases or len(aliases) >= _MAX_ALIASES:
            return
        fields = dict(node.fields)
        fields["aliases"] = [*aliases, surface]
        self.put_node(node.model_copy(update={"fields": fields, "updated_at": self.now}))

    # -- results -------------------------------------------------------------------------------------------

    def plan(self, messages: int, skipped: int) -> IngestPlan:
        nodes: list[Node] = []
        added, updated, retired = [], [], []
        for nid in sorted(self.nodes):
            new = self.nodes[nid]
            old = self.before_nodes.get(nid)
            if old is not None and _same_node(old, new):
                continue
            nodes.append(new)
            if old is None:
                added.append(nid)
            elif new.archived and not old.archived:
                retired.append(nid)
            else:
                updated.append(nid)
        edges: list[Edge] = []
        e_added, e_updated, e_retired = [], [], []
        for eid in sorted(self.edges):
            new_e = self.edges[eid]
            old_e = self.before_edges.get(eid)
            if old_e is not None and _same_edge(old_e, new_e):
                continue
            edges.append(new_e)
            if old_e is None:
                e_added.append(eid)
            elif new_e.invalid_at is not None and old_e.invalid_at is None:
                e_retired.append(eid)
            else:
                e_updated.append(eid)
        return IngestPlan(
            nodes=tuple(nodes), edges=tuple(edges),
            added_nodes=tuple(added), updated_nodes=tuple(updated), retired_nodes=tuple(retired),
            added_edges=tuple(e_added), updated_edges=tuple(e_updated), retired_edges=tuple(e_retired),
            messages=messages, skipped=skipped,
        )


def _same_node(a: Node, b: Node) -> bool:
    return a.model_copy(update={"updated_at": 0}) == b.model_copy(update={"updated_at": 0})


def _same_edge(a: Edge, b: Edge) -> bool:
    return a.model_copy(update={"updated_at": 0}) == b.model_copy(update={"updated_at": 0})


def _non_latin(name: str) -> bool:
    # Names the capitalisation rule cannot find (no Latin capital letters): CJK and other caseless scripts.
    return not any(("A" <= ch <= "Z") or ("\u00c0" <= ch <= "\u024f" and ch.isupper()) for ch in name)


def _first_names(full_names: Collection[str]) -> dict[str, str]:
    """Folded first word → folded full name, for multi-word names whose first word no other name shares."""
    firsts: dict[str, list[str]] = {}
    for full in sorted(set(full_names)):
        parts = full.split(" ")
        if len(parts) > 1:
            firsts.setdefault(parts[0], []).append(full)
    return {first: fulls[0] for first, fulls in firsts.items() if len(fulls) == 1 and first not in full_names}


def _check_floors(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    seen: dict[int, int] = {}
    for i, m in enumerate(messages):
        if not isinstance(m, ChatMessage):
            raise InputError(f"messages[{i}]", f"must be a ChatMessage, got {type(m).__name__}")
        if m.send_time_ms is not None and m.send_time_ms > _MAX_MILLIS:
            raise InputError(f"messages[{i}].send_time_ms", f"must be at most {_MAX_MILLIS} (year 9999)")
        if m.floor in seen:
            raise InputError(f"messages[{i}].floor", f"floor {m.floor} repeats messages[{seen[m.floor]}]")
        seen[m.floor] = i
    return sorted(messages, key=lambda m: m.floor)


def plan_messages(
    messages: Sequence[ChatMessage], existing: GraphView | None, now_ms: int
) -> IngestPlan:
    """The node and edge upserts that ingest ``messages`` into the graph ``existing`` (pure; module rules).

    Cost: O(batch text + message/character/entity nodes of the chat).
    """
    ordered = _check_floors(messages)
    p = _Planner(existing, now_ms)
    keep = [m for m in ordered if m.role != "system"]
    drop = [m.floor for m in ordered if m.role == "system"]
    _plan_upserts(p, keep)
    _plan_retirements(p, drop)
    _relink_chain(p)
    _archive_orphans(p)
    return p.plan(messages=len(keep), skipped=len(drop))


def plan_deletions(floors: Iterable[int], existing: GraphView | None, now_ms: int) -> IngestPlan:
    """The upserts that delete the message nodes of ``floors`` (archive, invalidate edges, relink chain)."""
    p = _Planner(existing, now_ms)
    _plan_retirements(p, sorted(set(floors)))
    _relink_chain(p)
    _archive_orphans(p)
    return p.plan(messages=0, skipped=0)


def _plan_upserts(p: _Planner, messages: list[ChatMessage]) -> None:
    if not messages:
        return
    # Speakers of the batch join the known speakers first, so a name mentioned before its speaker's first turn
    # links to the character in a batch exactly as the take-over does in one-by-one ingestion.
    batch_speakers: dict[str, str] = {}
    for m in messages:
        name = _clean_name(m.speaker)
        if name:
            batch_speakers.setdefault(fold_name(name), name)
    new_speakers = {k: v for k, v in batch_speakers.items() if k not in p.speakers}
    for key, name in new_speakers.items():
        p.speakers[key] = character_id(name)
    if p.names is not None and not new_speakers:
        # The stored speakers only: the known names are those every such plan starts from.
        firsts: Mapping[str, str] = p.names.firsts
        known = p.names.known.copy()
    else:
        firsts = _first_names(p.speakers)
        names_by_key: dict[str, str] = {}
        if p.names is not None:
            names_by_key.update(p.names.names_by_key)
        else:
            for nid in sorted(p.before_nodes):
                n = p.before_nodes[nid]
                if n.type == "character" and nid.startswith("char:") and isinstance(n.fields.get("name"), str):
                    names_by_key.setdefault(fold_name(n.fields["name"]), _clean_name(n.fields["name"]))
        for key, name in batch_speakers.items():
            names_by_key.setdefault(key, name)
        known = _base_known(names_by_key, firsts, p.entities_non_latin)
    target_of: dict[str, str] = dict(p.speakers)
    for first, full in firsts.items():
        target_of.setdefault(first, p.speakers[full])
    # Han names the batch keeps repeating (no capitals to find them by); once they are entities, later one-message
    # ingests know them as non-Latin entity names.
    for name in recurring_names(_summary(m) for m in messages):
        known.add(name)

    persona_floor = None
    if not p.persona_taken:
        persona_floor = next((m.floor for m in messages if m.role == "user" and _clean_name(m.speaker)), None)
    # Characters first (at the floor of their first turn), so a mention earlier in the batch can link to them.
    for m in messages:
        speaker = _clean_name(m.speaker)
        if speaker:
            p.touch_owner(p.speakers[fold_name(speaker)], m.floor,
                          _character_maker(p, speaker, m, persona=m.floor == persona_floor))
    _take_over_entities(p, new_speakers, firsts)

    for m in messages:
        mid = message_id(m.floor)
        speaker = _clean_name(m.speaker)
        summary = _summary(m)
        wanted: set[str] = set()
        speaker_id = p.speakers[fold_name(speaker)] if speaker else ""
        created = _created(m, p)
        _put_message(p, m, mid, speaker, summary, created)
        if speaker_id:
            wanted.add(p.want_edge(speaker_id, mid, "involved_in", SPEAKER_STRENGTH))
        for mention in detect_names(summary, known):
            key = fold_name(mention.name)
            target = target_of.get(key)
            if target is None:
                target = entity_id(mention.name)
                kind = "quoted" if mention.kind == "quoted" else "name"
                surface = _clean_name(mention.name)

                def make_entity(eid: str = target, name: str = surface, kind: str = kind,
                                floor: int = m.floor, when: int = created) -> Node:
                    return Node(id=eid, type="entity", fields={"name": name, "kind": kind, "aliases": []},
                                seq=floor, seq_range=(floor, floor), importance=MESSAGE_IMPORTANCE,
                                created_time=when, last_access_time=when, updated_at=p.now,
                                story_time=_OBJECTIVE_DEFAULT_STORY, **_SHARED)

                existed = p.node(target) is not None
                p.touch_owner(target, m.floor, make_entity)
                if existed:
                    p.add_alias(target, surface)
                elif _non_latin(surface):
                    known.add(surface)
            elif target != speaker_id:
                p.touch_owner(target, m.floor, _character_maker(p, mention.name, m, cid=target))
            if target == speaker_id:
                continue
            wanted.add(p.want_edge(mid, target, "related", MENTION_STRENGTH))
        # Ingest edges of this message that are no longer wanted (text edited, speaker changed).
        for eid in list(p.edges_at(mid)):
            e = p.edge(eid)
            if e is not None and eid not in wanted and _is_ingest_edge(e):
                p.retire_edge(eid)


def _character_maker(p: _Planner, name: str, m: ChatMessage, *, persona: bool = False, cid: str = "") -> Any:
    def make() -> Node:
        fields: dict[str, Any] = {"name": name}
        if persona:
            fields["core_note"] = PERSONA_NOTE
        when = _created(m, p)
        return Node(id=cid or character_id(name), type="character", fields=fields, seq=m.floor,
                    seq_range=(m.floor, m.floor), importance=MESSAGE_IMPORTANCE, created_time=when,
                    last_access_time=when, updated_at=p.now, story_time=_OBJECTIVE_DEFAULT_STORY, **_SHARED)

    return make


def _created(m: ChatMessage, p: _Planner) -> int:
    if m.send_time_ms is not None:
        return m.send_time_ms
    if m.date:
        parsed = parse_message_date(m.date)
        if parsed is not None:
            return parsed
    old = p.node(message_id(m.floor))
    return old.created_time if old is not None else p.now


def _put_message(p: _Planner, m: ChatMessage, mid: str, speaker: str, summary: str, created: int) -> None:
    fields: dict[str, Any] = {
        "speaker": speaker, "summary": summary, "participants": [speaker] if speaker else [],
    }
    if m.date:
        fields["date"] = m.date
    extra: dict[str, Any] = {"role": m.role}
    if m.hidden:
        extra["hidden"] = True
    story = StoryTime(label=m.date, source="extract") if m.date else _OBJECTIVE_DEFAULT_STORY
    owned: dict[str, Any] = {
        "type": "message", "fields": fields, "seq": m.floor, "seq_range": (m.floor, m.floor),
        "archived": False, "created_time": created, "story_time": story,
        "evidence": (m.evidence_id,) if m.evidence_id else (), "extra": extra,
    }
    old = p.node(mid)
    if old is None:
        p.put_node(Node(id=mid, importance=MESSAGE_IMPORTANCE, last_access_time=owned["created_time"],
                        updated_at=p.now, **owned, **_SHARED))
        return
    new = old.model_copy(update=owned)
    if not _same_node(old, new):
        p.put_node(new.model_copy(update={"updated_at": p.now}))


def _take_over_entities(p: _Planner, new_speakers: Mapping[str, str], firsts: Mapping[str, str]) -> None:
    """A new speaker whose name (or unique first name) is an active entity takes over its mention edges."""
    for key in sorted(new_speakers):
        char = p.speakers[key]
        candidates = [entity_id(new_speakers[key])]
        first = key.split(" ")[0]
        if firsts.get(first) == key:
            candidates.append(entity_id(first))
        for ent in candidates:
            node = p.node(ent)
            if node is None or node.archived or node.type != "entity":
                continue
            for eid in list(p.edges_at(ent)):
                e = p.edge(eid)
                if e is None or not _is_ingest_edge(e) or not e.active(p.now) or e.invalid_at is not None:
                    continue
                p.retire_edge(eid)
                msg = e.from_id if e.to_id == ent else e.to_id
                msg_node = p.node(msg)
                if msg_node is None or msg_node.type != "message":
                    continue
                if fold_name(str(msg_node.fields.get("speaker", ""))) == key:
                    continue
                p.want_edge(msg, char, "related", MENTION_STRENGTH)
                p.touch_owner(char, msg_node.seq, lambda: None)


def _plan_retirements(p: _Planner, floors: Iterable[int]) -> None:
    for floor in floors:
        mid = message_id(floor)
        old = p.node(mid)
        if old is None or old.type != "message" or old.archived:
            continue
        p.put_node(old.model_copy(update={"archived": True, "prev_id": None, "next_id": None,
                                          "updated_at": p.now}))
        for eid in list(p.edges_at(mid)):
            p.retire_edge(eid)


def _relink_chain(p: _Planner) -> None:
    if p.runs is not None:
        _relink_runs(p, p.runs)
        return
    if p.chain is not None:
        _relink_stored_chain(p, p.chain)
        return
    ids = set(p.before_nodes) | set(p.nodes)
    active: list[tuple[int, str]] = []
    for nid in ids:
        n = p.node(nid)
        if n is not None and n.type == "message" and not n.archived:
            active.append((n.seq, nid))
    active.sort()
    for i, (_, nid) in enumerate(active):
        prev_id = active[i - 1][1] if i > 0 else None
        next_id = active[i + 1][1] if i + 1 < len(active) else None
        n = p.node(nid)
        assert n is not None
        if n.prev_id != prev_id or n.next_id != next_id:
            p.put_node(n.model_copy(update={"prev_id": prev_id, "next_id": next_id, "updated_at": p.now}))


def _relink_stored_chain(p: _Planner, chain: Sequence[tuple[int, str, str | None, str | None]]) -> None:
    """:func:`_relink_chain` on a targeted view: the stored chain with the plan's node changes laid over it.

    Same result as relinking every message node (stored links that disagree with the ``(seq, id)`` order are
    repaired wherever they are); only nodes whose links change are read in full. The per-node work runs in C
    (``zip``/``map``/``compress``), the Python loops are over the changed nodes only.
    """
    seqs, ids0, prevs0, nexts0 = zip(*chain, strict=True) if chain else ((), (), (), ())
    links: dict[str, tuple[str | None, str | None]] = dict(zip(ids0, zip(prevs0, nexts0, strict=True), strict=True))
    seq_of = dict(zip(ids0, seqs, strict=True))
    order = list(zip(seqs, ids0, strict=True))
    for nid in sorted(p.nodes):
        cur = p.nodes[nid]
        if nid in links:
            del order[bisect.bisect_left(order, (seq_of[nid], nid))]
            del links[nid]
        if cur.type == "message" and not cur.archived:
            bisect.insort(order, (cur.seq, nid))
            links[nid] = (cur.prev_id, cur.next_id)
    if not order:
        return
    ids: list[str] = list(map(operator.itemgetter(1), order))
    prevs: list[str | None] = [None, *ids[:-1]]
    nexts: list[str | None] = [*ids[1:], None]
    wanted = list(zip(prevs, nexts, strict=True))
    stale = itertools.compress(range(len(ids)), map(operator.ne, map(links.__getitem__, ids), wanted))
    for i in stale:
        n = p.node(ids[i])
        assert n is not None
        p.put_node(n.model_copy(update={"prev_id": prevs[i], "next_id": nexts[i], "updated_at": p.now}))


def _relink_runs(p: _Planner, runs: Sequence[Any]) -> None:
    """:func:`_relink_chain` on a cut chain (``GraphView.runs``): the stored links agree with the order outside
    the runs, so relinking each run (its outer ends kept) equals relinking the whole chain. O(changed nodes)."""
    changed = sorted(p.nodes)
    placed: set[str] = set()
    for at_start, at_end, items in runs:
        order = [(seq, nid) for seq, nid, _, _ in items]
        links = {nid: (prev, nxt) for _, nid, prev, nxt in items}
        # Outside an inner run's ends nothing changes: a changed node belongs to the run it falls strictly inside.
        low = None if at_start or not order else order[0]
        high = None if at_end or not order else order[-1]
        outer = (None if at_start or not items else items[0][2], None if at_end or not items else items[-1][3])
        for nid in changed:
            cur = p.nodes[nid]
            if nid in links:
                order.remove(next(k for k in order if k[1] == nid))
                del links[nid]
            if cur.type == "message" and not cur.archived:
                key = (cur.seq, nid)
                if (low is None or key > low) and (high is None or key < high):
                    bisect.insort(order, key)
                    links[nid] = (cur.prev_id, cur.next_id)
                    placed.add(nid)
        if not order:
            continue
        ids = [nid for _, nid in order]
        prevs: list[str | None] = [outer[0], *ids[:-1]]
        nexts: list[str | None] = [*ids[1:], outer[1]]
        for i, nid in enumerate(ids):
            if links[nid] != (prevs[i], nexts[i]):
                n = p.node(nid)
                assert n is not None
                p.put_node(n.model_copy(update={"prev_id": prevs[i], "next_id": nexts[i], "updated_at": p.now}))
    lost = [nid for nid in changed if nid not in placed and p.nodes[nid].type == "message"
            and not p.nodes[nid].archived]
    if lost:
        raise AssertionError(f"cut chain misses the planned message nodes {lost}")


def _archive_orphans(p: _Planner) -> None:
    for nid in sorted(p.touched_owners):
        n = p.node(nid)
        if n is None or n.archived:
            continue
        if any((e := p.edge(eid)) is not None and e.invalid_at is None and e.active(p.now)
               for eid in p.edges_at(nid)):
            continue
        p.put_node(n.model_copy(update={"archived": True, "updated_at": p.now}))


# ------------------------------------------------------------------------------------------------------------
# Store side
# ------------------------------------------------------------------------------------------------------------


class _Reader(Protocol):
    def get_nodes(self, chat_id: str, ids: Iterable[str] | None = None) -> list[Node]: ...
    def get_edges(self, chat_id: str) -> list[Edge]: ...
    def edges_of(self, chat_id: str, node_id: str) -> list[Edge]: ...
    def chat_version(self, chat_id: str) -> int: ...


def load_view(reader: _Reader, chat_id: str, messages: Sequence[ChatMessage] = (),
              floors: Iterable[int] = ()) -> GraphView:
    """Read what planning ``messages`` (and deleting ``floors``) needs: every node of the chat, and the edges
    around the touched message nodes, their characters/entities and the entities new speakers take over.

    The whole-chat read (O(chat) node JSON): the reference :func:`load_view_targeted` is checked against, and
    its fallback for bulk batches."""
    nodes = {n.id: n for n in reader.get_nodes(chat_id)}
    touched = [message_id(m.floor) for m in messages] + [message_id(f) for f in floors]
    seeds = [mid for mid in dict.fromkeys(touched) if mid in nodes]
    speakers = {fold_name(str(n.fields.get("name", ""))) for n in nodes.values() if n.type == "character"}
    seeds.extend(_unknown_speaker_entities(messages, speakers, nodes))
    if not seeds:
        return GraphView(nodes, {})
    if len(seeds) > _EDGE_READ_LIMIT:
        return GraphView(nodes, {e.id: e for e in reader.get_edges(chat_id)})
    edges: dict[str, Edge] = {}
    done: set[str] = set()
    frontier = list(dict.fromkeys(seeds))
    # Two rings: the seeds' edges, then the edges of the characters/entities (and messages) at their ends.
    for ring in range(2):
        nxt: list[str] = []
        for nid in frontier:
            if nid in done:
                continue
            done.add(nid)
            for e in reader.edges_of(chat_id, nid):
                edges[e.id] = e
                other = e.to_id if e.from_id == nid else e.from_id
                if ring == 0 and other not in done:
                    nxt.append(other)
        frontier = list(dict.fromkeys(nxt))
        if len(done) + len(frontier) > _EDGE_READ_LIMIT:
            return GraphView(nodes, {e.id: e for e in reader.get_edges(chat_id)})
    return GraphView(nodes, edges)


class _TargetedReader(_Reader, Protocol):
    def get_node(self, chat_id: str, node_id: str) -> Node | None: ...
    def get_nodes_by_type(self, chat_id: str, types: Iterable[str]) -> list[Node]: ...
    def message_chain(self, chat_id: str) -> list[tuple[int, str, str | None, str | None]]: ...
    def lasting_edge(self, chat_id: str, node_id: str, exclude_ends: Iterable[str] = ()) -> Edge | None: ...


class _NodesOnDemand(Mapping[str, Node]):
    """Nodes read so far, plus any other node of the chat read when first looked up (and remembered, absent
    ones too). Iteration yields the nodes read so far only: the planner iterates for characters and entities,
    which :func:`load_view_targeted` reads up front."""

    def __init__(self, reader: _TargetedReader, chat_id: str, known: dict[str, Node], nodes: Iterable[Node]) -> None:
        """``known``: nodes by id, taken over (added to here); ``nodes``: more, added after them. A warm event
        passes every owner node of the chat (thousands on a large chat) as the store's ingest cache holds them,
        so nothing here loops over them."""
        self._reader = reader
        self._chat_id = chat_id
        self._known: dict[str, Node | None] = known  # type: ignore[assignment]  # absent ids are added as None
        self.remember(nodes)

    def remember(self, nodes: Iterable[Node]) -> None:
        """Add nodes read elsewhere (in the same read transaction)."""
        for n in nodes:
            self._known[n.id] = n

    def get(self, key: str, default: Any = None) -> Any:
        if key not in self._known:
            self._known[key] = self._reader.get_node(self._chat_id, key)
        node = self._known[key]
        return default if node is None else node

    def __getitem__(self, key: str) -> Node:
        node = self.get(key)
        if node is None:
            raise KeyError(key)
        return node

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def __iter__(self) -> Any:
        return iter([k for k, v in self._known.items() if v is not None])

    def __len__(self) -> int:
        return sum(1 for v in self._known.values() if v is not None)


def load_view_targeted(reader: Any, chat_id: str, messages: Sequence[ChatMessage] = (),
                       floors: Iterable[int] = (), *, full_chain: bool = False) -> GraphView:
    """What planning ``messages`` (and deleting ``floors``) needs, read in O(touched nodes) rather than O(chat).

    Reads the chat's character and entity nodes, the planned message nodes, the stored message chain (one
    index column, no node JSON), the edges around the planned messages and taken-over entities and around the
    message nodes at their other ends, and one :meth:`lasting_edge` per character/entity at their other ends;
    any other node is read when the plan looks it up. The plan on this view equals the plan on
    :func:`load_view` (see :class:`GraphView`). Falls back to :func:`load_view` when ``reader`` lacks the
    targeted reads or more than ``_EDGE_READ_LIMIT`` nodes are touched (a bulk batch: one full read is cheaper).

    With a store reader that has ``ingest_base`` (:class:`~memory_recall.store.sqlite.Store`), the owner nodes,
    the name maps derived from them and the chain come from the store's per-chat ingest cache (exact: see
    :class:`~memory_recall.store.sqlite.IngestCache`), and the chain is cut to the runs around the planned
    message nodes when its stored links are consistent (``full_chain=True``: always the whole chain, as
    :func:`plan_sync` needs). Then one event costs O(touched nodes), not O(chat).
    """
    if not all(hasattr(reader, a) for a in ("get_node", "get_nodes_by_type", "message_chain", "lasting_edge")):
        return load_view(reader, chat_id, messages, floors)
    floors = list(floors)
    touched = list(dict.fromkeys([message_id(m.floor) for m in messages] + [message_id(f) for f in floors]))
    if len(touched) > _EDGE_READ_LIMIT:
        return load_view(reader, chat_id, messages, floors)
    planned = reader.get_nodes(chat_id, touched)
    names: _NameMaps | None = None
    runs: tuple[Any, ...] | None = None
    if hasattr(reader, "ingest_base"):
        # Where the planned message nodes are (their stored keys) and will be (their floors).
        anchors = [(m.floor, message_id(m.floor)) for m in messages] + [(f, message_id(f)) for f in floors]
        anchors += [(n.seq, n.id) for n in planned if n.type == "message"]
        base = reader.ingest_base(chat_id, anchors, derive=_OwnerNames)
        owners = base.owners
        names = base.derived
        assert names is not None
        speakers: Collection[str] = names.any_speakers
        if base.runs is not None and not full_chain:
            runs = tuple((r.at_start, r.at_end, r.links) for r in base.runs)
            chain = None
        else:
            chain = base.chain if base.chain is not None else tuple(reader.message_chain(chat_id))
    else:
        listed = reader.get_nodes_by_type(chat_id, ("character", "entity"))
        speakers = {fold_name(str(n.fields.get("name", ""))) for n in listed if n.type == "character"}
        owners = dict(zip(map(operator.attrgetter("id"), listed), listed, strict=True))
        chain = None
    nodes = _NodesOnDemand(reader, chat_id, owners, planned)
    seeds = [mid for mid in touched if mid in nodes]
    # As load_view: speakers known by any character node, candidates by any node of the id.
    seeds.extend(_unknown_speaker_entities(messages, speakers, nodes))
    seeds = list(dict.fromkeys(seeds))
    edges: dict[str, Edge] = {}
    ring: list[str] = []
    for nid in seeds:
        for e in reader.edges_of(chat_id, nid):
            edges[e.id] = e
            ring.append(e.to_id if e.from_id == nid else e.from_id)
    seed_set = set(seeds)
    ring = [nid for nid in dict.fromkeys(ring) if nid not in seed_set]
    if len(seeds) + len(ring) > _EDGE_READ_LIMIT:
        return load_view(reader, chat_id, messages, floors)
    if ring:
        nodes.remember(reader.get_nodes(chat_id, ring))
    for nid in ring:
        node = nodes.get(nid)
        if node is not None and node.type == "message":
            # A taken-over entity's mention may move to this message: all its edges (it has few).
            for e in reader.edges_of(chat_id, nid):
                edges[e.id] = e
        elif nid.startswith(("char:", "ent:")):
            # The orphan check needs "an active edge the plan does not touch": the plan only retires edges
            # around the seeds, so the longest-lasting other one answers it.
            e = reader.lasting_edge(chat_id, nid, seeds)
            if e is not None:
                edges[e.id] = e
    if runs is None and chain is None:
        chain = tuple(reader.message_chain(chat_id))
    return GraphView(nodes, edges, chain, runs=runs, names=names)


class _NothingToWrite(Exception):
    """Rolls back a write batch whose re-plan turned out empty (no version bump for a no-op)."""


def _apply(store: Any, chat_id: str, make_plan: Any, view_args: dict[str, Any]) -> IngestReport:
    with store.read() as r:
        version = r.chat_version(chat_id)
        plan = make_plan(load_view_targeted(r, chat_id, **view_args))
    if plan.empty:
        return IngestReport.of(chat_id, version, plan)
    try:
        with store.write(chat_id) as w:
            if w.chat_version(chat_id) != version:
                # Another writer committed since the read: plan again on the graph as it is now.
                plan = make_plan(load_view_targeted(w, chat_id, **view_args))
                if plan.empty:
                    raise _NothingToWrite
            if plan.nodes:
                w.upsert_nodes(plan.nodes)
            if plan.edges:
                w.upsert_edges(plan.edges)
            new_version = w.version
    except _NothingToWrite:
        return IngestReport.of(chat_id, store.chat_version(chat_id), plan)
    return IngestReport.of(chat_id, new_version, plan)


def ingest_messages(
    store: Any, chat_id: str, messages: Sequence[ChatMessage], *, now_ms: int
) -> IngestReport:
    """Ingest ``messages`` into chat ``chat_id`` of ``store`` in one transaction (rules: module docstring).

    >>> ingest_messages(store, "chat-1", [ChatMessage(floor=0, role="user", speaker="Ann", text="Hi Bob")],
    ...                 now_ms=1_700_000_000_000).nodes_added  # doctest: +SKIP
    3
    """
    batch = list(messages)
    _check_floors(batch)
    return _apply(store, chat_id, lambda view: plan_messages(batch, view, now_ms), {"messages": batch})


def edit_message(store: Any, chat_id: str, message: ChatMessage, *, now_ms: int) -> IngestReport:
    """Replace the message at ``message.floor`` (text, speaker, date, …): the node is updated and its mentions
    recomputed. Raises :class:`NotFound` when the chat has no active (not deleted) message at that floor."""
    node = store.get_node(chat_id, message_id(message.floor))
    if node is None or node.archived:
        raise NotFound("message.floor", f"chat {chat_id!r} has no message at floor {message.floor}")
    return ingest_messages(store, chat_id, [message], now_ms=now_ms)


def swipe_message(store: Any, chat_id: str, message: ChatMessage, *, now_ms: int) -> IngestReport:
    """A swipe replaces an assistant message: :func:`edit_message` restricted to ``role="assistant"``."""
    if message.role != "assistant":
        raise InputError("message.role", f"a swipe replaces an assistant message; got role {message.role!r}")
    return edit_message(store, chat_id, message, now_ms=now_ms)


def delete_message(store: Any, chat_id: str, floor: int, *, now_ms: int) -> IngestReport:
    """Retire the message at ``floor``: node archived, its edges invalidated, the chain relinked around it;
    characters/entities left without an active edge are archived. Deleting an archived message changes
    nothing; a floor with no message node raises :class:`NotFound`."""
    if isinstance(floor, bool) or not isinstance(floor, int) or floor < 0:
        raise InputError("floor", f"must be a non-negative int; got {floor!r}")
    if store.get_node(chat_id, message_id(floor)) is None:
        raise NotFound("floor", f"chat {chat_id!r} has no message at floor {floor}")
    return _apply(store, chat_id, lambda view: plan_deletions([floor], view, now_ms), {"floors": [floor]})


def remove_message(store: Any, chat_id: str, floor: int, *, now_ms: int) -> IngestReport:
    """The host removed the message at ``floor`` from the middle of the chat and every later message moved down
    one floor (what SillyTavern does): the message and its edges are hard-deleted, and each message node after
    it is renamed to the floor below — same node, text, statistics, edges (ends renamed) and vectors (moved,
    not recomputed) — so nothing is re-ingested or re-embedded. Recall records move with their floors; the
    removed floor's record is dropped. A character or entity left without an active edge is archived.

    One transaction; cost O(messages after ``floor`` + their edges), never a pass over the chat: those messages
    are read by floor (an index), their edges by end, and the chain's links around them from the store's ingest
    cache (:func:`_chain_near`). The orphan check also reads the edges of the removed message's speaker and of
    the names it mentions (:meth:`~memory_recall.store.sqlite.StoreReader.lasting_edge`). Characters'
    and entities' ``seq_range`` keep their floors (they only ever grow, see "Character node"), and extracted
    memory nodes keep theirs. Raises :class:`NotFound` when the chat has no message node at ``floor`` or
    after it.
    """
    if isinstance(floor, bool) or not isinstance(floor, int) or floor < 0:
        raise InputError("floor", f"must be a non-negative int; got {floor!r}")
    with store.write(chat_id) as w:
        later = w.message_floors_from(chat_id, floor)
        if not later:
            raise NotFound("floor", f"chat {chat_id!r} has no message at floor {floor} or after it")
        old_ids = [nid for _, nid in later]
        nodes = {n.id: n for n in w.get_nodes(chat_id, old_ids)}
        rename = {nid: message_id(f - 1) for f, nid in later if f > floor}
        removed = message_id(floor)
        targets = set(rename.values())
        # Ids nothing moves into: the removed message (when the next floor has no node) and the last one.
        freed = [nid for nid in old_ids if nid not in targets and (nid in rename or nid == removed)]

        edges: dict[str, Edge] = {}
        for nid in old_ids:
            for e in w.edges_of(chat_id, nid):
                edges[e.id] = e
        gone = [e for e in edges.values() if removed in (e.from_id, e.to_id)]
        moved: list[Edge] = []
        for e in edges.values():
            if removed in (e.from_id, e.to_id):
                continue
            src, dst = rename.get(e.from_id, e.from_id), rename.get(e.to_id, e.to_id)
            eid = edge_id(src, dst) if e.id == edge_id(e.from_id, e.to_id) else e.id
            moved.append(e.model_copy(update={"id": eid, "from_id": src, "to_id": dst}))

        # The chain: links into the renamed run follow the rename; the removed message is skipped.
        chain = _chain_near(store, w, chat_id, floor, [(nodes[nid].seq, nid) for _, nid in later if nid in nodes])
        before = [nid for seq, nid, _, _ in chain if seq < floor]
        order = before + [rename[nid] for _, nid, _, _ in chain if nid in rename]
        link = {nid: (order[i - 1] if i else None, order[i + 1] if i + 1 < len(order) else None)
                for i, nid in enumerate(order)}
        upserts: list[Node] = []
        if before:
            b = w.get_node(chat_id, before[-1])
            if b is not None and (b.prev_id, b.next_id) != link[b.id]:
                upserts.append(b.model_copy(update={"prev_id": link[b.id][0], "next_id": link[b.id][1],
                                                    "updated_at": now_ms}))
        for f, nid in later:
            if nid not in rename or nid not in nodes:
                continue
            n = nodes[nid]
            new_id = rename[nid]
            prev_id, next_id = (None, None) if n.archived else link[new_id]
            upserts.append(n.model_copy(update={
                "id": new_id, "seq": f - 1, "seq_range": (f - 1, f - 1), "prev_id": prev_id, "next_id": next_id,
                "updated_at": now_ms,
            }))

        # Characters/entities whose only active edges went with the removed message are archived.
        orphans: list[Node] = []
        for end in sorted({x for e in gone for x in (e.from_id, e.to_id) if x != removed}):
            if not end.startswith(("char:", "ent:")):
                continue
            keep = w.lasting_edge(chat_id, end, [removed])
            owner = w.get_node(chat_id, end)
            if owner is not None and not owner.archived and (keep is None or not keep.active(now_ms)):
                orphans.append(owner.model_copy(update={"archived": True, "updated_at": now_ms}))

        # Order matters: edges go first (their ends change), renamed rows exist before vectors move onto them
        # (in floor order, so none is overwritten before it moved), freed rows go before edges come back.
        w.delete_edges(list(edges))
        if upserts or orphans:
            w.upsert_nodes(upserts + orphans)
        w.move_embeddings([(old, rename[old]) for _, old in later if old in rename and old in nodes])
        if freed:
            w.delete_nodes(freed)
        if moved:
            w.upsert_edges(moved)
        w.shift_records_down(floor)
        new_version = w.version
    plan = IngestPlan(
        nodes=tuple(sorted(upserts + orphans, key=lambda n: n.id)),
        edges=tuple(sorted(moved, key=lambda e: e.id)),
        updated_nodes=tuple(sorted(n.id for n in upserts)),
        retired_nodes=tuple(sorted(freed + [n.id for n in orphans])),
        updated_edges=tuple(sorted(e.id for e in moved)),
        retired_edges=tuple(sorted(e.id for e in gone)),
    )
    return IngestReport.of(chat_id, new_version, plan)


def _chain_near(store: Any, w: Any, chat_id: str, floor: int, anchors: Sequence[tuple[int, str]]) -> list[Any]:
    """What :func:`remove_message` needs of the message chain, in ``(seq, node_id)`` order: the two links before
    ``floor`` and the links at ``anchors`` (the messages at ``floor`` and after), each with its neighbours. Read from
    the store's ingest cache (:meth:`~memory_recall.store.sqlite.StoreReader.ingest_base`: runs around the anchors,
    O(anchors) once the cache holds the chat, or the whole chain it holds when the stored links disagree with the
    order) when it serves the version ``w`` writes over; else the whole chain read by ``w``
    (:meth:`~memory_recall.store.sqlite.StoreReader.message_chain`).
    Called before ``w`` writes anything, so a read sees what ``w`` sees."""
    if hasattr(store, "read"):
        with store.read() as r:
            if hasattr(r, "ingest_base") and r.chat_version(chat_id) == w.chat_version(chat_id):
                # (floor, "") sorts before every link at ``floor``: its run starts two links before the floor.
                base = r.ingest_base(chat_id, [(floor, ""), *anchors], margin=2)
                if base.runs is not None:
                    return [link for run in base.runs for link in run.links]  # disjoint runs, in chain order
                if base.chain is not None:  # links that disagree with the order: the whole chain, as cached
                    return list(base.chain)
    return list(w.message_chain(chat_id))


def plan_sync(messages: Sequence[ChatMessage], existing: GraphView | None, now_ms: int) -> IngestPlan:
    """The chat is exactly ``messages`` (floors ``0 … n-1``): ingest them, retire message nodes at later floors.

    Pure, like :func:`plan_messages`; the caller checks the floors are contiguous (:func:`sync_messages`).
    """
    ordered = _check_floors(messages)
    p = _Planner(existing, now_ms)
    keep = [m for m in ordered if m.role != "system"]
    drop = [m.floor for m in ordered if m.role == "system"]
    end = len(ordered)
    if existing is not None and existing.runs is not None:
        raise InputError("existing", "a sync plan needs the whole chain, not a cut one (full_chain=True)")
    if existing is not None:
        if existing.chain is not None:
            drop.extend(seq for seq, _, _, _ in existing.chain if seq >= end)
        else:
            drop.extend(n.seq for n in existing.nodes.values()
                        if n.type == "message" and not n.archived and n.seq >= end)
    _plan_upserts(p, keep)
    _plan_retirements(p, sorted(set(drop)))
    _relink_chain(p)
    _archive_orphans(p)
    return p.plan(messages=len(keep), skipped=len(ordered) - len(keep))


def sync_messages(store: Any, chat_id: str, messages: Sequence[ChatMessage], *, now_ms: int) -> IngestReport:
    """Make the chat's messages exactly ``messages``, whose floors must be ``0 … n-1`` (a whole host chat):
    changed floors are re-ingested, unchanged ones write nothing, message nodes past the end are retired. Re-
    sending the same chat writes nothing and keeps the version. One transaction."""
    batch = list(messages)
    ordered = _check_floors(batch)
    for i, m in enumerate(ordered):
        if m.floor != i:
            where = next(j for j, x in enumerate(batch) if x.floor == m.floor)
            raise InputError(f"messages[{where}].floor",
                             f"a whole chat holds floors 0 to {len(batch) - 1} once each; floor {i} is missing")
    with store.read() as r:
        tail = [seq for seq, _ in r.message_floors_from(chat_id, len(batch))]
    return _apply(store, chat_id, lambda view: plan_sync(batch, view, now_ms),
                  {"messages": batch, "floors": tail, "full_chain": True})


def _unknown_speaker_entities(messages: Sequence[Any], speakers: Collection[str], nodes: Any) -> list[str]:
    """Entity ids (full name, then first name) present in ``nodes`` for speakers no character node names."""
    found: list[str] = []
    for m in messages:
        name = _clean_name(m.speaker)
        if name and fold_name(name) not in speakers:
            found.extend(cand for cand in (entity_id(name), entity_id(name.split(" ")[0])) if cand in nodes)
    return found
