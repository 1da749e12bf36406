// Memory Recall for SillyTavern: asks a local `memory-recall serve` for the memories of each turn and injects
// them into the prompt. Two hook points (reference §2.1):
//   GENERATION_AFTER_COMMANDS       compute the recall of a new user turn, or replay it on
//                                   regenerate / swipe / continue (same user floor → same text, byte for byte);
//   GENERATE_BEFORE_COMBINE_PROMPTS fallback when the first hook did not run for this generation.
// Chat events (sent, received, edited, swiped, deleted) keep the service's memory graph in step with the chat.

const MODULE = 'memory_recall';
const PROMPT_KEY = 'memory_recall';
const HISTORY_TYPES = new Set(['regenerate', 'swipe', 'continue']);
const SKIP_TYPES = new Set(['quiet', 'impersonate']);
const RECENT_MESSAGES = 8;
const BATCH_BYTES = 1_500_000; // under the service's default 2 MiB body limit
const DEFAULTS = { enabled: true, url: 'http://127.0.0.1:8765', token: '', depth: 9999, timeoutMs: 20000 };

const ctx = () => SillyTavern.getContext();
let lastRecallAt = 0; // when the after-commands hook last produced a result (the fallback skips if recent)
const knownLength = new Map(); // chat id → message count the service has seen

function settings() {
    const all = ctx().extensionSettings;
    all[MODULE] = Object.assign({}, DEFAULTS, all[MODULE] || {});
    return all[MODULE];
}

function chatId() {
    const id = String(ctx().getCurrentChatId?.() ?? '');
    // The service accepts letters, digits, spaces and _ - . : @ (1–128 characters).
    return id.replace(/[^\p{L}\p{Nd} _\-.:@]/gu, '_').replace(/\.\./g, '__').replace(/^[.\s]+/, '').slice(0, 128).trim();
}

function toMessage(m, floor) {
    const narrator = m?.extra?.type === 'narrator' || m?.extra?.type === 'system';
    return {
        floor,
        role: m.is_user ? 'user' : narrator ? 'system' : 'assistant',
        speaker: String(m.name ?? '').slice(0, 200),
        text: String(m.mes ?? '').replaceAll('\u0000', ''),
        hidden: Boolean(m.is_system) && !narrator,
    };
}

async function call(method, path, body) {
    const s = settings();
    const headers = { 'Content-Type': 'application/json' };
    if (s.token) headers.Authorization = `Bearer ${s.token}`;
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), s.timeoutMs);
    try {
        const r = await fetch(s.url.replace(/\/+$/, '') + path, {
            method, headers, body: body === undefined ? undefined : JSON.stringify(body), signal: abort.signal,
        });
        const data = await r.json().catch(() => ({}));
        if (!r.ok) throw new Error(`${r.status}: ${data.error || r.statusText}`);
        return data;
    } finally {
        clearTimeout(timer);
    }
}

function inject(text) {
    const c = ctx();
    const position = c.extension_prompt_types?.IN_CHAT ?? 1;
    const role = c.extension_prompt_roles?.SYSTEM ?? 0;
    c.setExtensionPrompt(PROMPT_KEY, text || '', position, Number(settings().depth) || 0, false, role);
}

function latestUserFloor(chat) {
    for (let i = chat.length - 1; i >= 0; i--) if (chat[i].is_user) return i;
    return null;
}

// -- recall hook ------------------------------------------------------------------------------------------------

async function recall(type, hook) {
    const s = settings();
    const id = chatId();
    if (!s.enabled || !id || SKIP_TYPES.has(type)) return;
    const chat = ctx().chat || [];
    const messages = chat.map(toMessage).slice(-RECENT_MESSAGES);
    let target = latestUserFloor(chat);
    let query = '';
    if (!HISTORY_TYPES.has(type)) {
        // Stock SillyTavern appends the typed message only after this hook: it becomes floor chat.length.
        const typed = String(document.querySelector('#send_textarea')?.value ?? '').trim();
        if (typed) {
            target = chat.length;
            query = typed;
            messages.push({ floor: target, role: 'user', speaker: String(ctx().name1 ?? ''), text: typed });
        }
    }
    if (target === null) return inject('');
    try {
        const out = await call('POST', '/v1/recall', {
            chat_id: id, messages, generation_type: HISTORY_TYPES.has(type) ? type : 'normal',
            target_user_floor: target, query_text: query,
            host_character_name: String(ctx().name2 ?? '').slice(0, 200), host_user_name: String(ctx().name1 ?? '').slice(0, 200),
        });
        inject(out.status === 'completed' ? out.injection_text : '');
        lastRecallAt = Date.now();
        console.debug(`[memory-recall] ${hook} ${type}: ${out.status}/${out.reason} (${out.source})`);
    } catch (err) {
        inject('');
        console.warn('[memory-recall] recall failed:', err);
    }
}

// -- chat events ------------------------------------------------------------------------------------------------

async function postEvent(event) {
    const id = chatId();
    if (!settings().enabled || !id) return;
    try {
        await call('POST', `/v1/chats/${encodeURIComponent(id)}/events`, event);
    } catch (err) {
        console.warn('[memory-recall] event failed:', event.type, err);
    }
}

async function syncChat() {
    // Re-sending a chat is idempotent: unchanged floors write nothing. Batches stay under the body limit.
    const chat = ctx().chat || [];
    let batch = [];
    let size = 0;
    for (const [floor, m] of chat.entries()) {
        const msg = toMessage(m, floor);
        const bytes = JSON.stringify(msg).length * 3;
        if (batch.length && size + bytes > BATCH_BYTES) {
            await postEvent({ type: 'message_added', messages: batch });
            batch = [];
            size = 0;
        }
        batch.push(msg);
        size += bytes;
    }
    if (batch.length) await postEvent({ type: 'message_added', messages: batch });
    knownLength.set(chatId(), chat.length);
}

function messageEvent(type) {
    return async (index) => {
        const chat = ctx().chat || [];
        const i = Number(index);
        if (!Number.isInteger(i) || !chat[i]) return;
        await postEvent({ type, message: toMessage(chat[i], i) });
        knownLength.set(chatId(), Math.max(knownLength.get(chatId()) ?? 0, chat.length));
    };
}

async function onDeleted(newLength) {
    // Deleting shifts the later messages down one floor: re-sync what is left, retire the floors past the end.
    const id = chatId();
    const before = knownLength.get(id) ?? Number(newLength) + 1;
    await syncChat();
    for (let floor = before - 1; floor >= Number(newLength); floor--) await postEvent({ type: 'message_deleted', floor });
}

// -- settings panel ---------------------------------------------------------------------------------------------

function settingsPanel() {
    const s = settings();
    const html = `
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
          <label for="memory_recall_depth">Injection depth</label>
          <input id="memory_recall_depth" class="text_pole" type="number" min="0">
          <div class="flex-container">
            <div id="memory_recall_test" class="menu_button">Test connection</div>
            <div id="memory_recall_sync" class="menu_button">Sync this chat</div>
          </div>
          <small id="memory_recall_status"></small>
        </div>
      </div>
    </div>`;
    const host = document.querySelector('#extensions_settings2') || document.querySelector('#extensions_settings');
    if (!host) return;
    host.insertAdjacentHTML('beforeend', html);
    const $ = (sel) => document.querySelector(sel);
    const status = (text) => { $('#memory_recall_status').textContent = text; };
    const bind = (sel, key, read) => {
        const el = $(sel);
        if (el.type === 'checkbox') el.checked = Boolean(s[key]); else el.value = s[key];
        el.addEventListener('input', () => { settings()[key] = read(el); ctx().saveSettingsDebounced(); });
    };
    bind('#memory_recall_enabled', 'enabled', (el) => el.checked);
    bind('#memory_recall_url', 'url', (el) => el.value.trim());
    bind('#memory_recall_token', 'token', (el) => el.value.trim());
    bind('#memory_recall_depth', 'depth', (el) => Number(el.value) || 0);
    $('#memory_recall_test').addEventListener('click', async () => {
        try {
            const v = await call('GET', '/v1/version');
            status(`Connected: memory-recall ${v.version}, embedding ${v.embedding_model || 'off (lexical)'}`);
        } catch (err) {
            status(`Not connected: ${err.message}`);
        }
    });
    $('#memory_recall_sync').addEventListener('click', async () => {
        status('Syncing…');
        await syncChat();
        status(`Synced ${(ctx().chat || []).length} messages.`);
    });
}

// -- wiring -----------------------------------------------------------------------------------------------------

(function init() {
    const c = ctx();
    const ev = c.eventTypes || c.event_types;
    const on = (name, fn) => { if (name) c.eventSource.on(name, fn); };
    settingsPanel();
    on(ev.GENERATION_AFTER_COMMANDS, async (type, _params, dryRun) => {
        if (!dryRun) await recall(type || 'normal', 'after-commands');
    });
    on(ev.GENERATE_BEFORE_COMBINE_PROMPTS, async () => {
        if (Date.now() - lastRecallAt > 5000) await recall('normal', 'before-combine');
    });
    on(ev.MESSAGE_SENT, messageEvent('message_added'));
    on(ev.MESSAGE_RECEIVED, messageEvent('message_added'));
    on(ev.MESSAGE_EDITED, messageEvent('message_edited'));
    on(ev.MESSAGE_SWIPED, messageEvent('message_swiped'));
    on(ev.MESSAGE_DELETED, onDeleted);
    on(ev.CHAT_CHANGED, () => { inject(''); syncChat(); });
})();
