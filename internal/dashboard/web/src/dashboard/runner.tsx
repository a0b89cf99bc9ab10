// The command runner: starts a command (exec with wait: false) and shows its output live from
// the execOutput subscription; the sandbox's recent commands, whose output can be replayed.
import { useEffect, useRef, useState } from 'preact/hooks';
import { ApiError, gql, subscribe } from './api';
import { OutputView } from './output';
import * as q from './queries';
import type { SandboxStore } from './store';
import { type Errors, when } from './ui';

// exitText says how a command ended.
export function exitText(r: q.Exec): string {
  if (r.error) return `ended: ${r.error}`;
  if (r.timedOut) return `timed out after ${r.durationMs ?? '?'} ms`;
  if (r.signal) return `killed by ${r.signal} after ${r.durationMs ?? '?'} ms`;
  return `exit ${r.exitCode ?? '?'} after ${r.durationMs ?? '?'} ms`;
}

// followOutput shows an exec's output in view from the start, then live. A stream the server
// ends without an EXIT event is read again from its cursor while the exec runs (a few times),
// else the exec's final status is read and shown.
export function followOutput(execId: string, view: OutputView, onEnd: (r: q.Exec | null) => void): () => void {
  let stop: () => void = () => {};
  let closed = false;
  let cursor: string | null = null;
  let restarts = 0;
  const open = () => {
    stop = subscribe<q.ExecOutputEvent>(
      q.EXEC_OUTPUT,
      { execId },
      'execOutput',
      {
        next: (e) => {
          cursor = e.cursor;
          if (e.kind === 'CHUNK' && e.dataBase64 != null) view.chunk(e.stream ?? 'STDOUT', e.dataBase64);
          else if (e.kind === 'TRUNCATED') view.note(`${e.missedBytes ?? 'some'} bytes of older output are no longer kept`);
          else if (e.kind === 'EXIT' && e.result) {
            closed = true;
            view.note(exitText(e.result));
            onEnd(e.result);
          }
        },
        error: (err) => {
          closed = true;
          view.note(`output stream: ${err.code}: ${err.message}`);
          onEnd(null);
        },
        complete: () => {
          if (closed) return;
          void (async () => {
            let r: q.Exec | null = null;
            try {
              r = (await gql<q.ExecData>(q.EXEC, { id: execId })).exec;
            } catch (err) {
              view.note(`output stream ended early: ${err instanceof ApiError ? `${err.code}: ${err.message}` : String(err)}`);
            }
            if (closed) return;
            if (r?.state === 'RUNNING' && restarts++ < 5) {
              window.setTimeout(() => !closed && open(), 500 * restarts);
              return;
            }
            closed = true;
            if (r) view.note(r.state === 'ENDED' ? exitText(r) : 'output stream ended; the command still runs');
            onEnd(r);
          })();
        },
      },
      cursor,
    );
  };
  open();
  return () => {
    closed = true;
    stop();
  };
}

export function Runner({ sandbox, store, errors }: { sandbox: q.Sandbox; store: SandboxStore; errors: Errors }) {
  const [command, setCommand] = useState('');
  const [current, setCurrent] = useState<q.Exec | null>(null);
  const [status, setStatus] = useState('');
  const [execs, setExecs] = useState<q.Exec[]>([]);
  const pre = useRef<HTMLPreElement>(null);
  const view = useRef<OutputView | null>(null);
  const stopFollow = useRef<() => void>(() => {});

  const loadExecs = () =>
    errors.guard('commands', async () => setExecs((await gql<q.ExecsData>(q.EXECS, { sandboxId: sandbox.id, first: 20 })).execs.nodes));

  useEffect(() => {
    view.current = new OutputView(pre.current!);
    void loadExecs();
    let timer = 0;
    const off = store.onEvent((e) => {
      if (e.sandboxId !== sandbox.id || !e.exec) return;
      window.clearTimeout(timer);
      timer = window.setTimeout(() => void loadExecs(), 300);
    });
    return () => {
      off();
      window.clearTimeout(timer);
      stopFollow.current();
    };
  }, [sandbox.id]);

  const show = (exec: q.Exec) => {
    stopFollow.current();
    view.current!.clear();
    setCurrent(exec);
    setStatus(exec.state === 'RUNNING' ? 'running' : exitText(exec));
    stopFollow.current = followOutput(exec.execId, view.current!, (r) => {
      void loadExecs();
      if (r) {
        setCurrent(r);
        setStatus(r.state === 'ENDED' ? exitText(r) : 'running');
      } else setStatus('output stream failed');
    });
  };

  const run = async () => {
    if (!command.trim()) return;
    const d = await errors.guard('run', () =>
      gql<q.StartExecData>(q.START_EXEC, { sandboxId: sandbox.id, input: { command: ['sh', '-c', command] } }),
    );
    if (d) {
      show(d.exec.exec);
      void loadExecs();
    }
  };

  const signal = (sig: string) =>
    current && void errors.guard(`signal ${sig}`, () => gql(q.SIGNAL_EXEC, { execId: current.execId, signal: sig }));

  return (
    <div class="runner">
      <form
        class="row"
        onSubmit={(e) => {
          e.preventDefault();
          void run();
        }}
      >
        <input
          id="run-command"
          class="grow mono"
          placeholder="a shell command, run with sh -c in /workspace"
          value={command}
          onInput={(e) => setCommand((e.target as HTMLInputElement).value)}
          disabled={sandbox.state !== 'RUNNING'}
        />
        <button id="run-button" type="submit" disabled={sandbox.state !== 'RUNNING'}>
          Run
        </button>
      </form>
      {sandbox.state !== 'RUNNING' && <p class="hint">Commands run in a RUNNING sandbox.</p>}
      <div class="row">
        <span id="run-status" class="status">
          {current ? `${current.execId} · ${current.command} · ${status}` : ''}
        </span>
        {current?.state === 'RUNNING' && (
          <>
            <button type="button" onClick={() => signal('SIGINT')}>Interrupt</button>
            <button type="button" onClick={() => signal('SIGKILL')}>Kill</button>
          </>
        )}
      </div>
      <pre id="run-output" class="output" ref={pre} />
      <h3>Recent commands</h3>
      <table class="execs">
        <tbody>
          {execs.map((x) => (
            <tr key={x.execId} data-exec-id={x.execId} onClick={() => show(x)}>
              <td class="mono">{x.command}</td>
              <td>{x.state === 'RUNNING' ? 'running' : exitText(x)}</td>
              <td>{when(x.startedAt)}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}
