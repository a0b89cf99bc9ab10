// The live list of the caller's sandboxes: the sandboxEvents subscription applied to the
// answers of the sandboxes query. The subscription is opened first; the list is read once it
// is connected and again shortly after (an event the subscription missed while it was being
// set up is then in the list), after every reconnect and now and then; an event about a
// sandbox the list does not hold makes it read the list again. An event older than what the
// page holds never overwrites it: states are ordered by their time.
import { ApiError, gql, onConnection, subscribe } from './api';
import * as q from './queries';

const PAGE = 50;

// timeKey makes an RFC 3339 UTC time (nanoseconds, trailing zeros trimmed) comparable as a string.
export function timeKey(t: string): string {
  const m = /^(.*T\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z$/.exec(t);
  return m ? `${m[1]}.${(m[2] ?? '').padEnd(9, '0')}` : t;
}

type Listener = () => void;

export class SandboxStore {
  sandboxes = new Map<string, q.Sandbox>();
  quota: q.Quota | null = null;
  hasNextPage = false;
  connected = false;
  // loaded says that the list was read once.
  loaded = false;
  error: ApiError | null = null;
  private endCursor: string | null = null;
  private listeners = new Set<Listener>();
  private eventListeners = new Set<(e: q.SandboxEvent) => void>();
  private stop: (() => void)[] = [];
  private reconcileTimer = 0;
  private quotaTimer = 0;

  start(): void {
    this.stop.push(
      onConnection((connected, reconnect) => {
        this.connected = connected;
        this.emit();
        if (connected) {
          this.reconcileSoon(0);
          this.reconcileSoon(reconnect ? 500 : 1500);
        }
      }),
    );
    this.stop.push(
      subscribe<q.SandboxEvent>(q.SANDBOX_EVENTS, {}, 'sandboxEvents', {
        next: (e) => this.apply(e),
        error: (err) => {
          this.error = err;
          this.emit();
        },
        complete: () => {},
      }),
    );
    const every = window.setInterval(() => this.reconcile(), 60_000);
    this.stop.push(() => window.clearInterval(every));
    void this.reconcile();
  }

  close(): void {
    this.stop.forEach((fn) => fn());
    this.stop = [];
  }

  onChange(fn: Listener): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  onEvent(fn: (e: q.SandboxEvent) => void): () => void {
    this.eventListeners.add(fn);
    return () => this.eventListeners.delete(fn);
  }

  private emit(): void {
    this.listeners.forEach((fn) => fn());
  }

  // put records a sandbox as an answer of the server left it; a state older than the one the
  // page holds (an event can be newer than a read that was under way) keeps the page's.
  put(s: q.Sandbox): void {
    if (s.state === 'DESTROYED') this.sandboxes.delete(s.id);
    else this.sandboxes.set(s.id, this.merge(s));
    this.emit();
    this.quotaSoon();
  }

  private merge(s: q.Sandbox): q.Sandbox {
    const had = this.sandboxes.get(s.id);
    if (!had || timeKey(s.stateChangedAt) >= timeKey(had.stateChangedAt)) return s;
    return { ...s, state: had.state, stateReason: had.stateReason, stateChangedAt: had.stateChangedAt };
  }

  remove(id: string): void {
    this.sandboxes.delete(id);
    this.emit();
    this.quotaSoon();
  }

  private apply(e: q.SandboxEvent): void {
    this.eventListeners.forEach((fn) => fn(e));
    const had = this.sandboxes.get(e.sandboxId);
    switch (e.type) {
      case 'STATE_CHANGED':
        this.quotaSoon();
        if (e.state === 'DESTROYED') {
          this.remove(e.sandboxId);
          return;
        }
        if (!had) {
          this.reconcileSoon(200);
          return;
        }
        if (timeKey(e.at) >= timeKey(had.stateChangedAt)) {
          this.sandboxes.set(e.sandboxId, { ...had, state: e.state, stateReason: e.reason, stateChangedAt: e.at });
          this.emit();
        }
        // Deadlines and the latest snapshot change with the state: read the sandbox again.
        void this.refresh(e.sandboxId);
        return;
      case 'BOOTSTRAP_PROGRESS':
        if (had) {
          this.sandboxes.set(e.sandboxId, { ...had, stateReason: e.reason });
          this.emit();
        }
        return;
      case 'SANDBOX_UPDATED':
        void this.refresh(e.sandboxId);
        return;
      default:
        if (!had) this.reconcileSoon(200);
    }
  }

  // refresh reads one sandbox again.
  async refresh(id: string): Promise<void> {
    try {
      const d = await gql<q.SandboxData>(q.SANDBOX, { id });
      if (d.sandbox) this.put(d.sandbox);
    } catch (err) {
      if (err instanceof ApiError && err.code === 'NOT_FOUND') this.remove(id);
    }
  }

  private reconcileSoon(ms: number): void {
    window.clearTimeout(this.reconcileTimer);
    this.reconcileTimer = window.setTimeout(() => void this.reconcile(), ms);
  }

  private quotaSoon(): void {
    window.clearTimeout(this.quotaTimer);
    this.quotaTimer = window.setTimeout(() => void this.readQuota(), 300);
  }

  // reconcile reads the first page of sandboxes and merges it with what the page holds.
  async reconcile(): Promise<void> {
    try {
      const d = await gql<q.SandboxesData>(q.SANDBOXES, { first: PAGE });
      const fresh = new Map<string, q.Sandbox>();
      for (const s of d.sandboxes.nodes) fresh.set(s.id, this.merge(s));
      // Sandboxes of later pages the user loaded stay; anything else the page no longer lists is gone.
      const oldest = d.sandboxes.nodes.at(-1)?.createdAt;
      if (d.sandboxes.pageInfo.hasNextPage && oldest) {
        for (const [id, s] of this.sandboxes) {
          if (!fresh.has(id) && timeKey(s.createdAt) < timeKey(oldest)) fresh.set(id, s);
        }
      }
      this.sandboxes = fresh;
      this.loaded = true;
      if (!this.endCursor || !d.sandboxes.pageInfo.hasNextPage) {
        this.endCursor = d.sandboxes.pageInfo.endCursor;
        this.hasNextPage = d.sandboxes.pageInfo.hasNextPage;
      }
      this.error = null;
      this.emit();
      await this.readQuota();
    } catch (err) {
      this.error = err as ApiError;
      this.emit();
    }
  }

  // loadMore reads the next page of sandboxes.
  async loadMore(): Promise<void> {
    if (!this.hasNextPage) return;
    const d = await gql<q.SandboxesData>(q.SANDBOXES, { first: PAGE, after: this.endCursor });
    for (const s of d.sandboxes.nodes) if (!this.sandboxes.has(s.id)) this.sandboxes.set(s.id, s);
    this.endCursor = d.sandboxes.pageInfo.endCursor;
    this.hasNextPage = d.sandboxes.pageInfo.hasNextPage;
    this.emit();
  }

  async readQuota(): Promise<void> {
    try {
      this.quota = (await gql<q.QuotaData>(q.QUOTA)).quota;
      this.emit();
    } catch {
      // the list's error says enough
    }
  }

  // sorted answers the sandboxes newest first, as the server lists them.
  sorted(): q.Sandbox[] {
    return [...this.sandboxes.values()].sort((a, b) => (timeKey(b.createdAt) < timeKey(a.createdAt) ? -1 : 1));
  }
}
