// The SillyTavern side: what differs between releases, and how a SillyTavern message becomes a service message.
// Everything reads the host through `SillyTavern.getContext()` (the API every release since 1.10 exposes) and the
// exports of the page's `script.js`; where releases differ (largest injection depth, interceptor arguments,
// prompt type constants in the context) it detects and adapts.

/** SillyTavern up to 1.12.x injects extension prompts at depths 0–1000 only (larger ones are dropped). */
export const FALLBACK_MAX_DEPTH = 1000;
/** `extension_prompt_types.IN_PROMPT` / `IN_CHAT` and `extension_prompt_roles.SYSTEM` in every release so far. */
export const IN_PROMPT = 0;
export const IN_CHAT = 1;
export const SYSTEM_ROLE = 0;

const HISTORY_TYPES = new Set(['regenerate', 'swipe', 'continue']);
const SKIP_TYPES = new Set(['quiet', 'impersonate']);
const LOCALE = /^[A-Za-z]{2,8}(?:-[A-Za-z0-9]{1,8})*$/;
const MAX_TEXT = 200000;
const MAX_NAME = 200;

/** The service's generation type for a SillyTavern one (`null`: no memory for this generation). */
export function generationType(type) {
    const t = String(type || 'normal');
    if (SKIP_TYPES.has(t)) return null;
    return HISTORY_TYPES.has(t) ? t : 'normal';
}

/** Chat ids as the service accepts them: letters, digits, spaces and _ - . : @ (1–128 characters). */
export function serviceChatId(id) {
    return String(id ?? '').replace(/[^\p{L}\p{Nd} _\-.:@]/gu, '_').replace(/\.\./g, '__').replace(/^[.\s]+/, '')
        .slice(0, 128).trim();
}

/** A system-generated SillyTavern message (help, welcome, narrator, comment …): never a memory. */
function isSystemMessage(m) {
    return typeof m?.extra?.type === 'string' && m.extra.type !== '';
}

/**
 * The service message of SillyTavern message `m` at `floor`: the text exactly as SillyTavern stored it (after
 * macro substitution and regex scripts), hidden messages (`/hide`) flagged, system messages as role `system`
 * (the service does not ingest them). `toMillis` turns SillyTavern's `send_date` into epoch milliseconds.
 */
export function toServiceMessage(m, floor, toMillis = defaultMillis) {
    const system = isSystemMessage(m);
    const message = {
        floor,
        role: m?.is_user ? 'user' : system ? 'system' : 'assistant',
        speaker: String(m?.name ?? '').slice(0, MAX_NAME),
        text: String(m?.mes ?? '').replaceAll('\u0000', '').slice(0, MAX_TEXT),
        hidden: Boolean(m?.is_system) && !system,
    };
    const ms = toMillis(m?.send_date);
    if (Number.isSafeInteger(ms) && ms >= 0) message.send_time_ms = ms;
    return message;
}

function defaultMillis(value) {
    if (typeof value === 'number') return Math.round(value);
    const ms = Date.parse(String(value ?? ''));
    return Number.isNaN(ms) ? undefined : ms;
}

/**
 * The floor a generation answers: the latest user message, before the message a swipe regenerates. SillyTavern
 * has already stored a newly sent message (interceptors run after it) and removed the reply a regenerate
 * replaces. `null` when the chat has no user message.
 */
export function targetUserFloor(chat, type) {
    let end = chat.length;
    if (type === 'swipe' && end && !chat[end - 1]?.is_user) end -= 1;
    for (let i = end - 1; i >= 0; i--) if (chat[i]?.is_user) return i;
    return null;
}

/**
 * Floors from which the chat is still being written: a message whose swipe is being generated (its `swipe_id`
 * points past its alternatives, the text is a placeholder), or the last non-user message while a generation
 * runs (a streamed reply grows in place). `Infinity` when nothing is being written.
 */
export function frozenFrom(chat, generating) {
    for (let i = 0; i < chat.length; i++) {
        const m = chat[i];
        if (Array.isArray(m?.swipes) && Number(m.swipe_id) >= m.swipes.length) return i;
    }
    if (generating && chat.length && !chat[chat.length - 1]?.is_user) return chat.length - 1;
    return Infinity;
}

/** A BCP-47 tag for the service's `locale` (English when the host's is unusable). */
export function localeTag(value) {
    const tag = String(value || '').replace('_', '-');
    return LOCALE.test(tag) && tag.length <= 35 ? tag : 'en';
}

/**
 * The release-dependent parts of the host. `scriptModule` is the page's `script.js` module (its exports), or
 * `null` when it could not be imported; `context` is `SillyTavern.getContext()`.
 */
export function hostApi(context, scriptModule) {
    const maxDepth = Number(scriptModule?.MAX_INJECTION_DEPTH) > 0
        ? Number(scriptModule.MAX_INJECTION_DEPTH) : FALLBACK_MAX_DEPTH;
    const types = scriptModule?.extension_prompt_types || context?.extension_prompt_types;
    const roles = scriptModule?.extension_prompt_roles || context?.extension_prompt_roles;
    return {
        maxDepth,
        inPrompt: Number.isInteger(types?.IN_PROMPT) ? types.IN_PROMPT : IN_PROMPT,
        inChat: Number.isInteger(types?.IN_CHAT) ? types.IN_CHAT : IN_CHAT,
        systemRole: Number.isInteger(roles?.SYSTEM) ? roles.SYSTEM : SYSTEM_ROLE,
        eventTypes: context?.eventTypes || context?.event_types || {},
    };
}

/** The depth to inject at in the chat history: the setting (a number), within what the host accepts. */
export function injectionDepth(setting, maxDepth) {
    const n = Number(setting);
    if (setting === null || setting === '' || !Number.isFinite(n)) return Math.min(DEFAULT_CHAT_DEPTH, maxDepth);
    return Math.max(0, Math.min(Math.floor(n), maxDepth));
}

/** Depth used when the block goes into the chat history and no valid depth is set. */
export const DEFAULT_CHAT_DEPTH = 4;

/**
 * Where the block goes: `{position, depth}` for `setExtensionPrompt`. `'prompt'` (the default): right after the
 * system prompt / story string, part of the prompt's fixed head, so it is never trimmed away when a long chat
 * fills the context (a block deep in the chat history falls out with the oldest messages: at depth 1000 a
 * 1,000-message chat never showed it). `'chat'`: in the chat history, `depth` messages from the end.
 */
export function placement(settings, api) {
    if (settings.position === 'chat') return { position: api.inChat, depth: injectionDepth(settings.depth, api.maxDepth) };
    return { position: api.inPrompt, depth: 0 };
}

/** The recall request of a generation of service type `type` on SillyTavern `chat`. */
export function recallRequest({ chatId, chat, type, names, locale, recent = 8, toMillis = defaultMillis }) {
    const target = targetUserFloor(chat, type);
    if (target === null) return null;
    const end = type === 'swipe' && chat.length && !chat[chat.length - 1]?.is_user ? chat.length - 1 : chat.length;
    const messages = [];
    for (let f = Math.max(0, end - recent); f < end; f++) messages.push(toServiceMessage(chat[f], f, toMillis));
    if (target < end - recent) messages.unshift(toServiceMessage(chat[target], target, toMillis));
    return {
        chat_id: chatId,
        messages,
        generation_type: type,
        target_user_floor: target,
        host_character_name: String(names?.character ?? '').slice(0, MAX_NAME),
        host_user_name: String(names?.user ?? '').slice(0, MAX_NAME),
        locale: localeTag(locale),
    };
}
