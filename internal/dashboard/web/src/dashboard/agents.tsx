// A sandbox's agent runs: start one, follow one's status and output (agentRunEvents), cancel.
import { useEffect, useRef, useState } from 'preact/hooks';
import { gql, subscribe } from './api';
import { OutputView } from './output';
import * as q from './queries';
import { type Errors, when } from './ui';

const FINAL = ['SUCCEEDED', 'FAILED', 'CANCELLED', 'TIMED_OUT'];

export function Agents({ sandbox, errors }: { sandbox: q.Sandbox; errors: Errors }) {
  const [runs, setRuns] = useState<q.AgentRun[]>([]);
  const [current, setCurrent] = useState<q.AgentRun | null>(null);
  const [agentId, setAgentId] = useState('opencode');
  const [model, setModel] = useState('');
  const [instruction, setInstruction] = useState('');
  const pre = useRef<HTMLPreElement>(null);
  const view = useRef<OutputView | null>(null);
  const stop = useRef<() => void>(() => {});

  const load = () =>
    errors.guard('agent runs', async () =>
      // One page of 100: every run the service keeps.
      setRuns((await gql<q.AgentRunsData>(q.AGENT_RUNS, { sandboxId: sandbox.id, first: 100 })).agentRuns?.nodes ?? []),
    );
  useEffect(() => {
    view.current = new OutputView(pre.current!);
    void load();
    return () => stop.current();
  }, [sandbox.id]);

  const follow = (run: q.AgentRun) => {
    stop.current();
    view.current!.clear();
    setCurrent(run);
    stop.current = subscribe<q.AgentRunEvent>(q.AGENT_RUN_EVENTS, { runId: run.id }, 'agentRunEvents', {
      next: (e) => {
        if (e.kind === 'CHUNK' && e.dataBase64 != null) view.current!.chunk(e.stream ?? 'STDOUT', e.dataBase64);
        else if (e.kind === 'TRUNCATED') view.current!.note(`${e.missedBytes ?? 'some'} bytes of older output are no longer kept`);
        else if (e.kind === 'STATUS' && e.run) {
          setCurrent(e.run);
          if (FINAL.includes(e.run.status)) {
            view.current!.note(`${e.run.status}${e.run.reason ? `: ${e.run.reason}` : ''}`);
            void load();
          }
        }
      },
      error: (err) => view.current!.note(`event stream: ${err.code}: ${err.message}`),
      complete: () => {},
    });
  };

  const start = async () => {
    const input: q.StartAgentRunInput = { agentId, instruction, sandboxId: sandbox.id };
    if (model.trim()) input.model = model.trim();
    const d = await errors.guard('start agent', () => gql<q.StartAgentRunData>(q.START_AGENT_RUN, { input }));
    if (d) {
      follow(d.startAgentRun.agentRun);
      void load();
    }
  };

  return (
    <div class="agents">
      <form
        class="agent-form"
        onSubmit={(e) => {
          e.preventDefault();
          void start();
        }}
      >
        <div class="row">
          <input placeholder="agent" value={agentId} onInput={(e) => setAgentId((e.target as HTMLInputElement).value)} />
          <input class="grow" placeholder="model (when the agent needs one)" value={model} onInput={(e) => setModel((e.target as HTMLInputElement).value)} />
          <button type="submit" disabled={sandbox.state !== 'RUNNING' || !instruction.trim()}>
            Start run
          </button>
        </div>
        <textarea
          placeholder="instruction"
          rows={3}
          value={instruction}
          onInput={(e) => setInstruction((e.target as HTMLTextAreaElement).value)}
        />
      </form>
      <table class="runs">
        <tbody>
          {runs.map((r) => (
            <tr key={r.id} data-run-id={r.id} onClick={() => follow(r)} class={current?.id === r.id ? 'selected' : ''}>
              <td>
                <code>{r.id}</code>
              </td>
              <td>{r.agentId}</td>
              <td>{r.status}</td>
              <td>{when(r.createdAt)}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {runs.length === 0 && <p class="hint">No agent runs in this sandbox.</p>}
      {current && (
        <div class="row">
          <span class="status" id="agent-status">{`${current.id} · ${current.agentId} · ${current.status}${current.reason ? ` · ${current.reason}` : ''}`}</span>
          {!FINAL.includes(current.status) && (
            <button
              type="button"
              class="danger"
              onClick={() => void errors.guard('cancel run', async () => setCurrent((await gql<q.CancelAgentRunData>(q.CANCEL_AGENT_RUN, { id: current.id })).cancelAgentRun.agentRun))}
            >
              Cancel
            </button>
          )}
        </div>
      )}
      <pre id="agent-output" class="output" ref={pre} />
    </div>
  );
}
