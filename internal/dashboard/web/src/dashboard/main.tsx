// The dashboard's page: the key, the live sandbox list with the quota gauge, and the selected
// sandbox's panels. Everything the server or a workload sent is rendered as text (JSX
// children), never as HTML.
import { render } from 'preact';
import { useEffect, useMemo, useState } from 'preact/hooks';
import { closeSockets, forgetKey, storedKey, storeKey, takeKeyFromFragment } from './api';
import { Agents } from './agents';
import { Files } from './files';
import { Runner } from './runner';
import { CreateForm, SandboxList, Overview } from './sandboxes';
import { Snapshots } from './snapshots';
import { SandboxStore } from './store';
import { Terminal } from './terminal';
import { ErrorList, useErrors } from './ui';
import './style.css';

function KeyForm({ onKey }: { onKey: (key: string) => void }) {
  const [key, setKey] = useState('');
  return (
    <form
      id="key-form"
      class="key-form"
      onSubmit={(e) => {
        e.preventDefault();
        if (key.trim()) onKey(key.trim());
      }}
    >
      <h1>sandboxd</h1>
      <p>
        Enter an API key. It is kept in this tab's session storage and sent only in the X-Api-Key
        header and the WebSocket's first message. A link may also carry it as <code>#key=…</code>.
      </p>
      <input
        id="key-input"
        type="password"
        autocomplete="off"
        placeholder="API key"
        value={key}
        onInput={(e) => setKey((e.target as HTMLInputElement).value)}
      />
      <button type="submit">Open</button>
    </form>
  );
}

function useStore(store: SandboxStore): number {
  const [version, setVersion] = useState(0);
  useEffect(() => store.onChange(() => setVersion((v) => v + 1)), [store]);
  return version;
}

const TABS = ['Overview', 'Run', 'Terminal', 'Files', 'Snapshots', 'Agents'] as const;
type Tab = (typeof TABS)[number];

function Dashboard({ onForget }: { onForget: (reason?: string) => void }) {
  const store = useMemo(() => new SandboxStore(), []);
  useStore(store);
  const errors = useErrors();
  const [selected, setSelected] = useState<string | null>(null);
  const [tab, setTab] = useState<Tab>('Overview');

  useEffect(() => {
    store.start();
    return () => store.close();
  }, [store]);
  useEffect(() => {
    // A refused key: UNAUTHENTICATED over HTTP, close code 4403 on the GraphQL WebSocket.
    if (['UNAUTHENTICATED', 'CLOSE_4403', 'CLOSE_4401'].includes(store.error?.code ?? '')) onForget('The server refused the key.');
  }, [store.error]);

  const sandbox = selected ? store.sandboxes.get(selected) : undefined;
  const quota = store.quota;
  return (
    <div class="page">
      <header>
        <h1>sandboxd</h1>
        <div class="quota" id="quota" title="Concurrency slots: every CREATING, STARTING or RUNNING sandbox holds one">
          {quota && (
            <>
              <span>slots</span>
              {quota.limit > 0 ? <meter min={0} max={quota.limit} high={quota.limit * 0.8} value={quota.inUse} /> : null}
              <span id="quota-text">{quota.limit > 0 ? `${quota.inUse} / ${quota.limit}` : `${quota.inUse} in use (no limit)`}</span>
            </>
          )}
        </div>
        <span id="connection" class={store.connected ? 'live' : 'offline'}>
          {store.connected ? 'live' : 'connecting…'}
        </span>
        <a href="/graphiql" target="_blank" rel="noopener noreferrer">GraphiQL</a>
        <button type="button" onClick={() => onForget()}>Forget key</button>
      </header>
      <ErrorList errors={errors} />
      {store.error && <p class="error">{`${store.error.code}: ${store.error.message}`}</p>}
      <main>
        <section class="list">
          <CreateForm store={store} errors={errors} onCreated={(id) => setSelected(id)} />
          <SandboxList store={store} selected={selected} onSelect={(id) => setSelected(id)} errors={errors} />
        </section>
        <section class="detail">
          {sandbox ? (
            <>
              <nav class="tabs">
                {TABS.map((t) => (
                  <button type="button" key={t} data-tab={t} class={t === tab ? 'active' : ''} onClick={() => setTab(t)}>
                    {t}
                  </button>
                ))}
              </nav>
              {tab === 'Overview' && <Overview sandbox={sandbox} />}
              {tab === 'Run' && <Runner key={sandbox.id} sandbox={sandbox} store={store} errors={errors} />}
              {tab === 'Terminal' && <Terminal key={sandbox.id} sandbox={sandbox} errors={errors} />}
              {tab === 'Files' && <Files key={sandbox.id} sandbox={sandbox} errors={errors} />}
              {tab === 'Snapshots' && <Snapshots key={sandbox.id} sandbox={sandbox} store={store} errors={errors} />}
              {tab === 'Agents' && <Agents key={sandbox.id} sandbox={sandbox} errors={errors} />}
            </>
          ) : (
            <p class="hint">Select a sandbox.</p>
          )}
        </section>
      </main>
    </div>
  );
}

function App() {
  const [key, setKey] = useState(() => {
    takeKeyFromFragment();
    return storedKey();
  });
  const [notice, setNotice] = useState<string | null>(null);
  if (!key) {
    return (
      <>
        {notice && <p class="error">{notice}</p>}
        <KeyForm
          onKey={(k) => {
            storeKey(k);
            setNotice(null);
            setKey(k);
          }}
        />
      </>
    );
  }
  return (
    <Dashboard
      key={key}
      onForget={(reason) => {
        closeSockets();
        forgetKey();
        setNotice(reason ?? null);
        setKey('');
      }}
    />
  );
}

// A key can also arrive after load (a link with #key=… opened in the same tab).
window.addEventListener('hashchange', () => {
  if (/^#key=/.test(location.hash)) location.reload();
});

render(<App />, document.getElementById('app')!);
