// The extension itself, over an injectable environment (the page in SillyTavern; fakes and a real service under
// Node in the tests). See index.js for what it does and when.

import { Client } from './client.js';
import {
    frozenFrom, generationType, hostApi, placement, recallRequest, serviceChatId, toServiceMessage,
} from './host.js';
import { fingerprint } from './ledger.js';
import { Outbox } from './outbox.js';

export const MODULE = 'memory_recall';
export const PROMPT_KEY = 'memory_recall';
export const INTERCEPTOR = 'memoryRecallInterceptor';
export const DEFAULTS = Object.freeze({
    enabled: true, url: 'http://127.0.0.1:8765', token: '', position: 'prompt', depth: 4,
});
const FLUSH_BEFORE_RECALL_MS = 10000;
const RECALL_TIMEOUT_MS = 20000;
const INGEST_WAIT_MS = 15000;
const SYNC_POLL_MS = 1000;

/**
 * Start the extension.
 *
 * @param {object} env
 * @param {() => object} env.getContext  `SillyTavern.getContext`
 * @param {object|null} env.scriptModule  the page's `script.js` exports (`null`: not importable)
 * @param {Document|null} [env.document]  where the settings panel goes (`null`: no panel)
 * @param {object} [env.globalObject]  receives the generation interceptor (`globalThis`)
 * @param {typeof fetch} [env.fetch]
 * @param {() => string} [env.locale]
 * @returns the extension's state and entry points (the tests drive them)
 */
export function startExtension({ getContext, scriptModule, document = null, globalObject = globalThis,
    fetch = (...args) => globalThis.fetch(...args), locale = () => 'en' }) {
    const ctx = getContext;
    const api = hostApi(ctx(), scriptModule);
    const status = { connection: 'not checked yet', recall: '', error: '', lastInjected: null };
    const syncJobs = new Map(); // chat id → latest sync job seen
    let pendingType = null; // the type GENERATION_AFTER_COMMANDS announced (1.12.x interceptors get none)
    let generating = false;

    function settings() {
        const all = ctx().extensionSettings;
        const saved = all[MODULE] || {};
        if (saved.position === undefined && saved.depth !== undefined) {
            // Settings of 0.1: a depth only. Its default (9999, beyond what 1.12.x accepts; 'top') moves to the
            // prompt head; a depth the user chose stays in the chat history.
            saved.position = saved.depth === 9999 || saved.depth === 'top' ? 'prompt' : 'chat';
            if (saved.position === 'prompt') delete saved.depth;
        }
        all[MODULE] = Object.assign({}, DEFAULTS, saved);
        return all[MODULE];
    }

    const client = new Client(() => settings(), fetch);
    const currentChatId = () => serviceChatId(ctx().getCurrentChatId?.());

    // -- keeping the service in step --------------------------------------------------------------------------

    const memo = new WeakMap(); // SillyTavern message object → [key, service message, fingerprint]

    function toMillis(value) {
        if (typeof value === 'number') return Math.round(value);
        const moment = ctx().timestampToMoment?.(value);
        const ms = moment && typeof moment.valueOf === 'function' ? moment.valueOf() : Date.parse(String(value ?? ''));
        return Number.isFinite(ms) ? ms : undefined;
    }

    function serviceMessages(chat) {
        const messages = new Array(chat.length);
        const fps = new Array(chat.length);
        for (let floor = 0; floor < chat.length; floor++) {
            const m = chat[floor];
            const key = `${floor}\u0001${m?.mes}\u0001${m?.name}\u0001${m?.is_user}\u0001${m?.is_system}\u0001`
                + `${m?.send_date}\u0001${m?.extra?.type}`;
            let hit = m && typeof m === 'object' ? memo.get(m) : undefined;
            if (!hit || hit[0] !== key) {
                const message = toServiceMessage(m, floor, toMillis);
                hit = [key, message, fingerprint(message)];
                if (m && typeof m === 'object') memo.set(m, hit);
            }
            messages[floor] = hit[1];
            fps[floor] = hit[2];
        }
        return { messages, fps };
    }

    const outbox = new Outbox({
        send: async (chatId, op) => {
            const answer = await client.sendOp(chatId, op);
            if (op.kind === 'sync') watchSync(chatId, answer);
        },
        onState: () => render(),
        onRecovered: () => {
            // The service is back: send the open chat whole (it may have restarted without what it had).
            const id = currentChatId();
            if (id) outbox.markUnknown(id);
            reconcile();
        },
    });

    /** Queue what the service lacks of the open chat and start sending it (never waits for the network). */
    function reconcile() {
        const id = currentChatId();
        if (!settings().enabled || !id) return;
        const chat = ctx().chat || [];
        const { messages, fps } = serviceMessages(chat);
        outbox.reconcile(id, fps, messages, { frozenFrom: frozenFrom(chat, generating) });
        outbox.flush().catch((err) => console.warn('[memory-recall] flush failed:', err));
    }

    async function watchSync(chatId, job) {
        syncJobs.set(chatId, job);
        render();
        while (job && (job.state === 'ingesting' || job.state === 'embedding')) {
            await new Promise((resolve) => setTimeout(resolve, job.state === 'ingesting' ? 100 : SYNC_POLL_MS));
            let next;
            try {
                next = await client.call('GET', `/v1/chats/${encodeURIComponent(chatId)}/sync`, undefined,
                    { timeoutMs: 5000 });
            } catch (err) {
                status.error = `sync status: ${err.message}`;
                render();
                return;
            }
            if (syncJobs.get(chatId)?.job_id !== job.job_id) return; // a newer sync is being watched
            job = next;
            syncJobs.set(chatId, job);
            render();
        }
    }

    /** Until the chat's sync has written its messages (recall then sees the whole chat), at most `ms`. */
    async function ingested(chatId, ms) {
        const deadline = Date.now() + ms;
        while (syncJobs.get(chatId)?.state === 'ingesting' && Date.now() < deadline) {
            await new Promise((resolve) => setTimeout(resolve, 50));
        }
    }

    // -- recall -----------------------------------------------------------------------------------------------

    function inject(text) {
        const { position, depth } = placement(settings(), api);
        status.lastInjected = text || '';
        ctx().setExtensionPrompt(PROMPT_KEY, text || '', position, depth, false, api.systemRole);
    }

    async function interceptor(_chat, _contextSize, _abort, type) {
        const hostType = type ?? pendingType ?? 'normal';
        pendingType = null;
        const kind = generationType(hostType);
        const id = currentChatId();
        if (!settings().enabled || !id || kind === null) {
            inject('');
            return;
        }
        const started = Date.now();
        const ask = async () => {
            await outbox.flush({ chatId: id, deadlineMs: FLUSH_BEFORE_RECALL_MS });
            await ingested(id, INGEST_WAIT_MS);
            const c = ctx();
            const request = recallRequest({
                chatId: id, chat: c.chat || [], type: kind, names: { character: c.name2, user: c.name1 },
                locale: locale(), toMillis,
            });
            if (request === null) return null;
            return client.call('POST', '/v1/recall', request, { timeoutMs: RECALL_TIMEOUT_MS });
        };
        try {
            reconcile();
            let out;
            try {
                out = await ask();
            } catch (err) {
                if (err?.status !== 404) throw err;
                // The service does not hold this chat (its store was reset or moved): send it whole, ask again.
                outbox.markUnknown(id);
                reconcile();
                out = await ask();
            }
            if (out === null) {
                inject('');
                return;
            }
            const text = out.status === 'completed' ? out.injection_text : '';
            inject(text);
            const ms = Date.now() - started;
            const lexical = out.vectors_missing ? `, ${out.vectors_missing} node(s) without a vector yet` : '';
            status.recall = `${kind} → ${out.source}/${out.reason}: ${new TextEncoder().encode(text).length} bytes in `
                + `${ms} ms${lexical}`;
            status.error = '';
        } catch (err) {
            inject('');
            status.error = `recall: ${err.message || err}`;
            console.warn('[memory-recall] recall failed:', err);
        } finally {
            render();
        }
    }

    // -- settings panel ---------------------------------------------------------------------------------------

    function render() {
        const el = (id) => document?.getElementById(id);
        if (!el('memory_recall_status_connection')) return;
        const box = outbox.state();
        let connection = status.connection;
        if (box.failures) {
            const wait = Math.max(0, Math.round((box.retryAt - Date.now()) / 1000));
            connection = `Offline (${box.lastError}); retrying in ${wait} s, ${box.pending} change(s) waiting`;
        }
        el('memory_recall_status_connection').textContent = connection;
        const job = syncJobs.get(currentChatId());
        let sync = box.pending && !box.failures ? `Sending ${box.pending} change(s)…` : '';
        if (job) {
            if (job.state === 'ingesting') sync = `Syncing ${job.messages} messages…`;
            else if (job.state === 'embedding') {
                sync = `Synced ${job.messages} messages; vectors ${job.vectors_done} / ${job.vectors_total || '…'} `
                    + '(until then recall finds the rest by words only)';
            } else if (job.state === 'done') sync = `Synced ${job.messages} messages.`;
            else if (job.state === 'failed') sync = `Sync failed: ${job.error}`;
        }
        el('memory_recall_status_sync').textContent = sync;
        el('memory_recall_status_recall').textContent = status.recall ? `Last recall: ${status.recall}` : '';
        const error = status.error || (box.lastError && !box.failures ? box.lastError : '');
        el('memory_recall_status_error').textContent = error ? `Last error: ${error}` : '';
    }

    async function testConnection() {
        try {
            const v = await client.call('GET', '/v1/version', undefined, { timeoutMs: 5000 });
            status.connection = `Connected: memory-recall ${v.version}, embedding ${v.embedding_model || 'off (lexical)'}`;
            status.error = '';
            outbox.retryNow();
        } catch (err) {
            status.connection = `Not connected: ${err.message}`;
        }
        render();
    }

    function settingsPanel() {
        if (!document) return;
        const host = document.querySelector('#extensions_settings2') || document.querySelector('#extensions_settings');
        if (!host) return;
        host.insertAdjacentHTML('beforeend', `
    <div class="memory-recall-settings">
      <div class="inline-drawer">
        <div class="inline-drawer-toggle inline-drawer-header"><b>Memory Recall</b>
          <div class="inline-drawer-icon fa-solid fa-circle-chevron-down down"></div></div>
        <div class="inline-drawer-content">
          <label class="checkbox_label"><input id="memory_recall_enabled" type="checkbox"> Enabled</label>
          <label for="memory_recall_url">Service URL</label>
          <input id="memory_recall_url" class="text_pole" type="text" placeholder="http://127.0.0.1:8765">
          <label for="memory_recall_token">Token (only if the service has one)</label>
          <input id="memory_recall_token" class="text_pole" type="password" autocomplete="off">
          <label for="memory_recall_position">Where the memories go</label>
          <select id="memory_recall_position" class="text_pole">
            <option value="prompt">After the system prompt (never cut off in long chats)</option>
            <option value="chat">In the chat history, at the depth below</option>
          </select>
          <label for="memory_recall_depth">Depth in the chat history (messages from the end)</label>
          <input id="memory_recall_depth" class="text_pole" type="number" min="0">
          <div class="flex-container">
            <div id="memory_recall_test" class="menu_button">Test connection</div>
            <div id="memory_recall_sync" class="menu_button">Sync this chat</div>
          </div>
          <small id="memory_recall_status_connection"></small><br>
          <small id="memory_recall_status_sync"></small><br>
          <small id="memory_recall_status_recall"></small><br>
          <small id="memory_recall_status_error"></small>
        </div>
      </div>
    </div>`);
        const s = settings();
        const $ = (sel) => document.querySelector(sel);
        const bind = (sel, key, read) => {
            const el = $(sel);
            if (el.type === 'checkbox') el.checked = Boolean(s[key]); else el.value = s[key];
            el.addEventListener(el.tagName === 'SELECT' ? 'change' : 'input', () => {
                settings()[key] = read(el);
                ctx().saveSettingsDebounced?.();
            });
        };
        bind('#memory_recall_enabled', 'enabled', (el) => el.checked);
        bind('#memory_recall_url', 'url', (el) => el.value.trim());
        bind('#memory_recall_token', 'token', (el) => el.value.trim());
        bind('#memory_recall_position', 'position', (el) => (el.value === 'chat' ? 'chat' : 'prompt'));
        bind('#memory_recall_depth', 'depth', (el) => Math.max(0, Number(el.value) || 0));
        $('#memory_recall_test').addEventListener('click', testConnection);
        $('#memory_recall_sync').addEventListener('click', () => {
            const id = currentChatId();
            if (!id) return;
            outbox.markUnknown(id);
            reconcile();
        });
        setInterval(render, 1000);
    }

    // -- wiring -----------------------------------------------------------------------------------------------

    globalObject[INTERCEPTOR] = interceptor;
    const c = ctx();
    const ev = api.eventTypes;
    const on = (name, fn) => {
        if (name) c.eventSource.on(name, fn);
    };
    settingsPanel();
    on(ev.GENERATION_STARTED, (_type, _params, dryRun) => {
        if (!dryRun) generating = true;
    });
    on(ev.GENERATION_AFTER_COMMANDS, (type, _params, dryRun) => {
        if (dryRun) return;
        pendingType = type || 'normal';
        if (generationType(pendingType) === null) inject(''); // quiet/impersonate: 1.12.x runs no interceptor
    });
    const settle = () => {
        generating = false;
        reconcile();
    };
    on(ev.GENERATION_ENDED, settle);
    on(ev.GENERATION_STOPPED, settle);
    // MESSAGE_RECEIVED does not end a generation: 1.12.x also emits it when a streamed swipe starts, with the
    // "..." placeholder as the text (the reply stays frozen until GENERATION_ENDED).
    for (const name of ['MESSAGE_SENT', 'MESSAGE_RECEIVED', 'MESSAGE_EDITED', 'MESSAGE_UPDATED', 'MESSAGE_SWIPED',
        'MESSAGE_DELETED', 'MESSAGE_SWIPE_DELETED']) {
        on(ev[name], () => reconcile());
    }
    on(ev.CHAT_CHANGED, () => {
        inject('');
        status.recall = '';
        reconcile();
    });
    testConnection();
    reconcile();
    return { api, outbox, client, status, syncJobs, settings, reconcile, interceptor, testConnection };
}
