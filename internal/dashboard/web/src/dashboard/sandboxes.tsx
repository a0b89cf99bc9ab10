// The sandbox list (live), its lifecycle buttons, the create form and a sandbox's overview.
import { Fragment } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import { gql } from './api';
import * as q from './queries';
import type { SandboxStore } from './store';
import { bytes, type Errors, when } from './ui';

// parseLabels reads "key=value" items separated by commas or new lines.
function parseLabels(text: string): q.Label[] {
  return text
    .split(/[,\n]/)
    .map((s) => s.trim())
    .filter((s) => s !== '')
    .map((s) => {
      const i = s.indexOf('=');
      return i < 0 ? { key: s, value: '' } : { key: s.slice(0, i).trim(), value: s.slice(i + 1).trim() };
    });
}

export function CreateForm({ store, errors, onCreated }: { store: SandboxStore; errors: Errors; onCreated: (id: string) => void }) {
  const [profiles, setProfiles] = useState<q.Profile[]>([]);
  const [profile, setProfile] = useState('');
  const [labels, setLabels] = useState('');
  const [snapshotId, setSnapshotId] = useState('');
  const [busy, setBusy] = useState(false);
  useEffect(() => {
    void errors.guard('profiles', async () => setProfiles((await gql<q.ProfilesData>(q.PROFILES)).profiles));
  }, []);
  return (
    <form
      id="create-form"
      class="create"
      onSubmit={async (e) => {
        e.preventDefault();
        setBusy(true);
        const input: q.CreateSandboxInput = {};
        if (profile) input.profile = profile;
        const l = parseLabels(labels);
        if (l.length) input.labels = l;
        if (snapshotId.trim()) input.source = { snapshotId: snapshotId.trim() };
        const d = await errors.guard('create', () => gql<q.CreateSandboxData>(q.CREATE_SANDBOX, { input }));
        setBusy(false);
        if (d) {
          store.put(d.createSandbox.sandbox);
          onCreated(d.createSandbox.sandbox.id);
          setLabels('');
          setSnapshotId('');
        }
      }}
    >
      <select value={profile} onChange={(e) => setProfile((e.target as HTMLSelectElement).value)} aria-label="profile">
        <option value="">default profile</option>
        {profiles.map((p) => (
          <option key={p.name} value={p.name} title={p.description}>
            {p.name}
          </option>
        ))}
      </select>
      <input
        id="create-labels"
        placeholder="labels: team=web, env=dev"
        value={labels}
        onInput={(e) => setLabels((e.target as HTMLInputElement).value)}
      />
      <input
        id="create-snapshot"
        placeholder="from snapshot (snap_…), optional"
        value={snapshotId}
        onInput={(e) => setSnapshotId((e.target as HTMLInputElement).value)}
      />
      <button type="submit" disabled={busy}>
        {busy ? 'Creating…' : 'Create sandbox'}
      </button>
    </form>
  );
}

// The verbs each state allows (the server decides; these only hide what cannot work).
const VERBS: { verb: q.Verb; label: string; states: q.SandboxState[] }[] = [
  { verb: 'stopSandbox', label: 'Stop', states: ['RUNNING', 'FAILED', 'PAUSED'] },
  { verb: 'startSandbox', label: 'Start', states: ['STOPPED', 'FAILED'] },
  { verb: 'pauseSandbox', label: 'Pause', states: ['RUNNING'] },
  { verb: 'resumeSandbox', label: 'Resume', states: ['PAUSED'] },
];

function Actions({ s, store, errors }: { s: q.Sandbox; store: SandboxStore; errors: Errors }) {
  const [busy, setBusy] = useState('');
  const act = async (label: string, fn: () => Promise<void>) => {
    setBusy(label);
    await errors.guard(`${label} ${s.id}`, fn);
    setBusy('');
  };
  return (
    <span class="actions">
      {VERBS.filter((v) => v.states.includes(s.state)).map((v) => (
        <button
          type="button"
          key={v.verb}
          data-action={v.verb}
          disabled={busy !== ''}
          onClick={(e) => {
            e.stopPropagation();
            void act(v.label, async () => {
              const d = await gql<q.LifecycleData>(q.lifecycle(v.verb), { id: s.id });
              const sb = d[v.verb]?.sandbox;
              if (sb) store.put(sb);
            });
          }}
        >
          {busy === v.label ? '…' : v.label}
        </button>
      ))}
      <button
        type="button"
        data-action="destroySandbox"
        class="danger"
        disabled={busy !== '' || s.state === 'DESTROYING'}
        onClick={(e) => {
          e.stopPropagation();
          if (!confirm(`Destroy ${s.id}? Its workspace is kept only as its last snapshot.`)) return;
          void act('Destroy', async () => {
            await gql(q.DESTROY_SANDBOX, { id: s.id });
            store.remove(s.id);
          });
        }}
      >
        {busy === 'Destroy' ? '…' : 'Destroy'}
      </button>
    </span>
  );
}

export function SandboxList({
  store,
  selected,
  onSelect,
  errors,
}: {
  store: SandboxStore;
  selected: string | null;
  onSelect: (id: string) => void;
  errors: Errors;
}) {
  const list = store.sorted();
  return (
    <>
      <table id="sandboxes" class="sandboxes" data-loaded={store.loaded ? 'true' : 'false'}>
        <thead>
          <tr>
            <th>sandbox</th>
            <th>state</th>
            <th>labels</th>
            <th />
          </tr>
        </thead>
        <tbody>
          {list.map((s) => (
            <tr key={s.id} data-sandbox-id={s.id} class={s.id === selected ? 'selected' : ''} onClick={() => onSelect(s.id)}>
              <td>
                <code class="id">{s.id}</code>
                <div class="sub">
                  {s.profileName} · {when(s.createdAt)}
                </div>
              </td>
              <td>
                <span class={`state state-${s.state}`} data-state={s.state}>
                  {s.state}
                </span>
                {s.stateReason && <div class="sub reason">{s.stateReason}</div>}
              </td>
              <td class="labels">
                {s.labels.map((l) => (
                  <span class="label" key={l.key}>
                    {l.value ? `${l.key}=${l.value}` : l.key}
                  </span>
                ))}
              </td>
              <td>
                <Actions s={s} store={store} errors={errors} />
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      {store.loaded && list.length === 0 && <p class="hint">No sandboxes yet.</p>}
      {store.hasNextPage && (
        <button type="button" onClick={() => void errors.guard('more sandboxes', () => store.loadMore())}>
          More
        </button>
      )}
    </>
  );
}

export function Overview({ sandbox: s }: { sandbox: q.Sandbox }) {
  const rows: [string, string][] = [
    ['id', s.id],
    ['state', s.state],
    ['reason', s.stateReason ?? '—'],
    ['profile', s.profileName],
    ['created', when(s.createdAt)],
    ['state changed', when(s.stateChangedAt)],
    ['auto-stop at', when(s.autostopAt)],
    ['expires', when(s.expiresAt)],
    ['latest snapshot', s.latestSnapshotId ?? '—'],
    ['cpu', s.resources.milliCpu ? `${s.resources.milliCpu / 1000} cores` : 'no limit'],
    ['memory', s.resources.memoryBytes ? bytes(s.resources.memoryBytes) : 'no limit'],
    ['disk', s.resources.diskBytes ? bytes(s.resources.diskBytes) : 'no limit'],
    ['network', s.network],
    ['labels', s.labels.map((l) => `${l.key}=${l.value}`).join(', ') || '—'],
  ];
  return (
    <dl class="overview" id="overview">
      {rows.map(([k, v]) => (
        <Fragment key={k}>
          <dt>{k}</dt>
          <dd>{v}</dd>
        </Fragment>
      ))}
    </dl>
  );
}
