// What the service holds of a chat, as one fingerprint per floor, and the operations that bring it in step with
// the chat SillyTavern shows. Pure functions: no DOM, no SillyTavern, no network (tested under Node).
//
// A fingerprint covers everything the service stores of a message (role, speaker, text, hidden flag, send
// time); two messages with one fingerprint are the same message to the service. `diff(known, current)` gives
// the fewest operations that turn `known` into `current`: appended floors are one batch, an edited floor one
// edit, a cut tail one deletion per floor, one message removed from the middle one deletion that moves the later
// floors down (`shift`), anything else a whole-chat sync (it costs one request and the service skips unchanged
// floors).

/** Largest edit/add count answered with operations before a whole-chat sync is cheaper. */
export const MAX_OPS = 64;

function fnv1a(text) {
    let h = 0x811c9dc5;
    for (let i = 0; i < text.length; i++) {
        h ^= text.charCodeAt(i);
        h = Math.imul(h, 0x01000193);
    }
    return (h >>> 0).toString(16).padStart(8, '0');
}

function djb2(text) {
    let h = 5381;
    for (let i = text.length - 1; i >= 0; i--) h = (Math.imul(h, 33) + text.charCodeAt(i)) | 0;
    return (h >>> 0).toString(16).padStart(8, '0');
}

/** 64-bit fingerprint of a service message (its floor excluded: a message keeps it when it moves). */
export function fingerprint(message) {
    const text = JSON.stringify([message.role, message.speaker, message.text, Boolean(message.hidden),
        message.send_time_ms ?? null]);
    return fnv1a(text) + djb2(text);
}

/**
 * Operations turning the fingerprints `known` (what the service holds) into `current` (the chat now).
 *
 * `messages[floor]` is the service message of each current floor. Floors from `frozenFrom` on are left as the
 * service holds them (a message being generated is not sent half-written), except that floors past the end of
 * the chat are still deleted. Returns a list of operations:
 *   {kind: 'add', messages: [...]}                 new floors at the end (one batch)
 *   {kind: 'edit', message}                        a floor whose message changed
 *   {kind: 'delete', floor, shift: false}          the last floor went (one per floor, highest first)
 *   {kind: 'delete', floor, shift: true}           one message removed in the middle, later floors moved down
 *   {kind: 'sync', messages: [...]}                the whole chat (unknown state, or many changes)
 */
export function diff(known, current, messages, { frozenFrom = Infinity } = {}) {
    const all = () => [{ kind: 'sync', messages: messages.slice(0, current.length) }];
    if (known === null || known === undefined) return all();
    const end = Math.min(current.length, frozenFrom);
    let p = 0;
    while (p < known.length && p < end && known[p] === current[p]) p++;
    if (p === end && known.length <= current.length) {
        // Everything up to the frozen floor agrees: only appends (never past the frozen floor).
        const adds = [];
        for (let f = known.length; f < end; f++) adds.push(messages[f]);
        return adds.length ? [{ kind: 'add', messages: adds }] : [];
    }
    // One message removed from the middle: the rest of the chat is the known chat shifted down one floor.
    if (current.length === known.length - 1 && frozenFrom >= current.length && p < current.length) {
        let same = true;
        for (let f = p; f < current.length && same; f++) same = current[f] === known[f + 1];
        if (same) return [{ kind: 'delete', floor: p, shift: true }];
    }
    const ops = [];
    const shared = Math.min(known.length, end);
    for (let f = p; f < shared; f++) {
        if (known[f] !== current[f]) ops.push({ kind: 'edit', message: messages[f] });
    }
    // A cut tail: floors the chat no longer has (frozen floors exist, so they are not cut).
    for (let f = known.length - 1; f >= current.length; f--) ops.push({ kind: 'delete', floor: f, shift: false });
    const adds = [];
    for (let f = known.length; f < end; f++) adds.push(messages[f]);
    if (adds.length) ops.push({ kind: 'add', messages: adds });
    const weight = ops.reduce((n, op) => n + (op.kind === 'add' ? op.messages.length : 1), 0);
    return weight > MAX_OPS ? all() : ops;
}

/** The fingerprints the service holds after `op` was applied to `known` (`null`: unknown). */
export function apply(known, op) {
    if (op.kind === 'sync') return op.messages.map(fingerprint);
    if (known === null || known === undefined) return null;
    const next = known.slice();
    if (op.kind === 'add') {
        for (const m of op.messages) {
            if (m.floor > next.length) return null; // a gap: the service state is no longer known exactly
            next[m.floor] = fingerprint(m);
        }
        return next;
    }
    if (op.kind === 'edit') {
        if (op.message.floor > next.length) return null;
        next[op.message.floor] = fingerprint(op.message);
        return next;
    }
    if (op.kind === 'delete') {
        if (op.floor >= next.length) return next;
        if (op.shift) next.splice(op.floor, 1);
        else if (op.floor === next.length - 1) next.pop();
        else return null; // a floor left empty in the middle: only a sync says what the service holds
        return next;
    }
    throw new Error(`unknown operation ${op.kind}`);
}
