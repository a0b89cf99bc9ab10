/** @jsxImportSource react */
// The GraphiQL page at /graphiql, bundled (no CDN): queries and mutations over POST /graphql,
// subscriptions over graphql-transport-ws. The key is the dashboard's (this tab's session
// storage, or #key=… in the address, which is then removed); it is added to every request as
// X-Api-Key and to the WebSocket's connection_init payload, and never stored by GraphiQL.
import { createGraphiQLFetcher } from '@graphiql/toolkit';
import { GraphiQL } from 'graphiql';
import 'graphiql/graphiql.css';
import './style.css';
import { createClient } from 'graphql-ws';
import { useState } from 'react';
import { createRoot } from 'react-dom/client';
import { forgetKey, storedKey, storeKey, takeKeyFromFragment } from '../dashboard/api';

takeKeyFromFragment();

const wsClient = createClient({
  url: `${location.protocol === 'https:' ? 'wss:' : 'ws:'}//${location.host}/graphql`,
  connectionParams: () => ({ 'X-Api-Key': storedKey() }),
  lazy: true,
});

const fetcher = createGraphiQLFetcher({
  url: '/graphql',
  wsClient,
  fetch: (input, init) => {
    const headers = new Headers(init?.headers);
    headers.set('X-Api-Key', storedKey());
    return fetch(input, { ...init, headers, credentials: 'omit' });
  },
});

function KeyBar() {
  const [key, setKey] = useState(storedKey());
  const [draft, setDraft] = useState('');
  return (
    <form
      className="key-bar"
      onSubmit={(e) => {
        e.preventDefault();
        if (!draft.trim()) return;
        storeKey(draft.trim());
        setKey(draft.trim());
        setDraft('');
      }}
    >
      <a href="/">dashboard</a>
      {key ? (
        <>
          <span>API key set for this tab</span>
          <button
            type="button"
            onClick={() => {
              forgetKey();
              setKey('');
            }}
          >
            Forget key
          </button>
        </>
      ) : (
        <>
          <input type="password" autoComplete="off" placeholder="API key" value={draft} onChange={(e) => setDraft(e.target.value)} />
          <button type="submit">Use key</button>
        </>
      )}
    </form>
  );
}

createRoot(document.getElementById('graphiql')!).render(
  <>
    <KeyBar />
    <GraphiQL fetcher={fetcher} shouldPersistHeaders={false} />
  </>,
);
