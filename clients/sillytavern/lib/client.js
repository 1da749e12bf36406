// HTTP calls to `memory-recall serve` (fetch; works in the browser and under Node 18+).

/** A failed call. `retryable`: the service may accept it later (down, timeout, 5xx, 429). */
export class ServiceError extends Error {
    constructor(message, { status = 0, retryable = false } = {}) {
        super(message);
        this.name = 'ServiceError';
        this.status = status;
        this.retryable = retryable;
    }
}

export class Client {
    /**
     * @param {() => {url: string, token: string}} settings  read at every call (the panel may change them)
     * @param {typeof fetch} [fetchImpl]
     */
    constructor(settings, fetchImpl = (...args) => globalThis.fetch(...args)) {
        this.settings = settings;
        this.fetch = fetchImpl;
    }

    /** `method path` with a JSON body; resolves to the JSON answer, rejects with a {@link ServiceError}. */
    async call(method, path, body, { timeoutMs = 20000 } = {}) {
        const { url, token } = this.settings();
        const headers = { 'Content-Type': 'application/json' };
        if (token) headers.Authorization = `Bearer ${token}`;
        const abort = new AbortController();
        const timer = setTimeout(() => abort.abort(), timeoutMs);
        let response;
        try {
            response = await this.fetch(String(url).replace(/\/+$/, '') + path, {
                method, headers, body: body === undefined ? undefined : JSON.stringify(body), signal: abort.signal,
            });
        } catch (err) {
            const timedOut = abort.signal.aborted;
            throw new ServiceError(timedOut ? `no answer within ${Math.round(timeoutMs / 1000)} s`
                : `service unreachable (${err?.message || err})`, { retryable: true });
        } finally {
            clearTimeout(timer);
        }
        let data = {};
        try {
            data = await response.json();
        } catch {
            data = {};
        }
        if (!response.ok) {
            const status = response.status;
            const retryable = status >= 500 || status === 429 || status === 408;
            throw new ServiceError(`${status}: ${data.error || response.statusText || 'error'}`, { status, retryable });
        }
        return data;
    }

    /** One outbox operation (see lib/ledger.js) as the service's event or sync call. */
    async sendOp(chatId, op) {
        const chat = `/v1/chats/${encodeURIComponent(chatId)}`;
        if (op.kind === 'sync') return this.call('POST', `${chat}/sync`, { messages: op.messages }, { timeoutMs: 60000 });
        if (op.kind === 'add') {
            const event = op.messages.length === 1
                ? { type: 'message_added', message: op.messages[0] }
                : { type: 'message_added', messages: op.messages };
            return this.call('POST', `${chat}/events`, event);
        }
        if (op.kind === 'edit') return this.call('POST', `${chat}/events`, { type: 'message_edited', message: op.message });
        if (op.kind === 'delete') {
            return this.call('POST', `${chat}/events`, { type: 'message_deleted', floor: op.floor, shift: op.shift });
        }
        throw new Error(`unknown operation ${op.kind}`);
    }
}
