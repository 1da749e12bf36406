"""Lexical kernel: reference §3.12 step 1 / scenario 6 (in both unit modes), unit classes (reference and
departure 8), field matching rules and prepared sources."""

from __future__ import annotations

import mmap
import unicodedata

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mapped_buffers import mapping_of

from memory_recall.pipeline.kernels import (
    UnitVocab,
    batch_lexical_scores,
    field_match,
    lexical_score,
    lexical_units,
    pack_node,
    prepare_node,
    prepare_sources,
    prepared_lexical_score,
)
from memory_recall.pipeline.kernels import lexical as lexical_module
from memory_recall.pipeline.kernels.lexical import PackedFieldTable
from memory_recall.text.normalize import js_len, normalize_lexical

MODES = [pytest.param(False, id="extended"), pytest.param(True, id="reference")]


class TestScenario6:
    @pytest.mark.parametrize("reference", MODES)
    @pytest.mark.parametrize(
        ("primary", "secondary", "source", "expected"),
        [
            (["Alice"], [], "alice", 1.0),
            (["Alice"], ["常驻角色"], "Alice 现在怎么样了", 0.92),
            (["Bob"], [], "Alice 现在怎么样了", 0.0),
            (["A"], [], "A", 1.0),
            ([], ["hello world"], "Hello   World", 0.6724),
            (["red dragon attack"], [], "the dragon attack was fierce", 0.288),
            ([], ["艾琳觉得钟楼入口非常可疑"], "钟楼里到底有什么", 0.0533),
        ],
    )
    def test_scenario_6_values(self, reference, primary, secondary, source, expected) -> None:
        got = lexical_score(primary, secondary, [source], reference=reference)
        assert got == pytest.approx(expected, abs=1e-4)

    def test_scenario_6_exact_arithmetic(self) -> None:
        # 0.82·S with S exact (0.82); 0.82·(0.52/8) for the CJK case.
        assert lexical_score([], ["hello world"], ["Hello   World"]) == pytest.approx(0.82 * 0.82, abs=1e-15)
        assert lexical_score([], ["艾琳觉得钟楼入口非常可疑"], ["钟楼里到底有什么"]) == pytest.approx(
            0.82 * 0.52 / 8, abs=1e-15
        )


class TestReferenceUnits:
    def test_ascii_and_cjk_runs_with_bigrams(self) -> None:
        assert lexical_units("Alice 现在怎么样了", reference=True) == [
            "alice", "现在怎么样了", "现在", "在怎", "怎么", "么样", "样了",
        ]

    def test_short_tokens_and_two_char_cjk(self) -> None:
        # one-character tokens are not units; a 2-character CJK run adds no extra bigrams
        assert lexical_units("a 好 ab 钟楼 x1", reference=True) == ["ab", "钟楼", "x1"]

    def test_dedupe_keeps_first_occurrence(self) -> None:
        assert lexical_units("abc 钟楼钟 abc", reference=True) == ["abc", "钟楼钟", "钟楼", "楼钟"]

    def test_other_scripts_are_ignored(self) -> None:
        for text in ("café", "ありがとう", "서울에서", "привет", "㐀㐁"):
            assert lexical_units(text, reference=True) in ([], ["caf"]), text
        assert lexical_units("café", reference=True) == ["caf"]

    def test_mixed_script_word_splits(self) -> None:
        assert lexical_units("abc中文def", reference=True) == ["abc", "中文", "def"]


class TestExtendedUnits:
    def test_same_as_reference_on_ascii_and_cjk(self) -> None:
        texts = (
            "Alice 现在怎么样了",
            "the dragon attack was fierce",
            "艾琳觉得钟楼入口非常可疑",
            "x1 y22 钟楼",
        )
        for text in texts:
            assert lexical_units(text) == lexical_units(text, reference=True), text

    def test_accented_latin_words(self) -> None:
        assert lexical_units("Café Straße NGÔ") == ["café", "straße", "ngô"]

    def test_decomposed_accents_compose(self) -> None:
        assert lexical_units("Cafe\u0301") == ["café"]

    def test_full_width_latin_folds_to_ascii(self) -> None:
        assert lexical_units("ＡＢＣ １２") == ["abc", "12"]

    def test_cyrillic_words(self) -> None:
        assert lexical_units("Привет, мир!") == ["привет", "мир"]

    def test_kana_runs_add_bigrams(self) -> None:
        assert lexical_units("ありがとう") == ["ありがとう", "あり", "りが", "がと", "とう"]

    def test_katakana_middle_dot_separates(self) -> None:
        assert lexical_units("アリス・ベル") == ["アリス", "アリ", "リス", "ベル"]

    def test_kanji_and_kana_are_separate_runs(self) -> None:
        assert lexical_units("東京タワー") == ["東京", "タワー", "タワ", "ワー"]

    def test_hangul_runs_add_bigrams(self) -> None:
        assert lexical_units("서울에서") == ["서울에서", "서울", "울에", "에서"]

    def test_cjk_extension_a(self) -> None:
        assert lexical_units("㐀㐁㐂") == ["㐀㐁㐂", "㐀㐁", "㐁㐂"]

    def test_script_change_ends_a_run(self) -> None:
        assert lexical_units("abcпривет") == ["abc", "привет"]

    def test_accented_name_now_matches(self) -> None:
        assert lexical_score(["Zoë"], [], ["where is zoë now"]) == pytest.approx(0.92)
        assert lexical_score(["Zoë"], [], ["where is zoë now"], reference=True) == pytest.approx(0.92)
        # Unit overlap only (exact/includes weights 0): the reference sees "zo", not "zoë", and no Cyrillic.
        assert field_match("Zoë", ["zoë left, brook stayed"], 0, 0, 0.72) == pytest.approx(0.72 / 4)
        assert field_match("Zoë Brook", ["zoe left"], 0, 0, 0.72) == 0.0
        assert field_match("Zoë Brook", ["zoe left"], 0, 0, 0.72, reference=True) == 0.0
        assert field_match("Иван", ["где Иван, брат"], 0, 0, 0.72) == pytest.approx(0.24)
        assert field_match("Иван", ["где Иван, брат"], 0, 0, 0.72, reference=True) == 0.0


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab zé1Ω\u0301жЖё-ꙁ\u1c80艾琳かカ한ㅎ・ 0.\U00020bb7")), max_size=20))
def test_spaced_script_shortcut_equals_the_run_loop(text: str) -> None:
    from memory_recall.pipeline.kernels.lexical import _extended_runs, _normalise, _units_of_normalised

    norm = _normalise(text, False)
    out: dict[str, None] = {}
    _extended_runs(out, norm)
    assert _units_of_normalised.__wrapped__(norm, False) == tuple(out)


class TestFieldMatch:
    def test_exact_beats_everything_and_has_no_length_limit(self) -> None:
        assert field_match("A", ["a"], 1.0, 0.92, 0.72) == 1.0

    def test_includes_needs_two_characters(self) -> None:
        assert field_match("a", ["ab"], 1.0, 0.92, 0.72) == 0.0
        assert field_match("ab", ["abc"], 1.0, 0.92, 0.72) == pytest.approx(0.92)

    def test_empty_field_and_empty_sources(self) -> None:
        assert field_match("", ["abc"], 1.0, 0.92, 0.72) == 0.0
        assert field_match("abc", ["", "   "], 1.0, 0.92, 0.72) == 0.0
        assert lexical_score(["abc"], [], []) == 0.0

    def test_source_without_units_contributes_no_overlap(self) -> None:
        assert field_match("x!", ["!"], 1.0, 0.92, 0.72) == 0.0

    def test_best_over_several_sources_capped_at_one(self) -> None:
        assert field_match("dragon", ["the dragon", "cat"], 1.5, 0.92, 0.72) == pytest.approx(0.92)
        assert field_match("dragon", ["Dragon"], 1.5, 0.92, 0.72) == 1.0

    def test_overlap_is_relative_to_source_units(self) -> None:
        assert field_match("red dragon", ["dragon lair deep"], 1.0, 0.92, 0.72) == pytest.approx(0.72 / 3)


class TestPreparedSources:
    def test_prepared_sources_give_the_same_scores(self) -> None:
        sources = ["Alice 现在怎么样了", "the dragon attack", ""]
        prepared = prepare_sources(sources)
        for primary, secondary in ((["Alice"], ["常驻角色"]), (["red dragon"], []), ([], ["nothing"])):
            assert lexical_score(primary, secondary, prepared) == lexical_score(primary, secondary, sources)
        assert len(prepared.items) == 2  # the empty source is dropped once

    def test_mode_mismatch_raises(self) -> None:
        with pytest.raises(ValueError, match="reference"):
            lexical_score(["a"], [], prepare_sources(["a"]), reference=True)

    def test_combined_evidence_and_cap(self) -> None:
        # P includes 0.92, S includes 0.68, T = joined "bob smith" overlaps 2 of 3 source units: 0.45·2/3.
        got = lexical_score(["Bob"], ["smith"], ["bob the smith"])
        assert got == pytest.approx(0.75 * 0.92 + 0.35 * 0.68 + 0.2 * 0.3, abs=1e-12)
        # Joined text "bob the smith" equals the source: 0.75·0.92 + 0.35·0.68 + 0.2·0.65 > 1 → capped.
        assert lexical_score(["Bob"], ["the smith"], ["bob the smith"]) == 1.0


# --- prepared nodes (fields normalised once per snapshot) ----------------------------------------------------


def _plain_field_match(field: str, sources: list[str], exact: float, includes: float, overlap: float, ref: bool):
    """The field match written out directly from the rules (normalise everything on every call)."""

    def norm(text: str) -> str:
        return normalize_lexical(text if ref else unicodedata.normalize("NFKC", text))

    f = norm(field)
    if not f:
        return 0.0
    best = 0.0
    for raw in sources:
        s = norm(raw)
        if not s:
            continue
        if s == f:
            best = max(best, exact)
            continue
        if min(js_len(s), js_len(f)) >= 2 and (s in f or f in s):
            best = max(best, includes)
        s_units = set(lexical_units(s, reference=ref))
        if s_units:
            best = max(best, overlap * len(s_units & set(lexical_units(f, reference=ref))) / len(s_units))
    return min(1.0, best)


def _plain_lexical_score(primary: list[str], secondary: list[str], sources: list[str], ref: bool) -> float:
    if not any(normalize_lexical(s if ref else unicodedata.normalize("NFKC", s)) for s in sources):
        return 0.0
    p = max((_plain_field_match(t, sources, 1.0, 0.92, 0.72, ref) for t in primary), default=0.0)
    s = max((_plain_field_match(t, sources, 0.82, 0.68, 0.52, ref) for t in secondary), default=0.0)
    t = _plain_field_match(" ".join([*primary, *secondary]), sources, 0.65, 0.55, 0.45, ref)
    if p == 0 and s == 0 and t == 0:
        return 0.0
    return min(1.0, max(p, 0.82 * s, 0.7 * t, 0.75 * p + 0.35 * s + 0.2 * t))


# Few letters so that equality, containment and shared units all happen often; full-width, combining and CJK
# characters exercise NFKC; line feeds and tabs exercise the whitespace collapsing.
_TEXT = st.text(alphabet="ab c\t\nＡé\u0301钟楼리서", max_size=9)


class TestPreparedNode:
    @settings(max_examples=300, deadline=None)
    @given(
        primary=st.lists(_TEXT, max_size=2),
        secondary=st.lists(_TEXT, max_size=3),
        sources=st.lists(_TEXT, max_size=3),
        ref=st.booleans(),
    )
    def test_prepared_score_equals_the_plain_rules(self, primary, secondary, sources, ref) -> None:
        node = prepare_node(primary, secondary, reference=ref)
        expected = _plain_lexical_score(primary, secondary, sources, ref)
        assert prepared_lexical_score(node, prepare_sources(sources, reference=ref)) == expected
        assert lexical_score(primary, secondary, sources, reference=ref) == expected

    def test_containment_without_shared_units_is_not_rejected(self) -> None:
        # "lic" and "alice" share no unit, but the source is inside the name: P = includes 0.92 (T 0.55).
        node = prepare_node(["Alice"], [])
        assert prepared_lexical_score(node, prepare_sources(["lic"])) == 0.92
        # A source without any unit (single letters) inside a secondary field.
        node = prepare_node([], ["x a b"])
        assert prepared_lexical_score(node, prepare_sources(["a b"])) == 0.82 * 0.68  # S 0.68 beats T 0.55
        # A field inside a source, no shared unit: "ce" in "alice".
        assert prepared_lexical_score(prepare_node(["ce"], []), prepare_sources(["alice"])) == 0.92

    def test_nothing_in_common_scores_zero(self) -> None:
        assert prepared_lexical_score(prepare_node(["Bob"], ["a smith"]), prepare_sources(["Alice 现在"])) == 0.0

    def test_empty_fields_are_dropped(self) -> None:
        node = prepare_node(["", "  "], ["Tower"])
        assert node.primary == ()
        assert [f.text for f in node.secondary] == ["tower"]
        assert node.joined is not None and node.joined.text == "tower"
        assert node.units == frozenset({"tower"})
        assert prepare_node([], []).joined is None
        assert prepared_lexical_score(prepare_node([], []), prepare_sources(["tower"])) == 0.0

    def test_no_sources_score_zero(self) -> None:
        assert prepared_lexical_score(prepare_node(["Alice"], []), prepare_sources(["", "  "])) == 0.0

    def test_remembered_nodes_equal_a_fresh_preparation(self) -> None:
        from memory_recall.pipeline.kernels.lexical import _prepare_node

        for ref in (False, True):
            first = prepare_node(["Alice", "钟楼"], ["the old tower"], reference=ref)
            assert prepare_node(["Alice", "钟楼"], ["the old tower"], reference=ref) is first  # remembered
            assert first == _prepare_node(["Alice", "钟楼"], ["the old tower"], ref)
        # The reference flag is part of the key; lists and tuples of the same texts are the same node.
        assert prepare_node(("Alice",), ()) is prepare_node(["Alice"], [])
        assert prepare_node(["Alice"], [], reference=True) is not prepare_node(["Alice"], [])
        # Texts that are not plain strings are prepared on every call, as before.
        assert prepare_node([12], [None]) == _prepare_node([12], [None], False)
        assert [f.text for f in prepare_node([12], [None]).fields] == ["12", "12"]


class TestBatchScores:
    @settings(max_examples=200, deadline=None)
    @given(
        nodes=st.lists(
            st.one_of(st.none(), st.tuples(st.lists(_TEXT, max_size=2), st.lists(_TEXT, max_size=3))), max_size=6
        ),
        sources=st.lists(_TEXT, max_size=3),
        ref=st.booleans(),
    )
    def test_batch_equals_the_scalar_score_bit_for_bit(self, nodes, sources, ref) -> None:
        vocab = UnitVocab()
        prepared = [None if n is None else prepare_node(n[0], n[1], reference=ref) for n in nodes]
        packed = [None if p is None else pack_node(p, vocab) for p in prepared]
        srcs = prepare_sources(sources, reference=ref)
        got = batch_lexical_scores(packed, srcs, vocab)
        expected = [0.0 if p is None else prepared_lexical_score(p, srcs) for p in prepared]
        assert got.dtype == np.float64
        assert got.tolist() == expected

    def test_mixed_matches_in_one_batch(self) -> None:
        vocab = UnitVocab()
        texts = [(["Alice"], ["the bell tower"]), ([], []), (["ce"], []), (["Bob"], ["a smith"]), ([], ["x a b"])]
        prepared = [prepare_node(p, s) for p, s in texts]
        packed = [pack_node(p, vocab) for p in prepared]
        srcs = prepare_sources(["alice", "bell tower now", "a b"])
        got = batch_lexical_scores(packed, srcs, vocab).tolist()
        assert got == [prepared_lexical_score(p, srcs) for p in prepared]
        assert got[0] == 1.0 and got[1] == 0.0 and got[2] == 0.92 and got[3] == 0.0 and got[4] == 0.82 * 0.68

    def test_no_sources_or_no_nodes(self) -> None:
        vocab = UnitVocab()
        packed = [pack_node(prepare_node(["Alice"], []), vocab)]
        assert batch_lexical_scores(packed, prepare_sources([""]), vocab).tolist() == [0.0]
        assert batch_lexical_scores([None, None], prepare_sources(["alice"]), vocab).tolist() == [0.0, 0.0]
        assert batch_lexical_scores([], prepare_sources(["alice"]), vocab).shape == (0,)

    def test_vocab_ids_are_stable_and_dense(self) -> None:
        vocab = UnitVocab()
        assert vocab.ids_of(["bell", "tower", "bell"]) == [0, 1, 0]
        assert vocab.ids_of(["tower", "gate"]) == [1, 2]
        assert len(vocab) == 3
        assert sorted(vocab.known(frozenset({"gate", "moon"}))) == [2]


class TestPackedFieldTable:
    @settings(max_examples=200, deadline=None)
    @given(
        nodes=st.lists(
            st.one_of(st.none(), st.tuples(st.lists(_TEXT, max_size=2), st.lists(_TEXT, max_size=3))),
            min_size=1, max_size=6,
        ),
        batches=st.lists(
            st.tuples(st.lists(st.integers(0, 5), max_size=8), st.lists(_TEXT, max_size=3)), min_size=1, max_size=4
        ),
        max_nodes=st.integers(1, 8),
        ref=st.booleans(),
    )
    def test_scores_equal_the_scalar_score_bit_for_bit(self, nodes, batches, max_nodes, ref) -> None:
        """Batches over one table (repeats, nodes without text, the bound passed and the table emptied)."""
        prepared = [None if n is None else prepare_node(n[0], n[1], reference=ref) for n in nodes]
        table = PackedFieldTable(len(nodes), max_nodes)
        calls: list[int] = []

        def prepare(i: int):
            calls.append(i)
            return prepared[i]

        largest = 0  # distinct nodes of the largest batch so far: the table may keep one batch past the bound
        for keys, sources in batches:
            keys = [k % len(nodes) for k in keys]
            srcs = prepare_sources(sources, reference=ref)
            got = table.scores(np.array(keys, dtype=np.int64), srcs, prepare)
            expected = [0.0 if prepared[k] is None else prepared_lexical_score(prepared[k], srcs) for k in keys]
            assert got.dtype == np.float64 and got.tolist() == expected
            if srcs.items and keys:
                largest = max(largest, len(set(keys)))
                assert set(keys) <= set(table.keys())
                assert len(table) <= max(max_nodes, largest)
        if max_nodes >= len(nodes):  # never emptied: every node prepared at most once
            assert len(calls) == len(set(calls))

    def test_fields_are_packed_once_and_kept_up_to_the_bound(self) -> None:
        prepared = [prepare_node(["Alice"], ["the bell tower"]), None, prepare_node([], ["x a b"])]
        table = PackedFieldTable(3, max_nodes=2)
        calls: list[int] = []

        def prepare(i: int):
            calls.append(i)
            return prepared[i]

        srcs = prepare_sources(["alice at the tower"])
        first = table.scores(np.array([0, 1, 0]), srcs, prepare)
        assert calls == [0, 1] and table.keys() == [0, 1]
        assert table.field_texts(0) == ("alice", "the bell tower", "alice the bell tower")
        assert table.field_texts(1) == () and table.field_texts(2) is None
        again = table.scores(np.array([1, 0]), srcs, prepare)
        assert calls == [0, 1] and again.tolist() == first[[1, 0]].tolist()  # nothing packed again
        table.scores(np.array([2]), srcs, prepare)  # 2 kept + 1 new > 2: the table starts over
        assert calls == [0, 1, 2] and table.keys() == [2]
        assert table.scores(np.array([0, 1, 2]), prepare_sources([]), prepare).tolist() == [0.0, 0.0, 0.0]
        assert calls == [0, 1, 2]  # no source: nothing to match, nothing packed

    @settings(max_examples=150, deadline=None)
    @given(
        nodes=st.lists(
            st.one_of(st.none(), st.tuples(st.lists(_TEXT, max_size=2), st.lists(_TEXT, max_size=3))),
            min_size=1, max_size=6,
        ),
        packed=st.lists(st.integers(0, 5), max_size=6),
        fate=st.lists(st.sampled_from(("keep", "drop", "change")), min_size=6, max_size=6),
        added=st.integers(0, 2),
        batches=st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, 7), max_size=8)), min_size=1, max_size=4),
        sources=st.lists(_TEXT, min_size=1, max_size=3),
        max_nodes=st.integers(1, 10),
    )
    def test_remapped_table_scores_equal_the_scalar_score(
        self, nodes, packed, fate, added, batches, sources, max_nodes
    ) -> None:
        """A table remapped to the next graph (nodes kept, moved, dropped or changed, nodes added), then the child
        and the parent scored in any order: each scores its own graph bit for bit."""
        old = [None if n is None else prepare_node(n[0], n[1]) for n in nodes]
        srcs = prepare_sources(sources)
        parent = PackedFieldTable(len(old), max_nodes)
        parent.scores(np.array([k % len(old) for k in packed], dtype=np.int64), srcs, old.__getitem__)
        # The next graph: kept nodes in reverse order (positions move), changed ones with other fields, then new.
        kept = [i for i in range(len(old)) if fate[i] != "drop"][::-1]
        remap = np.full(len(old), -1, dtype=np.intp)
        remap[kept] = np.arange(len(kept))
        new = [prepare_node(["changed"], ["other text"]) if fate[i] == "change" else old[i] for i in kept]
        new += [prepare_node([f"new {j}"], ["the tower"]) for j in range(added)]
        changed = np.array([p for p, i in enumerate(kept) if fate[i] == "change"], dtype=np.intp)
        child = parent.remapped(len(new), remap, changed)
        assert set(child.keys()) <= set(range(len(new)))
        for p in changed.tolist():
            assert child.field_texts(p) is None  # a changed node is packed again on use
        for on_child, keys in batches:
            table, graph = (child, new) if on_child else (parent, old)
            if not graph:
                continue
            idx = np.array([k % len(graph) for k in keys], dtype=np.int64)
            got = table.scores(idx, srcs, graph.__getitem__)
            expected = [0.0 if graph[k] is None else prepared_lexical_score(graph[k], srcs) for k in idx.tolist()]
            assert got.tolist() == expected

    @settings(max_examples=100, deadline=None)
    @given(
        steps=st.lists(
            st.tuples(
                st.lists(st.integers(0, 7), max_size=3), st.integers(0, 2), st.lists(st.integers(0, 9), max_size=6)
            ),
            min_size=1, max_size=8,
        ),
        sources=st.lists(_TEXT, min_size=1, max_size=3),
        floor=st.sampled_from((0, 2)),
    )
    def test_a_lineage_of_remaps_is_compacted_and_scores_bit_for_bit(self, steps, sources, floor) -> None:
        """Writes one after the other (some nodes changed, some added), each remapping the last table and scoring a
        batch on it: dead slots never outnumber the live ones past the floor (the table is compacted), every table of
        the lineage still scores its own graph bit for bit, and the parents' rows are never written over."""
        srcs = prepare_sources(sources)
        graph = [prepare_node([f"name {i}"], [f"the tower {i}", "the river"]) for i in range(4)]
        table = PackedFieldTable(len(graph), max_nodes=10_000)
        table.scores(np.arange(len(graph)), srcs, graph.__getitem__)
        lineage = [(table, list(graph))]
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(lexical_module, "MIN_COMPACT_DEAD", floor)
            for w, (changed, added, batch) in enumerate(steps):
                n = len(graph)
                changed = sorted({c % n for c in changed})
                graph = [prepare_node([f"edit {w}"], [f"the gate {i}"]) if i in changed else g
                         for i, g in enumerate(graph)]
                graph += [prepare_node([f"new {w} {j}"], ["the tower"]) for j in range(added)]
                table = table.remapped(len(graph), np.arange(n), np.array(changed, dtype=np.intp))
                assert table._dead <= max(len(table), floor)
                idx = np.array([b % len(graph) for b in batch], dtype=np.int64)
                assert table.scores(idx, srcs, graph.__getitem__).tolist() == [
                    prepared_lexical_score(graph[k], srcs) for k in idx.tolist()]
                lineage.append((table, list(graph)))
        for old_table, old_graph in lineage:
            idx = np.arange(len(old_graph))
            assert old_table.scores(idx, srcs, old_graph.__getitem__).tolist() == [
                prepared_lexical_score(g, srcs) for g in old_graph]

    def test_repeated_copies_keep_the_buffers_proportional_to_their_rows(self) -> None:
        """A table that packs after every remap copies its rows each time (it no longer owns them): each copy is
        sized from the rows in use, so the buffers stay within twice them however often it happens (sized from
        the shared buffer's capacity they doubled on every copy)."""
        prepared = [prepare_node([f"name {i}"], [f"the tower number {i}", "the river"]) for i in range(60)]
        srcs = prepare_sources(["the tower by the river"])
        table = PackedFieldTable(60, max_nodes=1000)
        table.scores(np.array([0]), srcs, prepared.__getitem__)
        for i in range(1, 60):
            child = table.remapped(60, np.arange(60))
            assert not table._owns
            table.scores(np.array([i]), srcs, prepared.__getitem__)
            for buf, used in ((table._nodes, table._n_slots), (table._fields, table._n_fields),
                              (table._units, table._n_units)):
                assert buf.shape[0] <= max(256, 2 * used)
            assert child.keys() == list(range(i))  # the child kept its rows
        assert table.keys() == list(range(60))
        assert table.scores(np.arange(60), srcs, prepared.__getitem__).tolist() == [
            prepared_lexical_score(p, srcs) for p in prepared]

    def test_grown_buffers_get_their_own_mapping_from_the_bound(self) -> None:
        """A buffer of at least GROWN_MAPPED_MIN_BYTES is a zeroed mapping of its own (given back to the system
        when freed, its spare rows resident only once written); a smaller one is an ordinary array. Either way
        the rows in use are copied and the rest is zero."""
        old = np.arange(60, dtype=np.int64).reshape(10, 6)
        rows = lexical_module.GROWN_MAPPED_MIN_BYTES // (6 * 8)  # twice this many rows: over the bound
        big = lexical_module._grown(old, 10, rows)
        assert isinstance(mapping_of(big), mmap.mmap) and big.shape == (2 * (10 + rows), 6)
        assert np.array_equal(big[:10], old) and not big[10:].any() and big.flags.writeable
        small = lexical_module._grown(old, 10, 5)
        assert mapping_of(small) is None and small.flags.owndata and small.shape == (256, 6)
        assert np.array_equal(small[:10], old) and not small[10:].any()
        assert lexical_module._grown(big, 10 + rows, 1) is big  # room left: no copy

    def test_tables_on_mapped_buffers_score_bit_for_bit(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Every row buffer mapped (bound 0): a lineage of remaps, each packing after it (copies of buffers it no
        longer owns), scores as the scalar score, and the parents keep their rows."""
        monkeypatch.setattr(lexical_module, "GROWN_MAPPED_MIN_BYTES", 0)
        prepared = [prepare_node([f"name {i}"], [f"the tower number {i}", "the river"]) for i in range(40)]
        srcs = prepare_sources(["the tower by the river"])
        table = PackedFieldTable(40, max_nodes=1000)
        table.scores(np.array([0]), srcs, prepared.__getitem__)
        lineage = [table]
        for i in range(1, 40):
            child = table.remapped(40, np.arange(40))
            table.scores(np.array([i]), srcs, prepared.__getitem__)  # not the owner: copies, mapped
            assert isinstance(mapping_of(table._fields), mmap.mmap)
            lineage.append(child)
        assert table.scores(np.arange(40), srcs, prepared.__getitem__).tolist() == [
            prepared_lexical_score(p, srcs) for p in prepared]
        for i, old in enumerate(lineage[1:], start=1):
            assert old.keys() == list(range(i))
            assert old.scores(np.arange(i), srcs, prepared.__getitem__).tolist() == [
                prepared_lexical_score(p, srcs) for p in prepared[:i]]

    def test_remapped_shares_the_rows_and_the_parent_copies_before_it_packs(self) -> None:
        prepared = [prepare_node(["Alice"], ["the bell tower"]), prepare_node(["Bob"], ["the river"]), None]
        srcs = prepare_sources(["alice at the tower"])
        parent = PackedFieldTable(2, max_nodes=10)
        parent.scores(np.array([0, 1]), srcs, prepared.__getitem__)
        child = parent.remapped(3, np.arange(2))  # an append: node 2 is new
        assert child._nodes is parent._nodes and child._fields is parent._fields and child._units is parent._units
        assert child.keys() == [0, 1] and child.field_texts(1) == parent.field_texts(1)
        child.scores(np.array([2]), srcs, prepared.__getitem__)  # the owner appends in place
        assert child._fields is parent._fields and child.keys() == [0, 1, 2]
        rows = parent._fields[: parent._n_fields].copy()
        grown = [prepare_node(["Carol"], ["the gate"]), prepared[1]]
        parent_view = parent.remapped(2, np.array([-1, 1]))  # node 0 gone: its slot is dead
        assert parent_view.keys() == [1] and len(parent_view) == 1 and parent_view.field_texts(0) is None
        got = parent_view.scores(np.array([0, 1]), srcs, grown.__getitem__)
        assert got.tolist() == [prepared_lexical_score(g, srcs) for g in grown]
        # No table wrote over another's rows.
        assert np.array_equal(parent._fields[: parent._n_fields], rows)
        assert child.field_texts(2) == ()
        assert child.scores(np.array([0, 1, 2]), srcs, prepared.__getitem__).tolist() == [
            prepared_lexical_score(prepared[0], srcs), prepared_lexical_score(prepared[1], srcs), 0.0]
