// Memory Recall for SillyTavern: asks a local `memory-recall serve` for the memories of each turn and injects
// them into the prompt (lib/extension.js holds the logic; this file hands it the page).
//
// Recall runs in the generation interceptor (manifest `generate_interceptor`), the one hook every SillyTavern
// release awaits before it builds the prompt, for Chat and Text Completion alike. It runs after SillyTavern
// stored the user's message (macros substituted, regex scripts applied) and removed the reply a regenerate
// replaces. The interceptor first sends the service what it does not know yet (lib/outbox.js), then asks for
// the recall of the user floor the generation answers: a new turn recalls afresh; regenerate, swipe and
// continue replay that floor's memories byte for byte. Quiet and impersonate generations get no memory block.
// The chat is kept in step by comparing what the service holds with the chat after every chat event and before
// every generation (lib/ledger.js): nothing is lost while the service is down, a deletion costs one request
// however long the chat, and a chat opened for the first time is sent whole (the service answers at once and
// embeds in the background; recall works meanwhile).

import { startExtension } from './lib/extension.js';

async function scriptModule() {
    // The page's script.js, found from this file's URL (SillyTavern may be served below a path prefix, and the
    // extension may sit at any depth below scripts/extensions/).
    const url = String(import.meta.url);
    const at = url.indexOf('/scripts/extensions/');
    if (at < 0) return null;
    try {
        return await import(url.slice(0, at) + '/script.js');
    } catch (err) {
        console.warn('[memory-recall] script.js is not importable; using the 1.12.x limits:', err);
        return null;
    }
}

function locale() {
    try {
        return globalThis.localStorage?.getItem('language') || globalThis.navigator?.language || 'en';
    } catch {
        return 'en';
    }
}

const extension = startExtension({
    getContext: () => SillyTavern.getContext(),
    scriptModule: await scriptModule(),
    document,
    globalObject: globalThis,
    locale,
});
console.info(`[memory-recall] loaded (largest injection depth ${extension.api.maxDepth})`);
