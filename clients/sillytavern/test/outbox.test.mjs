import assert from 'node:assert/strict';
import http from 'node:http';
import { test } from 'node:test';

import { Client, ServiceError } from '../lib/client.js';
import { fingerprint } from '../lib/ledger.js';
import { Outbox, RETRY_FIRST_MS, RETRY_MAX_MS } from '../lib/outbox.js';

const msg = (floor, text) => ({ floor, role: floor % 2 ? 'assistant' : 'user', speaker: 'x', text, hidden: false });
const chat = (...texts) => texts.map((t, i) => msg(i, t));

/** Timers the test fires by hand (no waiting). */
function manualTimers() {
    const timers = new Map();
    let next = 1;
    return {
        setTimer: (fn, ms) => {
            timers.set(next, { fn, ms });
            return next++;
        },
        clearTimer: (id) => timers.delete(id),
        pending: () => [...timers.values()].map((t) => t.ms),
        fire: async () => {
            const all = [...timers.entries()];
            timers.clear();
            for (const [, t] of all) t.fn();
            await new Promise((resolve) => setImmediate(resolve));
        },
    };
}

function scripted(outcomes) {
    const sent = [];
    const send = async (chatId, op) => {
        sent.push([chatId, op.kind, op.floor ?? op.message?.floor ?? op.messages?.map((m) => m.floor)]);
        const outcome = outcomes.shift();
        if (outcome === 'down') throw new ServiceError('service unreachable', { retryable: true });
        if (outcome === 'refused') throw new ServiceError('404: no message', { status: 404 });
    };
    return { sent, send };
}

test('operations go out in order, chat by chat, and update what the service holds', async () => {
    const { sent, send } = scripted([]);
    const box = new Outbox({ send });
    const a = chat('a0', 'a1');
    box.reconcile('A', a.map(fingerprint), a);
    const b = chat('b0');
    box.reconcile('B', b.map(fingerprint), b);
    const a2 = chat('a0', 'a1', 'a2');
    box.reconcile('A', a2.map(fingerprint), a2);
    await box.flush();
    assert.deepEqual(sent, [['A', 'sync', [0, 1]], ['A', 'add', [2]], ['B', 'sync', [0]]]);
    assert.deepEqual(box.known.get('A'), a2.map(fingerprint));
    assert.equal(box.pending(), 0);
});

test('a failure keeps the operation, backs off, retries in order and reports the recovery once', async () => {
    const timers = manualTimers();
    const { sent, send } = scripted(['down', 'down']);
    let recovered = 0;
    const box = new Outbox({ send, onRecovered: () => recovered++, ...timers });
    box.known.set('A', chat('a0').map(fingerprint));
    const c = chat('a0', 'a1');
    box.reconcile('A', c.map(fingerprint), c);
    await box.flush();
    assert.deepEqual(timers.pending(), [RETRY_FIRST_MS]);
    assert.equal(await box.flush({ chatId: 'A', deadlineMs: 5000 }), false); // the generation does not wait
    const c2 = chat('a0', 'a1', 'a2');
    box.reconcile('A', c2.map(fingerprint), c2); // a message sent during the outage
    await timers.fire();
    await box.flush();
    assert.deepEqual(timers.pending(), [2 * RETRY_FIRST_MS]);
    await timers.fire();
    await box.flush();
    assert.deepEqual(sent, [['A', 'add', [1]], ['A', 'add', [1]], ['A', 'add', [1]], ['A', 'add', [2]]]);
    assert.equal(recovered, 1);
    assert.deepEqual(box.known.get('A'), c2.map(fingerprint));
    assert.deepEqual(box.state(), { pending: 0, failures: 0, lastError: '', retryAt: 0 });
});

test('the back-off doubles up to its cap', async () => {
    const timers = manualTimers();
    const { send } = scripted(Array(10).fill('down'));
    const box = new Outbox({ send, ...timers });
    box.reconcile('A', [fingerprint(msg(0, 'x'))], [msg(0, 'x')]);
    const seen = [];
    for (let i = 0; i < 7; i++) {
        await box.flush();
        seen.push(...timers.pending());
        await timers.fire();
    }
    assert.deepEqual(seen, [1000, 2000, 4000, 8000, 16000, RETRY_MAX_MS, RETRY_MAX_MS]);
});

test('a refusal forgets the chat: the next reconcile sends it whole', async () => {
    const { sent, send } = scripted(['refused']);
    const box = new Outbox({ send });
    box.known.set('A', chat('a0', 'a1').map(fingerprint));
    const c = chat('a0');
    box.reconcile('A', c.map(fingerprint), c);
    await box.flush();
    assert.equal(box.known.get('A'), null);
    assert.equal(box.lastError, '404: no message');
    box.reconcile('A', c.map(fingerprint), c);
    await box.flush();
    assert.deepEqual(sent, [['A', 'delete', 1], ['A', 'sync', [0]]]);
});

test('a whole-chat sync supersedes what was queued', () => {
    const box = new Outbox({ send: async () => {} });
    box.known.set('A', chat('a0').map(fingerprint));
    const c = chat('a0', 'a1');
    box.reconcile('A', c.map(fingerprint), c);
    box.markUnknown('A');
    box.reconcile('A', c.map(fingerprint), c);
    assert.deepEqual(box.queues.get('A').map((op) => op.kind), ['sync']);
});

test('the client tells passing failures from refusals, against a real server', async () => {
    const server = http.createServer((req, res) => {
        const code = Number(req.url.split('/').pop());
        if (code === 0) return; // never answers: the timeout
        res.writeHead(code, { 'Content-Type': 'application/json' });
        res.end(JSON.stringify(code < 400 ? { ok: true, method: req.method } : { error: `status ${code}` }));
    });
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
    const url = `http://127.0.0.1:${server.address().port}`;
    const client = new Client(() => ({ url, token: 'tok' }));
    try {
        assert.deepEqual(await client.call('POST', '/x/200', {}), { ok: true, method: 'POST' });
        for (const [code, retryable] of [[503, true], [500, true], [429, true], [422, false], [404, false]]) {
            await assert.rejects(client.call('GET', `/x/${code}`), (err) => {
                assert.equal(err.status, code);
                assert.equal(err.retryable, retryable);
                assert.equal(err.message, `${code}: status ${code}`);
                return true;
            });
        }
        await assert.rejects(client.call('GET', '/x/0', undefined, { timeoutMs: 200 }),
            (err) => err.retryable === true && err.message === 'no answer within 0 s');
    } finally {
        server.closeAllConnections();
        await new Promise((resolve) => server.close(resolve));
    }
    await assert.rejects(client.call('GET', '/x/200'), (err) => err.retryable === true && err.status === 0
        && err.message.startsWith('service unreachable'));
});
