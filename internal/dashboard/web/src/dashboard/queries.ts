// Every GraphQL document the dashboard sends, and the shapes of their answers: the one module
// to port when the schema changes (schema.graphqls at the repository's root).

export type SandboxState =
  | 'CREATING' | 'RUNNING' | 'STOPPING' | 'STOPPED' | 'STARTING' | 'PAUSING' | 'PAUSED'
  | 'RESUMING' | 'DESTROYING' | 'DESTROYED' | 'FAILED' | 'EXPIRED';

export interface Label { key: string; value: string }

export interface Sandbox {
  id: string;
  profileName: string;
  state: SandboxState;
  stateReason: string | null;
  createdAt: string;
  stateChangedAt: string;
  autostopAt: string | null;
  expiresAt: string | null;
  latestSnapshotId: string | null;
  network: string;
  resources: { milliCpu: number; memoryBytes: number; diskBytes: number };
  labels: Label[];
}

const SANDBOX_FIELDS = `
  id profileName state stateReason createdAt stateChangedAt autostopAt expiresAt latestSnapshotId
  network resources { milliCpu memoryBytes diskBytes } labels { key value }`;

export interface PageInfo { hasNextPage: boolean; endCursor: string | null }

export const SANDBOXES = `query Sandboxes($first: Int, $after: String) {
  sandboxes(first: $first, after: $after) {
    nodes { ${SANDBOX_FIELDS} }
    pageInfo { hasNextPage endCursor }
  }
}`;
export interface SandboxesData { sandboxes: { nodes: Sandbox[]; pageInfo: PageInfo } }

export const SANDBOX = `query Sandbox($id: ID!) { sandbox(id: $id) { ${SANDBOX_FIELDS} } }`;
export interface SandboxData { sandbox: Sandbox | null }

export const QUOTA = `query Quota { quota { limit inUse } }`;
export interface Quota { limit: number; inUse: number }
export interface QuotaData { quota: Quota }

export const PROFILES = `query Profiles { profiles { name description default milliCpu memoryBytes diskBytes network } }`;
export interface Profile {
  name: string; description: string; default: boolean;
  milliCpu: number; memoryBytes: number; diskBytes: number; network: string;
}
export interface ProfilesData { profiles: Profile[] }

export interface CreateSandboxInput {
  profile?: string;
  autostopSec?: number;
  ttlSec?: number;
  labels?: Label[];
  source?: { snapshotId: string };
}
export const CREATE_SANDBOX = `mutation CreateSandbox($input: CreateSandboxInput!) {
  createSandbox(input: $input) { sandbox { ${SANDBOX_FIELDS} } }
}`;
export interface CreateSandboxData { createSandbox: { sandbox: Sandbox } }

// The lifecycle verbs that take a sandbox id and answer a payload with the sandbox. pauseSandbox and
// resumeSandbox are in the schema only once the server can pause: a server without them
// answers GRAPHQL_VALIDATION_FAILED, which the page shows like any other error.
export type Verb = 'stopSandbox' | 'startSandbox' | 'pauseSandbox' | 'resumeSandbox';
export const lifecycle = (verb: Verb) =>
  `mutation Lifecycle($id: ID!) { ${verb}(id: $id) { sandbox { ${SANDBOX_FIELDS} } } }`;
export type LifecycleData = Partial<Record<Verb, { sandbox: Sandbox }>>;

export const DESTROY_SANDBOX = `mutation DestroySandbox($id: ID!) {
  destroySandbox(id: $id) { sandbox { id state } snapshotId }
}`;

// Status changes of the caller's sandboxes, resumed after the last cursor seen.
export const SANDBOX_EVENTS = `subscription SandboxEvents($after: String) {
  sandboxEvents(after: $after) {
    cursor type sandboxId state previousState reason at
    exec { execId state exitCode }
  }
}`;
export interface SandboxEvent {
  cursor: string;
  type: string;
  sandboxId: string;
  state: SandboxState;
  previousState: SandboxState | null;
  reason: string | null;
  at: string;
  exec: { execId: string; state: string; exitCode: number | null } | null;
}

const EXEC_FIELDS = `execId sandboxId command state exitCode signal timedOut durationMs startedAt
  endedAt error outputBytes stdinOpen tty { rows cols }`;
export interface Exec {
  execId: string;
  sandboxId: string;
  command: string;
  state: 'RUNNING' | 'ENDED';
  exitCode: number | null;
  signal: string | null;
  timedOut: boolean;
  durationMs: number | null;
  startedAt: string | null;
  endedAt: string | null;
  error: string | null;
  outputBytes: number;
  stdinOpen: boolean;
  tty: { rows: number; cols: number } | null;
}

export interface ExecInput {
  command: string[];
  timeoutSec?: number;
  cwd?: string;
  tty?: { rows: number; cols: number };
}
export const START_EXEC = `mutation StartExec($sandboxId: ID!, $input: ExecInput!) {
  exec(sandboxId: $sandboxId, input: $input, wait: false) { exec { ${EXEC_FIELDS} } }
}`;
export interface StartExecData { exec: { exec: Exec } }

export const EXEC = `query Exec($id: ID!) { exec(id: $id) { ${EXEC_FIELDS} } }`;
export interface ExecData { exec: Exec | null }

export const EXECS = `query Execs($sandboxId: ID!, $first: Int) {
  execs(sandboxId: $sandboxId, first: $first) { nodes { ${EXEC_FIELDS} } }
}`;
export interface ExecsData { execs: { nodes: Exec[] } }

export const SIGNAL_EXEC = `mutation SignalExec($execId: ID!, $signal: ExecSignal!) {
  signalExec(execId: $execId, signal: $signal) { exec { execId state } }
}`;

// One command's output from the cursor on; CHUNK events, TRUNCATED gaps, and EXIT last.
export const EXEC_OUTPUT = `subscription ExecOutput($execId: ID!, $after: String) {
  execOutput(execId: $execId, after: $after) {
    cursor kind stream dataBase64 missedBytes
    result { ${EXEC_FIELDS} }
  }
}`;
export interface ExecOutputEvent {
  cursor: string;
  kind: 'CHUNK' | 'TRUNCATED' | 'EXIT';
  stream: 'STDOUT' | 'STDERR' | null;
  dataBase64: string | null;
  missedBytes: number | null;
  result: Exec | null;
}

export interface FileInfo {
  name: string;
  path: string;
  size: number;
  mode: number;
  isDir: boolean;
  symlink: string | null;
  modTime: string | null;
  type: string | null;
}
const FILE_FIELDS = `name path size mode isDir symlink modTime type`;

// One page of a folder in name order; the next one is after pageInfo.endCursor.
export const LIST_FILES = `query ListFiles($sandboxId: ID!, $path: String, $first: Int, $after: String) {
  listFiles(sandboxId: $sandboxId, path: $path, first: $first, after: $after) {
    path nodes { ${FILE_FIELDS} } pageInfo { hasNextPage endCursor }
  }
}`;
export interface ListFilesData {
  listFiles: { path: string; nodes: FileInfo[]; pageInfo: { hasNextPage: boolean; endCursor: string | null } };
}

export const READ_FILE = `query ReadFile($sandboxId: ID!, $path: String!, $maxBytes: Int64) {
  readFile(sandboxId: $sandboxId, path: $path, maxBytes: $maxBytes) { path content size }
}`;
export interface ReadFileData { readFile: { path: string; content: string | null; size: number } }

export const DELETE_FILE = `mutation DeleteFile($sandboxId: ID!, $path: String!, $recursive: Boolean) {
  deleteFile(sandboxId: $sandboxId, path: $path, recursive: $recursive) { path }
}`;

export const MAKE_DIRECTORY = `mutation MakeDirectory($sandboxId: ID!, $path: String!) {
  makeDirectory(sandboxId: $sandboxId, path: $path) { created directory { path } }
}`;

export interface Snapshot {
  id: string;
  sandboxId: string;
  createdAt: string;
  sizeBytes: number;
  rawSizeBytes: number;
  parentSnapshotId: string | null;
}
const SNAPSHOT_FIELDS = `id sandboxId createdAt sizeBytes rawSizeBytes parentSnapshotId`;

export const SNAPSHOTS = `query Snapshots($sandboxId: ID, $first: Int) {
  snapshots(sandboxId: $sandboxId, first: $first) { nodes { ${SNAPSHOT_FIELDS} } pageInfo { hasNextPage } }
}`;
export interface SnapshotsData { snapshots: { nodes: Snapshot[]; pageInfo: { hasNextPage: boolean } } | null }

export const SNAPSHOT_SANDBOX = `mutation SnapshotSandbox($id: ID!) { snapshotSandbox(id: $id) { snapshot { ${SNAPSHOT_FIELDS} } } }`;
export const DELETE_SNAPSHOT = `mutation DeleteSnapshot($id: ID!) { deleteSnapshot(id: $id) { deletedSnapshotId } }`;

export type AgentRunStatus = 'QUEUED' | 'RUNNING' | 'SUCCEEDED' | 'FAILED' | 'CANCELLED' | 'TIMED_OUT';
export interface AgentRun {
  id: string;
  sandboxId: string;
  agentId: string;
  model: string | null;
  status: AgentRunStatus;
  reason: string | null;
  execId: string | null;
  exitCode: number | null;
  createdAt: string;
  endedAt: string | null;
}
const RUN_FIELDS = `id sandboxId agentId model status reason execId exitCode createdAt endedAt`;

export const AGENT_RUNS = `query AgentRuns($sandboxId: ID!, $first: Int) {
  agentRuns(sandboxId: $sandboxId, first: $first) { nodes { ${RUN_FIELDS} } pageInfo { hasNextPage } }
}`;
export interface AgentRunsData { agentRuns: { nodes: AgentRun[]; pageInfo: { hasNextPage: boolean } } | null }

export interface StartAgentRunInput { agentId: string; model?: string; instruction: string; sandboxId: string }
export const START_AGENT_RUN = `mutation StartAgentRun($input: StartAgentRunInput!) {
  startAgentRun(input: $input) { agentRun { ${RUN_FIELDS} } }
}`;
export interface StartAgentRunData { startAgentRun: { agentRun: AgentRun } }

export const CANCEL_AGENT_RUN = `mutation CancelAgentRun($id: ID!) { cancelAgentRun(id: $id) { agentRun { ${RUN_FIELDS} } } }`;
export interface CancelAgentRunData { cancelAgentRun: { agentRun: AgentRun } }

// One agent run: its status first, its output, and its status again once final.
export const AGENT_RUN_EVENTS = `subscription AgentRunEvents($runId: ID!, $after: String) {
  agentRunEvents(runId: $runId, after: $after) {
    cursor kind stream dataBase64 missedBytes run { ${RUN_FIELDS} }
  }
}`;
export interface AgentRunEvent {
  cursor: string;
  kind: 'STATUS' | 'CHUNK' | 'TRUNCATED';
  stream: 'STDOUT' | 'STDERR' | null;
  dataBase64: string | null;
  missedBytes: number | null;
  run: AgentRun | null;
}
