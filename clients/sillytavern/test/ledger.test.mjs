import assert from 'node:assert/strict';
import { test } from 'node:test';

import { MAX_OPS, apply, diff, fingerprint } from '../lib/ledger.js';

const msg = (floor, text, role = floor % 2 ? 'assistant' : 'user') => ({ floor, role, speaker: role, text, hidden: false });
const chat = (...texts) => texts.map((t, i) => msg(i, t));
const fps = (messages) => messages.map(fingerprint);

test('a fingerprint covers what the service stores, not the floor', () => {
    assert.equal(fingerprint(msg(0, 'a')), fingerprint({ ...msg(0, 'a'), floor: 7 }));
    assert.notEqual(fingerprint(msg(0, 'a')), fingerprint(msg(0, 'b')));
    assert.notEqual(fingerprint(msg(0, 'a')), fingerprint({ ...msg(0, 'a'), hidden: true }));
    assert.notEqual(fingerprint(msg(0, 'a')), fingerprint({ ...msg(0, 'a'), speaker: 'x' }));
    assert.notEqual(fingerprint(msg(0, 'a')), fingerprint({ ...msg(0, 'a'), send_time_ms: 5 }));
    assert.match(fingerprint(msg(0, 'a')), /^[0-9a-f]{16}$/);
});

test('unknown state sends the whole chat', () => {
    const c = chat('a', 'b');
    assert.deepEqual(diff(null, fps(c), c), [{ kind: 'sync', messages: c }]);
});

test('appends are one batch; nothing changed is nothing', () => {
    const c = chat('a', 'b', 'c', 'd');
    assert.deepEqual(diff(fps(c), fps(c), c), []);
    assert.deepEqual(diff(fps(c.slice(0, 2)), fps(c), c), [{ kind: 'add', messages: [c[2], c[3]] }]);
});

test('an edit is one edit, wherever it is', () => {
    const before = chat('a', 'b', 'c');
    const after = chat('a', 'B', 'c');
    assert.deepEqual(diff(fps(before), fps(after), after), [{ kind: 'edit', message: after[1] }]);
});

test('regenerate removes the last reply: one deletion, no shift', () => {
    const before = chat('a', 'b', 'c', 'd');
    const after = before.slice(0, 3);
    assert.deepEqual(diff(fps(before), fps(after), after), [{ kind: 'delete', floor: 3, shift: false }]);
});

test('a cut tail deletes from the highest floor down', () => {
    const before = chat('a', 'b', 'c', 'd', 'e');
    const after = before.slice(0, 2);
    assert.deepEqual(diff(fps(before), fps(after), after), [
        { kind: 'delete', floor: 4, shift: false },
        { kind: 'delete', floor: 3, shift: false },
        { kind: 'delete', floor: 2, shift: false },
    ]);
});

test('one message removed from the middle is one shifting deletion', () => {
    const before = chat('a', 'b', 'c', 'd', 'e');
    const rest = [before[0], before[1], before[3], before[4]].map((m, i) => ({ ...m, floor: i }));
    assert.deepEqual(diff(fps(before), fps(rest), rest), [{ kind: 'delete', floor: 2, shift: true }]);
    const first = before.slice(1).map((m, i) => ({ ...m, floor: i }));
    assert.deepEqual(diff(fps(before), fps(first), first), [{ kind: 'delete', floor: 0, shift: true }]);
});

test('many changes become one whole-chat sync', () => {
    const before = Array.from({ length: 200 }, (_, i) => msg(i, `m${i}`));
    const after = before.map((m) => ({ ...m, text: m.text + '!' }));
    assert.deepEqual(diff(fps(before), fps(after), after), [{ kind: 'sync', messages: after }]);
    const few = before.map((m, i) => (i < MAX_OPS ? { ...m, text: m.text + '!' } : m));
    assert.equal(diff(fps(before), fps(few), few).length, MAX_OPS);
});

test('a message being written is never sent half-written', () => {
    const before = chat('a', 'b');
    const during = chat('a', 'b', 'c');
    assert.deepEqual(diff(fps(before), fps(during), during, { frozenFrom: 2 }), []);
    // A swipe regenerating floor 1: its placeholder is not an edit.
    const swiping = chat('a', '...');
    assert.deepEqual(diff(fps(before), fps(swiping), swiping, { frozenFrom: 1 }), []);
    // Earlier floors still go out.
    const edited = chat('A', '...');
    assert.deepEqual(diff(fps(before), fps(edited), edited, { frozenFrom: 1 }), [{ kind: 'edit', message: edited[0] }]);
});

test('apply follows each operation', () => {
    const c = chat('a', 'b', 'c');
    const known = fps(c);
    assert.deepEqual(apply(known, { kind: 'edit', message: msg(1, 'x') }), [known[0], fingerprint(msg(1, 'x')), known[2]]);
    assert.deepEqual(apply(known, { kind: 'add', messages: [msg(3, 'd')] }), [...known, fingerprint(msg(3, 'd'))]);
    assert.deepEqual(apply(known, { kind: 'delete', floor: 2, shift: false }), known.slice(0, 2));
    assert.deepEqual(apply(known, { kind: 'delete', floor: 0, shift: true }), known.slice(1));
    assert.equal(apply(known, { kind: 'delete', floor: 0, shift: false }), null); // a hole: unknown
    assert.equal(apply(known, { kind: 'add', messages: [msg(5, 'gap')] }), null);
    assert.equal(apply(null, { kind: 'edit', message: msg(0, 'x') }), null);
    assert.deepEqual(apply(null, { kind: 'sync', messages: c }), known);
});

test('diff then apply gives the current chat, for random edits', () => {
    let seed = 7;
    const rand = (n) => {
        seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
        return seed % n;
    };
    for (let round = 0; round < 500; round++) {
        let c = Array.from({ length: 1 + rand(12) }, (_, i) => msg(i, `t${rand(5)}`));
        const known = fps(c);
        const action = rand(5);
        if (action === 0) c.push(msg(c.length, `new${rand(3)}`));
        if (action === 1 && c.length > 1) c = c.slice(0, rand(c.length));
        if (action === 2) {
            const k = rand(c.length);
            c = c.filter((_, i) => i !== k).map((m, i) => ({ ...m, floor: i }));
        }
        if (action === 3) c[rand(c.length)] = { ...c[rand(c.length)], text: `e${rand(9)}` };
        if (action === 4) c = c.map((m) => (rand(3) ? m : { ...m, hidden: true }));
        c = c.map((m, i) => ({ ...m, floor: i }));
        let state = known;
        for (const op of diff(known, fps(c), c)) state = apply(state, op);
        assert.deepEqual(state, fps(c), `round ${round}`);
    }
});
