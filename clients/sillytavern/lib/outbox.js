// The outbox: what the service must still be told about each chat, sent in order, retried until it lands.
// No DOM and no SillyTavern here (tested under Node); `send` does the HTTP.
//
// Per chat it keeps `known` (the fingerprints the service acknowledged, `null` when unknown) and a queue of
// operations not yet acknowledged. `reconcile` compares the chat as it is now with what the service will hold
// once the queue is sent, and queues the difference, so a missed host event, a change made while the service
// was down, or a host action without an event (`/hide`) is caught the next time anything reconciles. Queues are
// sent one operation at a time, chats in the order they first queued something. A failure that may pass
// (network, timeout, 5xx, 429) keeps the operation at the head and retries after a back-off (1 s doubling to
// 30 s); a refusal (other 4xx: the service does not hold what this side thought) drops the chat's queue and
// marks it unknown, so the next reconcile sends the whole chat. When the service answers again after a
// failure, `onRecovered` runs (the extension then re-syncs the open chat).

import { apply, diff } from './ledger.js';

export const RETRY_FIRST_MS = 1000;
export const RETRY_MAX_MS = 30000;

export class Outbox {
    /**
     * @param {object} opts
     * @param {(chatId: string, op: object) => Promise<void>} opts.send  sends one operation; throws an error with
     *     `retryable: true` for failures that may pass
     * @param {(state: object) => void} [opts.onState]  called after every change of `state()`
     * @param {() => void} [opts.onRecovered]  the service answered again after a failure
     * @param {(fn: () => void, ms: number) => any} [opts.setTimer]
     * @param {(handle: any) => void} [opts.clearTimer]
     */
    constructor({
        send, onState = () => {}, onRecovered = () => {},
        // Wrapped: a browser refuses setTimeout called as a method of another object ("Illegal invocation").
        setTimer = (fn, ms) => setTimeout(fn, ms), clearTimer = (handle) => clearTimeout(handle),
    }) {
        this.send = send;
        this.onState = onState;
        this.onRecovered = onRecovered;
        this.setTimer = setTimer;
        this.clearTimer = clearTimer;
        this.known = new Map();
        this.queues = new Map();
        this.failures = 0;
        this.lastError = '';
        this.retryAt = 0;
        this.timer = null;
        this.running = null;
    }

    /** What the service will hold of `chatId` once its queue is sent (`null`: unknown). */
    projected(chatId) {
        let fps = this.known.has(chatId) ? this.known.get(chatId) : null;
        for (const op of this.queues.get(chatId) || []) fps = apply(fps, op);
        return fps;
    }

    /** Forget what the service holds of `chatId`: the next reconcile sends the whole chat. */
    markUnknown(chatId) {
        this.known.set(chatId, null);
        this.queues.delete(chatId);
        this.changed();
    }

    /** Queue what `current` (fingerprints, with `messages[floor]`) differs in; returns the operations queued. */
    reconcile(chatId, current, messages, { frozenFrom = Infinity } = {}) {
        const ops = diff(this.projected(chatId), current, messages, { frozenFrom });
        if (!ops.length) return ops;
        if (ops.some((op) => op.kind === 'sync')) {
            this.queues.set(chatId, ops); // the whole chat supersedes whatever was queued
        } else {
            this.queues.set(chatId, [...(this.queues.get(chatId) || []), ...ops]);
        }
        this.changed();
        return ops;
    }

    pending(chatId) {
        return chatId === undefined
            ? [...this.queues.values()].reduce((n, q) => n + q.length, 0)
            : (this.queues.get(chatId) || []).length;
    }

    state() {
        return { pending: this.pending(), failures: this.failures, lastError: this.lastError, retryAt: this.retryAt };
    }

    changed() {
        this.onState(this.state());
    }

    /**
     * Send what is queued (all chats). Resolves when the queues are empty or a failure stopped the run (a retry
     * is then scheduled; until it fires, flushing sends nothing). With `chatId` and `deadlineMs`, resolves to
     * whether the chat's queue is empty, at the latest after `deadlineMs` (the generation waits that long at
     * most) and at once while a back-off is running.
     */
    flush({ chatId, deadlineMs } = {}) {
        if (this.timer && !this.running) {
            // Backing off after a failure: the retry timer (or retryNow) sends next, not every chat event.
            return Promise.resolve(deadlineMs === undefined ? undefined : this.pending(chatId) === 0);
        }
        if (!this.running) {
            this.running = this.drain().finally(() => {
                this.running = null;
            });
        }
        if (deadlineMs === undefined) return this.running;
        if (this.failures && this.pending(chatId)) return Promise.resolve(false);
        let timer;
        const timeout = new Promise((resolve) => {
            timer = this.setTimer(() => resolve(false), deadlineMs);
        });
        return Promise.race([this.running.then(() => this.pending(chatId) === 0), timeout]).finally(() => {
            this.clearTimer(timer);
        });
    }

    async drain() {
        for (;;) {
            const chatId = [...this.queues.keys()].find((id) => this.queues.get(id).length);
            if (chatId === undefined) return;
            const queue = this.queues.get(chatId);
            const op = queue[0];
            try {
                await this.send(chatId, op);
            } catch (err) {
                if (err && err.retryable) {
                    this.failed(err);
                    return;
                }
                // Refused: this side's idea of the service's chat is wrong. Start over with the whole chat.
                this.lastError = String(err?.message || err);
                this.known.set(chatId, null);
                this.queues.delete(chatId);
                this.changed();
                continue;
            }
            if (this.queues.get(chatId) === queue && queue[0] === op) queue.shift();
            if (!queue.length && this.queues.get(chatId) === queue) this.queues.delete(chatId);
            this.known.set(chatId, apply(this.known.has(chatId) ? this.known.get(chatId) : null, op));
            if (this.failures) {
                this.failures = 0;
                this.retryAt = 0;
                this.lastError = '';
                this.changed();
                this.onRecovered();
            } else {
                this.changed();
            }
        }
    }

    failed(err) {
        this.failures += 1;
        this.lastError = String(err?.message || err);
        const delay = Math.min(RETRY_FIRST_MS * 2 ** (this.failures - 1), RETRY_MAX_MS);
        this.retryAt = Date.now() + delay;
        if (this.timer) this.clearTimer(this.timer);
        this.timer = this.setTimer(() => {
            this.timer = null;
            this.flush();
        }, delay);
        this.changed();
    }

    /** Retry now (e.g. the user pressed "Test connection" and the service answered). */
    retryNow() {
        if (this.timer) this.clearTimer(this.timer);
        this.timer = null;
        return this.flush();
    }
}
