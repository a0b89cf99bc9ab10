// A terminal in the sandbox: the user's login shell run under a pseudo-terminal (exec with
// tty), shown in xterm.js over the terminal WebSocket (subprotocol sandboxd.tty.v1). Bytes go
// both ways as binary frames; resizes are control frames. The shell outlives the socket: a
// dropped socket reattaches from the cursor of the output it received.
import { FitAddon } from '@xterm/addon-fit';
import { Terminal as XTerm } from '@xterm/xterm';
import '@xterm/xterm/css/xterm.css';
import { useEffect, useRef, useState } from 'preact/hooks';
import { ApiError, gql, ttySocket } from './api';
import * as q from './queries';
import type { Errors } from './ui';

// The sandbox user's login shell from the passwd database, else bash, else sh (as sandboxctl's).
const LOGIN_SHELL = `shell=$(getent passwd "$(id -u)" 2>/dev/null | cut -d: -f7)
case "$shell" in ""|*/nologin|*/false) shell=$(command -v bash || echo /bin/sh) ;; esac
exec "$shell" -l`;

interface Control {
  type: string;
  cursor?: string;
  code?: string;
  message?: string;
  exit_code?: number;
  signal?: string;
  missed_bytes?: number;
}

export function Terminal({ sandbox, errors }: { sandbox: q.Sandbox; errors: Errors }) {
  const host = useRef<HTMLDivElement>(null);
  const [execId, setExecId] = useState<string | null>(null);
  const [status, setStatus] = useState('');

  useEffect(() => {
    if (!execId) return;
    const term = new XTerm({ convertEol: false, cursorBlink: true, fontSize: 13, scrollback: 5000 });
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.open(host.current!);
    fit.fit();
    const enc = new TextEncoder();
    let sock: WebSocket | null = null;
    let cursor: string | null = null;
    let ended = false;
    let retries = 0;
    let timer = 0;
    const send = (frame: string | Uint8Array) => {
      if (sock?.readyState === WebSocket.OPEN) sock.send(frame);
    };
    const resize = () => send(JSON.stringify({ type: 'resize', rows: term.rows, cols: term.cols }));
    const connect = () => {
      const s = ttySocket(sandbox.id, execId, cursor);
      sock = s;
      s.addEventListener('message', (ev) => {
        if (typeof ev.data !== 'string') {
          term.write(new Uint8Array(ev.data as ArrayBuffer));
          return;
        }
        let c: Control;
        try {
          c = JSON.parse(ev.data);
        } catch {
          return;
        }
        if (c.cursor) cursor = c.cursor;
        switch (c.type) {
          case 'attached':
            retries = 0;
            setStatus('attached');
            resize();
            break;
          case 'truncated':
            term.write(`\r\n[${c.missed_bytes ?? 'some'} bytes of older output are no longer kept]\r\n`);
            break;
          case 'error':
            setStatus(`${c.code}: ${c.message}`);
            break;
          case 'exit':
            ended = true;
            setStatus(c.signal ? `ended by ${c.signal}` : `exited with code ${c.exit_code}`);
            break;
        }
      });
      s.addEventListener('close', (ev) => {
        if (sock !== s) return;
        if (ended || ev.code === 1000) {
          ended = true;
          setStatus((st) => (st.startsWith('exited') || st.startsWith('ended') ? st : `closed: ${ev.reason || ev.code}`));
          return;
        }
        // 4401, 4404 and 4400 will not get better by retrying.
        if ([4401, 4404, 4400, 4403, 1008].includes(ev.code) || retries >= 8) {
          ended = true;
          setStatus(`closed: ${ev.code} ${ev.reason}`);
          return;
        }
        retries++;
        setStatus(`reconnecting (${ev.code} ${ev.reason})…`);
        timer = window.setTimeout(connect, Math.min(8000, 300 * 2 ** retries));
      });
    };
    connect();
    const onData = term.onData((d) => send(enc.encode(d)));
    const onBinary = term.onBinary((d) => send(Uint8Array.from(d, (ch) => ch.charCodeAt(0))));
    const onResize = term.onResize(() => resize());
    const observer = new ResizeObserver(() => fit.fit());
    observer.observe(host.current!);
    term.focus();
    return () => {
      ended = true;
      window.clearTimeout(timer);
      observer.disconnect();
      onData.dispose();
      onBinary.dispose();
      onResize.dispose();
      sock?.close(1000, 'detached');
      term.dispose();
    };
  }, [execId, sandbox.id]);

  const open = async () => {
    const input: q.ExecInput = { command: ['/bin/sh', '-c', LOGIN_SHELL], tty: { rows: 24, cols: 80 }, timeoutSec: 86400 };
    const d = await errors.guard('terminal', async () => {
      try {
        return await gql<q.StartExecData>(q.START_EXEC, { sandboxId: sandbox.id, input });
      } catch (err) {
        // A server that bounds timeouts lower than a day: its default then.
        if (!(err instanceof ApiError) || err.code !== 'INVALID_ARGUMENT' || !/timeout/i.test(err.message)) throw err;
        delete input.timeoutSec;
        return await gql<q.StartExecData>(q.START_EXEC, { sandboxId: sandbox.id, input });
      }
    });
    if (d) {
      setStatus('attaching…');
      setExecId(d.exec.exec.execId);
    }
  };

  return (
    <div class="terminal-panel">
      <div class="row">
        <button type="button" id="terminal-open" onClick={() => void open()} disabled={sandbox.state !== 'RUNNING'}>
          {execId ? 'New shell' : 'Open shell'}
        </button>
        <span class="status" id="terminal-status">
          {execId ? `${execId} · ${status}` : ''}
        </span>
      </div>
      {sandbox.state !== 'RUNNING' && !execId && <p class="hint">A shell runs in a RUNNING sandbox.</p>}
      <div class="terminal" ref={host} />
    </div>
  );
}
