// The extension against a real `memory-recall serve` (MEMORY_RECALL_URL, started by the pytest wrapper
// tests/clients/test_sillytavern_extension.py), with the host faked in the shapes of SillyTavern 1.12.6 and of
// current releases. Covers what a browser run reaches only slowly: both API variants, the request sequence of
// each chat action, an outage in the middle of a chat.

import assert from 'node:assert/strict';
import http from 'node:http';
import { test } from 'node:test';

import { INTERCEPTOR, PROMPT_KEY, startExtension } from '../lib/extension.js';

const SERVICE = process.env.MEMORY_RECALL_URL;
const skip = SERVICE ? false : 'MEMORY_RECALL_URL is not set (run through pytest)';
const T0 = 1_700_000_000_000;
let chatCounter = 0;

/** SillyTavern's event emitter: `emit` awaits every listener in turn. */
class Emitter {
    constructor() {
        this.handlers = {};
    }
    on(name, fn) {
        (this.handlers[name] ||= []).push(fn);
    }
    async emit(name, ...args) {
        for (const fn of this.handlers[name] || []) await fn(...args);
    }
}

const EVENT_TYPES = {
    MESSAGE_SWIPED: 'message_swiped', MESSAGE_SENT: 'message_sent', MESSAGE_RECEIVED: 'message_received',
    MESSAGE_EDITED: 'message_edited', MESSAGE_DELETED: 'message_deleted', MESSAGE_UPDATED: 'message_updated',
    CHAT_CHANGED: 'chat_id_changed', GENERATION_AFTER_COMMANDS: 'GENERATION_AFTER_COMMANDS',
    GENERATION_STARTED: 'generation_started', GENERATION_STOPPED: 'generation_stopped',
    GENERATION_ENDED: 'generation_ended',
};

/** A fake host: `variant` '1.12' (interceptor without the type, no script.js) or 'current'. */
function fakeHost(variant, url, chat) {
    const prompts = [];
    const eventSource = new Emitter();
    const id = `node-${variant}-${++chatCounter}`;
    const context = {
        chat,
        name1: 'Ann',
        name2: 'Seraphina',
        eventSource,
        eventTypes: EVENT_TYPES,
        event_types: EVENT_TYPES,
        extensionSettings: { memory_recall: { url } },
        getCurrentChatId: () => id,
        saveSettingsDebounced: () => {},
        setExtensionPrompt: (key, value, position, depth, scan, role) => prompts.push({ key, value, position, depth, scan, role }),
    };
    const scriptModule = variant === '1.12' ? null : {
        MAX_INJECTION_DEPTH: 10000, extension_prompt_types: { IN_CHAT: 1 }, extension_prompt_roles: { SYSTEM: 0 },
    };
    const requests = [];
    const spy = async (input, init = {}) => {
        const body = init.body ? JSON.parse(init.body) : undefined;
        const path = new URL(input).pathname;
        // Progress polls of a sync run on their own clock: not part of what an action sends.
        if (!(init.method === 'GET' && path.endsWith('/sync'))) {
            requests.push(`${init.method} ${path}${body?.type ? ` ${body.type}` : ''}`);
        }
        return fetch(input, init);
    };
    const g = {};
    const ext = startExtension({ getContext: () => context, scriptModule, document: null, globalObject: g, fetch: spy });
    const host = {
        id, chat, prompts, requests, ext, context,
        /** A generation as SillyTavern runs it: events, then the awaited interceptor. */
        async generate(type) {
            await eventSource.emit(EVENT_TYPES.GENERATION_STARTED, type, {}, false);
            await eventSource.emit(EVENT_TYPES.GENERATION_AFTER_COMMANDS, type, {}, false);
            if (variant === '1.12') {
                if (type !== 'quiet') await g[INTERCEPTOR](chat, 4096, () => {});
            } else {
                await g[INTERCEPTOR](chat, 4096, () => {}, type);
            }
            return prompts.at(-1);
        },
        async send(text) {
            chat.push({ name: 'Ann', is_user: true, is_system: false, mes: text, send_date: T0 + chat.length });
            await eventSource.emit(EVENT_TYPES.MESSAGE_SENT, chat.length - 1);
            const prompt = await host.generate(undefined);
            await host.reply(`Reply ${chat.length}.`);
            return prompt;
        },
        async reply(text) {
            chat.push({ name: 'Seraphina', is_user: false, is_system: false, mes: text, send_date: T0 + chat.length,
                swipes: [text], swipe_id: 0 });
            await eventSource.emit(EVENT_TYPES.MESSAGE_RECEIVED, chat.length - 1);
            await eventSource.emit(EVENT_TYPES.GENERATION_ENDED, chat.length);
        },
        async settle() {
            await ext.outbox.flush();
            for (let i = 0; i < 200 && [...ext.syncJobs.values()].some((j) => j.state === 'ingesting'); i++) {
                await new Promise((resolve) => setTimeout(resolve, 25));
            }
        },
        async serviceTexts() {
            const graph = await (await fetch(`${url}/v1/chats/${encodeURIComponent(id)}/export`)).json();
            return graph.nodes.filter((n) => n.type === 'message' && !n.archived).sort((a, b) => a.seq - b.seq)
                .map((n) => n.fields.summary);
        },
    };
    return host;
}

const STORY = [
    'My name is Ann and I keep a brass key to the lighthouse under the loose third stair.',
    'Tonight the storm bell rang twice at the harbor.',
    'I think the captain of the Gull hid a silver map in the chapel.',
];

for (const variant of ['1.12', 'current']) {
    test(`${variant}: recall reaches the prompt; regenerate, swipe and continue replay it byte for byte`, { skip }, async () => {
        const host = fakeHost(variant, SERVICE, [{ name: 'Seraphina', is_user: false, mes: 'Welcome, traveller.', send_date: T0 }]);
        await host.context.eventSource.emit(EVENT_TYPES.CHAT_CHANGED, host.id);
        await host.settle();
        for (const line of STORY) await host.send(line);
        const prompt = await host.send('Where is the brass key to the lighthouse?');
        assert.deepEqual([prompt.key, prompt.position, prompt.depth, prompt.scan, prompt.role], [PROMPT_KEY, 0, 0, false, 0]);
        assert.ok(prompt.value.includes('loose third stair'), prompt.value);
        assert.ok(!prompt.value.includes('Where is the brass key'), 'the current turn is not a memory');
        // Regenerate: SillyTavern removes the reply (MESSAGE_DELETED), then generates for the same user floor.
        await host.settle();
        host.requests.length = 0;
        host.chat.pop();
        await host.context.eventSource.emit(EVENT_TYPES.MESSAGE_DELETED, host.chat.length);
        const again = await host.generate('regenerate');
        assert.equal(again.value, prompt.value);
        assert.deepEqual(host.requests, ['POST /v1/chats/' + encodeURIComponent(host.id) + '/events message_deleted',
            'POST /v1/recall']);
        await host.reply('Another reply.');
        const last = host.chat.at(-1);
        last.swipe_id = last.swipes.length; // swiping right to a new alternative: generated in place
        last.mes = '...';
        await host.context.eventSource.emit(EVENT_TYPES.MESSAGE_SWIPED, host.chat.length - 1);
        const swiped = await host.generate('swipe');
        assert.equal(swiped.value, prompt.value);
        last.swipes.push('A swiped reply.');
        last.mes = 'A swiped reply.';
        await host.context.eventSource.emit(EVENT_TYPES.MESSAGE_RECEIVED, host.chat.length - 1);
        await host.context.eventSource.emit(EVENT_TYPES.GENERATION_ENDED, host.chat.length);
        assert.equal((await host.generate('continue')).value, prompt.value);
        await host.context.eventSource.emit(EVENT_TYPES.GENERATION_ENDED, host.chat.length);
        await host.settle();
        const texts = await host.serviceTexts();
        assert.equal(texts.at(-1), 'A swiped reply.');
        assert.ok(!texts.includes('...'), 'the swipe placeholder never reached the service');
        // Quiet and impersonate generations get no memory block, and ask for no recall.
        await host.settle();
        host.requests.length = 0;
        for (const type of ['quiet', 'impersonate']) assert.equal((await host.generate(type)).value, '');
        assert.deepEqual(host.requests, []);
    });
}

test('an outage loses nothing: changes wait, the generation does not, the chat is whole once the service is back',
    { skip }, async () => {
        // A proxy in front of the real service that can stop listening (connection refused) and come back.
        const target = new URL(SERVICE);
        const sockets = new Set();
        const proxy = http.createServer((req, res) => {
            const out = http.request({ host: target.hostname, port: target.port, path: req.url, method: req.method,
                headers: req.headers }, (up) => {
                res.writeHead(up.statusCode, up.headers);
                up.pipe(res);
            });
            req.pipe(out);
        });
        proxy.on('connection', (s) => {
            sockets.add(s);
            s.on('close', () => sockets.delete(s));
        });
        await new Promise((resolve) => proxy.listen(0, '127.0.0.1', resolve));
        const port = proxy.address().port;
        const down = () => new Promise((resolve) => {
            proxy.close(resolve);
            for (const s of sockets) s.destroy();
        });
        const up = () => new Promise((resolve) => proxy.listen(port, '127.0.0.1', resolve));
        const host = fakeHost('current', `http://127.0.0.1:${port}`, []);
        try {
            await host.send('The lantern is hidden behind the organ pipes.');
            await host.settle();
            await down();
            const during = await host.send('The second key is in the well.');
            assert.equal(during.value, ''); // no block, but the generation went on
            await host.send('Tobin saw the captain at midnight.');
            assert.ok(host.ext.outbox.state().failures > 0);
            assert.ok(host.ext.outbox.pending(host.id) > 0);
            await up();
            await host.ext.testConnection(); // what "Test connection" does; the retry timer would do it too
            await host.settle();
            assert.deepEqual(await host.serviceTexts(), host.chat.map((m) => m.mes));
            assert.deepEqual(host.ext.outbox.state().failures, 0);
        } finally {
            await down().catch(() => {});
        }
    });

test('a deletion in the middle is one request; the service holds the chat as shown', { skip }, async () => {
    const host = fakeHost('1.12', SERVICE, []);
    for (const line of STORY) await host.send(line);
    await host.settle();
    host.requests.length = 0;
    host.chat.splice(2, 1); // the message delete of SillyTavern's edit menu
    await host.context.eventSource.emit(EVENT_TYPES.MESSAGE_DELETED, host.chat.length);
    await host.settle();
    assert.deepEqual(host.requests, [`POST /v1/chats/${encodeURIComponent(host.id)}/events message_deleted`]);
    assert.deepEqual(await host.serviceTexts(), host.chat.map((m) => m.mes));
    // /hide has no event: the next generation's reconcile sends it.
    host.chat[0].is_system = true;
    host.requests.length = 0;
    await host.send('What rang at the harbor?');
    assert.equal(host.requests[0], `POST /v1/chats/${encodeURIComponent(host.id)}/events message_edited`);
});

test('a service that lost the chat gets it whole from the recall that finds it missing', { skip }, async () => {
    const host = fakeHost('current', SERVICE, []);
    for (const line of STORY) await host.send(line);
    const first = await host.send('What did the captain hide in the chapel?');
    assert.ok(first.value.includes('silver map'), first.value);
    await host.settle();
    // The store was reset behind the extension's back: the service no longer knows the chat.
    const chat = `/v1/chats/${encodeURIComponent(host.id)}`;
    assert.equal((await fetch(`${SERVICE}${chat}`, { method: 'DELETE' })).status, 200);
    host.requests.length = 0;
    const again = await host.generate('regenerate');
    assert.deepEqual(host.requests, ['POST /v1/recall', `POST ${chat}/sync`, 'POST /v1/recall']);
    assert.ok(again.value.includes('silver map'), again.value);
    assert.equal(host.ext.status.error, '');
    await host.settle();
    assert.deepEqual(await host.serviceTexts(), host.chat.map((m) => m.mes));
});

for (const [variant, limit] of [['1.12', 1000], ['current', 10000]]) {
    test(`${variant}: a depth in the chat history stays within what the host accepts (settings of 0.1 migrate)`,
        { skip }, async () => {
            const host = fakeHost(variant, SERVICE, []);
            const s = host.context.extensionSettings.memory_recall;
            Object.assign(s, { depth: 9999 }); // 0.1 saved only a depth: its default moves to the prompt head
            delete s.position;
            await host.send(STORY[0]);
            const head = host.prompts.at(-1);
            assert.deepEqual([head.position, head.depth, host.ext.settings().position], [0, 0, 'prompt']);
            host.context.extensionSettings.memory_recall = { url: SERVICE, depth: 12000, position: 'chat' };
            await host.send(STORY[1]);
            const deep = host.prompts.at(-1);
            assert.deepEqual([deep.position, deep.depth], [1, limit]);
            assert.ok(deep.value.includes('lighthouse'), deep.value);
        });
}
