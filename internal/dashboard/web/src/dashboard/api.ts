// How the dashboard talks to sandboxd: GraphQL over HTTP (POST /graphql), subscriptions over
// graphql-transport-ws (graphql-ws's client), the REST file transfer and the terminal
// WebSocket. The API key travels only as the X-Api-Key header, in the connection_init payload
// and in the terminal socket's first message: never in a URL.
import { createClient, type Client } from 'graphql-ws';

const KEY_ITEM = 'sandboxd.apiKey';

// takeKeyFromFragment moves a key given as #key=… into sessionStorage and removes the fragment
// from the address bar and the history entry, so it is neither bookmarked nor shared.
export function takeKeyFromFragment(): void {
  const m = /^#key=(.+)$/.exec(location.hash);
  if (!m) return;
  let key = m[1];
  try {
    key = decodeURIComponent(key);
  } catch {
    // keep it as it came
  }
  history.replaceState(null, '', location.pathname + location.search);
  if (key.trim() !== '') sessionStorage.setItem(KEY_ITEM, key.trim());
}

export const storedKey = (): string => sessionStorage.getItem(KEY_ITEM) ?? '';
export const storeKey = (key: string) => sessionStorage.setItem(KEY_ITEM, key);
export const forgetKey = () => sessionStorage.removeItem(KEY_ITEM);

// ApiError is an error the server answered, with its stable code (extensions.code, or the
// REST body's code), or a transport failure (code NETWORK).
export class ApiError extends Error {
  constructor(
    readonly code: string,
    message: string,
    readonly retryAfter?: number,
  ) {
    super(message);
  }
}

interface GraphQLError { message: string; extensions?: { code?: string; retryAfter?: number } }

function firstError(errors: GraphQLError[] | undefined, status: number): ApiError {
  const e = errors?.[0];
  if (!e) return new ApiError('INTERNAL', `HTTP ${status}`);
  return new ApiError(e.extensions?.code ?? 'GRAPHQL_ERROR', e.message, e.extensions?.retryAfter);
}

// gql runs one query or mutation and answers its data, or throws the first error. A partial
// answer (data with errors) is an error too: the dashboard asks for one thing at a time.
export async function gql<T>(query: string, variables: Record<string, unknown> = {}): Promise<T> {
  let resp: Response;
  try {
    resp = await fetch('/graphql', {
      method: 'POST',
      headers: {
        'Content-Type': 'application/json',
        Accept: 'application/graphql-response+json, application/json',
        'X-Api-Key': storedKey(),
      },
      body: JSON.stringify({ query, variables }),
      credentials: 'omit',
      cache: 'no-store',
    });
  } catch (err) {
    throw new ApiError('NETWORK', `the server did not answer: ${String(err)}`);
  }
  let body: { data?: T | null; errors?: GraphQLError[] };
  try {
    body = await resp.json();
  } catch {
    throw new ApiError('INTERNAL', `HTTP ${resp.status}: not a GraphQL answer`);
  }
  if (body.errors?.length || body.data == null) throw firstError(body.errors, resp.status);
  return body.data;
}

// rest calls a REST path of the product API with the key as a header and answers the response,
// or throws the error of its error body.
export async function rest(method: string, path: string, body?: BodyInit): Promise<Response> {
  let resp: Response;
  try {
    resp = await fetch(path, {
      method,
      headers: { 'X-Api-Key': storedKey() },
      body,
      credentials: 'omit',
      cache: 'no-store',
    });
  } catch (err) {
    throw new ApiError('NETWORK', `the server did not answer: ${String(err)}`);
  }
  if (!resp.ok) {
    let code = 'INTERNAL';
    let message = `HTTP ${resp.status}`;
    try {
      const e = await resp.json();
      code = e.code ?? e.error?.code ?? code;
      message = e.message ?? e.error?.message ?? message;
    } catch {
      // not a JSON error body
    }
    throw new ApiError(code, message);
  }
  return resp;
}

export const sandboxPath = (id: string) => `/sandbox/sandboxes/v1/${encodeURIComponent(id)}`;

function wsURL(path: string): string {
  return `${location.protocol === 'https:' ? 'wss:' : 'ws:'}//${location.host}${path}`;
}

// The one graphql-transport-ws connection of the page, made on first use. It redials with
// backoff after a drop and then subscribes again to every open subscription.
let client: Client | null = null;
type ConnectionListener = (connected: boolean, reconnect: boolean) => void;
const connectionListeners = new Set<ConnectionListener>();

export function onConnection(fn: ConnectionListener): () => void {
  connectionListeners.add(fn);
  return () => connectionListeners.delete(fn);
}

function ws(): Client {
  if (client) return client;
  let connections = 0;
  client = createClient({
    url: wsURL('/graphql'),
    connectionParams: () => ({ 'X-Api-Key': storedKey() }),
    lazy: true,
    lazyCloseTimeout: 3000,
    keepAlive: 15_000,
    retryAttempts: Number.MAX_SAFE_INTEGER,
    shouldRetry: () => true,
    retryWait: async (n) => {
      await new Promise((r) => setTimeout(r, Math.min(10_000, 500 * 2 ** Math.min(n, 5)) * (0.5 + Math.random() / 2)));
    },
    on: {
      connected: () => {
        connections++;
        connectionListeners.forEach((fn) => fn(true, connections > 1));
      },
      closed: () => connectionListeners.forEach((fn) => fn(false, false)),
    },
  });
  return client;
}

// closeSockets ends the page's GraphQL connection (when the key is forgotten or replaced).
export function closeSockets(): void {
  client?.dispose();
  client = null;
}

export interface Stream<E> {
  next: (event: E) => void;
  error: (err: ApiError) => void;
  // complete is called when the server ended the stream (after its last event).
  complete: () => void;
}

// subscribe opens a subscription that resumes where it left off. graphql-ws subscribes again
// with the same payload after every redial (also after a close with 1000), and it serializes
// the payload anew each time: variables is a getter, so the resubscription carries `after` =
// the cursor of the last event this page received, and the server goes on right after it,
// nothing lost and nothing twice.
export function subscribe<E extends { cursor: string }, D = Record<string, E>>(
  query: string,
  variables: Record<string, unknown>,
  field: keyof D & string,
  sink: Stream<E>,
  after: string | null = null,
): () => void {
  let cursor = after;
  const payload = {
    query,
    get variables() {
      return { ...variables, after: cursor };
    },
  };
  return ws().subscribe<D>(payload, {
    next: (result) => {
      if (result.errors?.length) {
        sink.error(firstError(result.errors as GraphQLError[], 200));
        return;
      }
      const event = result.data?.[field] as E | undefined;
      if (!event) return;
      cursor = event.cursor;
      sink.next(event);
    },
    error: (err) => {
      if (Array.isArray(err)) sink.error(firstError(err as GraphQLError[], 200));
      else if (err instanceof CloseEvent) sink.error(new ApiError(`CLOSE_${err.code}`, err.reason || `the connection closed (${err.code})`));
      else sink.error(new ApiError('NETWORK', String(err)));
    },
    complete: sink.complete,
  });
}

// ttySocket opens the terminal WebSocket of an exec (subprotocol sandboxd.tty.v1) and sends the
// key as its first message, as a browser cannot set headers on a WebSocket.
export function ttySocket(sandboxId: string, execId: string, after: string | null): WebSocket {
  const q = after ? `?after=${encodeURIComponent(after)}` : '';
  const sock = new WebSocket(wsURL(`${sandboxPath(sandboxId)}/execs/${encodeURIComponent(execId)}/tty${q}`), 'sandboxd.tty.v1');
  sock.binaryType = 'arraybuffer';
  sock.addEventListener('open', () => sock.send(JSON.stringify({ 'X-Api-Key': storedKey() })), { once: true });
  return sock;
}

// decodeBase64 turns an event's dataBase64 into bytes.
export function decodeBase64(s: string): Uint8Array {
  const bin = atob(s);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}
