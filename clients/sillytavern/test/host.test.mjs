import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
    DEFAULT_CHAT_DEPTH, FALLBACK_MAX_DEPTH, frozenFrom, generationType, hostApi, injectionDepth, localeTag, placement, recallRequest, serviceChatId,
    targetUserFloor, toServiceMessage,
} from '../lib/host.js';

const user = (mes, extra = {}) => ({ name: 'Ann', is_user: true, is_system: false, mes, send_date: 1700000000000, ...extra });
const bot = (mes, extra = {}) => ({ name: 'Seraphina', is_user: false, is_system: false, mes, send_date: 1700000000000, ...extra });

test('host releases: 1.12.x limits without script.js, the exports of newer releases when present', () => {
    const old = hostApi({ eventTypes: { MESSAGE_SENT: 'message_sent' } }, null);
    assert.deepEqual(old, {
        maxDepth: FALLBACK_MAX_DEPTH, inPrompt: 0, inChat: 1, systemRole: 0, eventTypes: { MESSAGE_SENT: 'message_sent' },
    });
    const v1126 = hostApi({ event_types: { A: 'a' } }, {
        MAX_INJECTION_DEPTH: 1000, extension_prompt_types: { IN_PROMPT: 0, IN_CHAT: 1 }, extension_prompt_roles: { SYSTEM: 0 },
    });
    assert.deepEqual(v1126, { maxDepth: 1000, inPrompt: 0, inChat: 1, systemRole: 0, eventTypes: { A: 'a' } });
    const v119 = hostApi({ eventTypes: {} }, {
        MAX_INJECTION_DEPTH: 10000, extension_prompt_types: { IN_CHAT: 1 }, extension_prompt_roles: { SYSTEM: 0 },
    });
    assert.equal(v119.maxDepth, 10000);
});

test('placement: after the system prompt by default; in the chat at a depth within the host limit', () => {
    const api = { inPrompt: 0, inChat: 1, maxDepth: 1000 };
    assert.deepEqual(placement({}, api), { position: 0, depth: 0 });
    assert.deepEqual(placement({ position: 'prompt', depth: 7 }, api), { position: 0, depth: 0 });
    assert.deepEqual(placement({ position: 'chat', depth: 9999 }, api), { position: 1, depth: 1000 });
    assert.deepEqual(placement({ position: 'chat', depth: 9999 }, { ...api, maxDepth: 10000 }), { position: 1, depth: 9999 });
    assert.deepEqual(placement({ position: 'chat', depth: 2 }, api), { position: 1, depth: 2 });
    assert.equal(injectionDepth(-3, 1000), 0);
    assert.equal(injectionDepth('abc', 1000), DEFAULT_CHAT_DEPTH);
    assert.equal(injectionDepth(null, 1000), DEFAULT_CHAT_DEPTH);
});

test('generation types: quiet and impersonate get no memory, unknown types count as a new turn', () => {
    assert.deepEqual(['normal', undefined, 'regenerate', 'swipe', 'continue', 'quiet', 'impersonate', 'ask_command']
        .map(generationType), ['normal', 'normal', 'regenerate', 'swipe', 'continue', null, null, 'normal']);
});

test('messages as stored: text after macros, hidden flag, system messages, send time', () => {
    assert.deepEqual(toServiceMessage(user('tell Seraphina hi'), 3), {
        floor: 3, role: 'user', speaker: 'Ann', text: 'tell Seraphina hi', hidden: false, send_time_ms: 1700000000000,
    });
    assert.deepEqual(toServiceMessage(bot('x', { is_system: true }), 1).hidden, true);
    assert.deepEqual(toServiceMessage(bot('help text', { is_system: true, extra: { type: 'help' } }), 0).role, 'system');
    assert.deepEqual(toServiceMessage(bot('narration', { extra: { type: 'narrator' } }), 0).role, 'system');
    const m = toServiceMessage({ name: 'A', is_user: false, mes: 'a\u0000b', send_date: 'not a date' }, 0);
    assert.deepEqual(m, { floor: 0, role: 'assistant', speaker: 'A', text: 'ab', hidden: false });
});

test('the floor a generation answers', () => {
    const c = [bot('greeting'), user('q1'), bot('a1'), user('q2'), bot('a2')];
    assert.equal(targetUserFloor(c, 'normal'), 3);
    assert.equal(targetUserFloor(c, 'continue'), 3);
    assert.equal(targetUserFloor(c, 'swipe'), 3);
    assert.equal(targetUserFloor(c.slice(0, 4), 'regenerate'), 3);
    assert.equal(targetUserFloor([bot('greeting')], 'normal'), null);
});

test('floors still being written', () => {
    const c = [user('q'), bot('a', { swipes: ['a'], swipe_id: 0 })];
    assert.equal(frozenFrom(c, false), Infinity);
    assert.equal(frozenFrom(c, true), 1); // a streamed reply grows in place
    assert.equal(frozenFrom([user('q')], true), Infinity);
    const swiping = [user('q'), bot('...', { swipes: ['a'], swipe_id: 1 })];
    assert.equal(frozenFrom(swiping, false), 1); // the swipe being generated shows a placeholder
});

test('the recall request of a generation', () => {
    const c = [bot('greeting'), user('q1'), bot('a1'), user('q2'), bot('a2')];
    const req = recallRequest({ chatId: 'c', chat: c, type: 'swipe', names: { character: 'Seraphina', user: 'Ann' },
        locale: 'zh_CN', recent: 3, toMillis: () => undefined });
    assert.deepEqual(req, {
        chat_id: 'c',
        messages: [
            { floor: 1, role: 'user', speaker: 'Ann', text: 'q1', hidden: false },
            { floor: 2, role: 'assistant', speaker: 'Seraphina', text: 'a1', hidden: false },
            { floor: 3, role: 'user', speaker: 'Ann', text: 'q2', hidden: false },
        ],
        generation_type: 'swipe', target_user_floor: 3, host_character_name: 'Seraphina', host_user_name: 'Ann',
        locale: 'zh-CN',
    });
    const far = recallRequest({ chatId: 'c', chat: [user('q0'), ...Array.from({ length: 5 }, (_, i) => bot(`b${i}`))],
        type: 'continue', names: {}, locale: 'not a tag!', recent: 2, toMillis: () => undefined });
    assert.deepEqual(far.messages.map((m) => m.floor), [0, 4, 5]);
    assert.equal(far.locale, 'en');
    assert.equal(recallRequest({ chatId: 'c', chat: [bot('hi')], type: 'normal', names: {} }), null);
});

test('chat ids as the service accepts them', () => {
    assert.equal(serviceChatId('Seraphina - 2024-9-28@12h30m05s'), 'Seraphina - 2024-9-28@12h30m05s');
    assert.equal(serviceChatId('a/b\\c..d'), 'a_b_c__d');
    assert.equal(serviceChatId(undefined), '');
    assert.equal(localeTag('en-US'), 'en-US');
});
