// The file browser: a folder of the workspace (listFiles), a text file's content (readFile),
// uploads and downloads through the REST files API (bytes, up to its 100 MiB cap), new
// folders and deletes. File names are the workload's: shown as text only.
import { useEffect, useState } from 'preact/hooks';
import { gql, rest, sandboxPath } from './api';
import * as q from './queries';
import { bytes, type Errors, when } from './ui';

const LIST_MAX = 500;
const VIEW_MAX = 256 * 1024;

function join(dir: string, name: string): string {
  return dir === '.' || dir === '' ? name : `${dir.replace(/\/+$/, '')}/${name}`;
}

function parent(dir: string): string {
  const i = dir.replace(/\/+$/, '').lastIndexOf('/');
  return i <= 0 ? '.' : dir.slice(0, i);
}

export function Files({ sandbox, errors }: { sandbox: q.Sandbox; errors: Errors }) {
  const [dir, setDir] = useState('.');
  const [listing, setListing] = useState<q.ListFilesData['listFiles'] | null>(null);
  const [viewing, setViewing] = useState<{ path: string; text: string } | null>(null);
  const running = sandbox.state === 'RUNNING';

  const load = async (path = dir) => {
    const d = await errors.guard('list files', () => gql<q.ListFilesData>(q.LIST_FILES, { sandboxId: sandbox.id, path, first: LIST_MAX }));
    if (d) {
      setListing(d.listFiles);
      setDir(path);
    }
  };
  // The next page of the folder shown, appended to it.
  const more = async () => {
    if (!listing?.pageInfo.endCursor) return;
    const after = listing.pageInfo.endCursor;
    const d = await errors.guard('list files', () =>
      gql<q.ListFilesData>(q.LIST_FILES, { sandboxId: sandbox.id, path: listing.path, first: LIST_MAX, after }),
    );
    if (d) setListing({ ...d.listFiles, nodes: [...listing.nodes, ...d.listFiles.nodes] });
  };
  useEffect(() => {
    if (running) void load('.');
  }, [sandbox.id, running]);

  const open = async (f: q.FileInfo) => {
    if (f.isDir) {
      setViewing(null);
      void load(f.path);
      return;
    }
    if (f.size > VIEW_MAX) {
      setViewing({ path: f.path, text: `(${bytes(f.size)}: too large to show here; download it)` });
      return;
    }
    const d = await errors.guard('read', () => gql<q.ReadFileData>(q.READ_FILE, { sandboxId: sandbox.id, path: f.path, maxBytes: VIEW_MAX }));
    if (d) setViewing({ path: f.path, text: d.readFile.content ?? `(${bytes(d.readFile.size)} of binary content; download it)` });
  };

  const download = (f: q.FileInfo) =>
    void errors.guard('download', async () => {
      const resp = await rest('GET', `${sandboxPath(sandbox.id)}/files?path=${encodeURIComponent(f.path)}`);
      const url = URL.createObjectURL(await resp.blob());
      const a = document.createElement('a');
      a.href = url;
      a.download = f.name;
      a.click();
      window.setTimeout(() => URL.revokeObjectURL(url), 10_000);
    });

  const upload = (files: FileList | null) =>
    void errors.guard('upload', async () => {
      for (const file of Array.from(files ?? [])) {
        await rest('PUT', `${sandboxPath(sandbox.id)}/files?path=${encodeURIComponent(join(dir, file.name))}`, file);
      }
      await load();
    });

  const remove = (f: q.FileInfo) => {
    if (!confirm(`Delete ${f.path}${f.isDir ? ' and everything in it' : ''}?`)) return;
    void errors.guard('delete', async () => {
      await gql(q.DELETE_FILE, { sandboxId: sandbox.id, path: f.path, recursive: f.isDir });
      await load();
    });
  };

  const mkdir = () => {
    const name = prompt('New folder name');
    if (!name) return;
    void errors.guard('new folder', async () => {
      await gql(q.MAKE_DIRECTORY, { sandboxId: sandbox.id, path: join(dir, name) });
      await load();
    });
  };

  if (!running) return <p class="hint">Files can be browsed in a RUNNING sandbox.</p>;
  return (
    <div class="files">
      <div class="row">
        <button type="button" onClick={() => void load(parent(dir))} disabled={dir === '.'}>
          Up
        </button>
        <code id="files-path" class="grow">{`/workspace/${dir === '.' ? '' : dir}`}</code>
        <button type="button" onClick={() => void load()}>Refresh</button>
        <button type="button" onClick={mkdir}>New folder</button>
        <label class="button">
          Upload
          <input type="file" multiple hidden onChange={(e) => upload((e.target as HTMLInputElement).files)} />
        </label>
      </div>
      <table id="files" class="files-table">
        <tbody>
          {listing?.nodes.map((f) => (
            <tr key={f.path} data-path={f.path}>
              <td class="name">
                <button type="button" class="link" onClick={() => void open(f)}>
                  {f.isDir ? `${f.name}/` : f.name}
                </button>
                {f.symlink != null && <span class="sub">{` → ${f.symlink}`}</span>}
              </td>
              <td>{f.isDir ? '' : bytes(f.size)}</td>
              <td>{when(f.modTime)}</td>
              <td>
                {!f.isDir && (
                  <button type="button" onClick={() => download(f)}>
                    Download
                  </button>
                )}
                <button type="button" class="danger" onClick={() => remove(f)}>
                  Delete
                </button>
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      {listing?.pageInfo.hasNextPage && (
        <p class="hint">
          <button type="button" id="files-more" onClick={() => void more()}>
            {`Show the next ${LIST_MAX}`}
          </button>
        </p>
      )}
      {viewing && (
        <>
          <h3>{viewing.path}</h3>
          <pre id="file-content" class="output">{viewing.text}</pre>
        </>
      )}
    </div>
  );
}
