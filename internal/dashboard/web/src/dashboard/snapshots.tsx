// A sandbox's snapshots: take one, delete one, or create a new sandbox from one.
import { useEffect, useState } from 'preact/hooks';
import { gql } from './api';
import * as q from './queries';
import type { SandboxStore } from './store';
import { bytes, type Errors, when } from './ui';

export function Snapshots({ sandbox, store, errors }: { sandbox: q.Sandbox; store: SandboxStore; errors: Errors }) {
  const [list, setList] = useState<q.Snapshot[] | null>(null);
  const [busy, setBusy] = useState(false);
  const load = () =>
    errors.guard('snapshots', async () => {
      try {
        // The newest 50 (a connection: pageInfo.hasNextPage says when older ones exist).
        setList((await gql<q.SnapshotsData>(q.SNAPSHOTS, { sandboxId: sandbox.id, first: 50 })).snapshots?.nodes ?? []);
      } catch (err) {
        setList([]);
        // A sandbox without snapshots yet is NOT_FOUND here.
        if ((err as { code?: string }).code !== 'NOT_FOUND') throw err;
      }
    });
  useEffect(() => {
    void load();
  }, [sandbox.id, sandbox.latestSnapshotId]);

  const take = async () => {
    setBusy(true);
    await errors.guard('snapshot', async () => {
      await gql(q.SNAPSHOT_SANDBOX, { id: sandbox.id });
      await store.refresh(sandbox.id);
      await load();
    });
    setBusy(false);
  };

  return (
    <div class="snapshots">
      <div class="row">
        <button type="button" id="snapshot-take" onClick={() => void take()} disabled={busy || sandbox.state !== 'RUNNING'}>
          {busy ? 'Taking a snapshot…' : 'Take snapshot'}
        </button>
        <button type="button" onClick={() => void load()}>Refresh</button>
      </div>
      <table id="snapshots" class="snapshots-table">
        <tbody>
          {list?.map((s) => (
            <tr key={s.id} data-snapshot-id={s.id}>
              <td>
                <code>{s.id}</code>
                {s.id === sandbox.latestSnapshotId && <span class="label">latest</span>}
              </td>
              <td>{when(s.createdAt)}</td>
              <td title={`${bytes(s.rawSizeBytes)} uncompressed`}>{bytes(s.sizeBytes)}</td>
              <td>
                <button
                  type="button"
                  onClick={() =>
                    void errors.guard('create from snapshot', async () => {
                      const d = await gql<q.CreateSandboxData>(q.CREATE_SANDBOX, {
                        input: { profile: sandbox.profileName, source: { snapshotId: s.id } },
                      });
                      store.put(d.createSandbox.sandbox);
                    })
                  }
                >
                  New sandbox from it
                </button>
                <button
                  type="button"
                  class="danger"
                  onClick={() => {
                    if (!confirm(`Delete ${s.id}?`)) return;
                    void errors.guard('delete snapshot', async () => {
                      await gql(q.DELETE_SNAPSHOT, { id: s.id });
                      await load();
                    });
                  }}
                >
                  Delete
                </button>
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      {list?.length === 0 && <p class="hint">No snapshots yet: stop and destroy take one, and so does Take snapshot.</p>}
    </div>
  );
}
