// Runs every graphql-http server audit (the GraphQL-over-HTTP spec's conformance checks) against
// a sandboxd GraphQL endpoint and prints one line per audit:
//
//	STATUS<TAB>ID<TAB>NAME<TAB>REASON
//
// STATUS is ok, notice (a failed MAY: optional), warn (a failed SHOULD) or error (a failed MUST,
// or an audit that could not run). It exits 1 when any audit warns or errs, 2 on bad usage.
//
// Usage: SANDBOXD_GRAPHQL_HTTP=$(scripts/ensure-graphql-http.sh) SANDBOX_API_KEY=… \
//
//	node scripts/graphql-audit.mjs http://127.0.0.1:8080/graphql
//
// Every request carries X-Api-Key: $SANDBOX_API_KEY (the endpoint answers 401 without one).
// Needs Node 18+ (its global fetch).
import { createRequire } from 'node:module';
import path from 'node:path';

const [url] = process.argv.slice(2);
const dir = process.env.SANDBOXD_GRAPHQL_HTTP;
const key = process.env.SANDBOX_API_KEY;
if (!url || !dir || !key) {
  console.error('usage: SANDBOXD_GRAPHQL_HTTP=DIR SANDBOX_API_KEY=KEY node graphql-audit.mjs URL');
  console.error('  DIR is what scripts/ensure-graphql-http.sh prints; URL is the /graphql endpoint');
  process.exit(2);
}
if (typeof fetch !== 'function') {
  console.error(`node ${process.version} has no global fetch: the audits need Node 18+`);
  process.exit(2);
}

const require = createRequire(path.join(path.resolve(dir), 'package.json'));
const { serverAudits } = require('graphql-http');

// fetchWithKey adds the API key to every audit request, keeping the audit's own headers.
function fetchWithKey(input, init = {}) {
  const headers = new Headers(init.headers);
  headers.set('X-Api-Key', key);
  return fetch(input, { ...init, headers });
}

// excerpt is the start of a failed audit's response, to tell what the server answered.
async function excerpt(res) {
  if (!res) return '';
  let body = '';
  try {
    body = (await res.clone().text()).replace(/\s+/g, ' ').slice(0, 300);
  } catch {
    // the audit already read the body
  }
  const type = res.headers.get('content-type') ?? '';
  return ` [got ${res.status} ${type}${body ? ` ${body}` : ''}]`;
}

const oneLine = (s) => String(s).replace(/[\t\r\n]+/g, ' ');

const audits = serverAudits({ url, fetchFn: fetchWithKey });
const counts = { ok: 0, notice: 0, warn: 0, error: 0 };
for (const audit of audits) {
  let status;
  let reason = '';
  try {
    const result = await audit.fn();
    status = result.status;
    if (status !== 'ok') reason = result.reason + (await excerpt(result.response));
  } catch (err) {
    // graphql-http throws only when an audit cannot run at all (e.g. the server is unreachable).
    status = 'error';
    reason = `audit did not run: ${err?.cause?.message ?? err?.message ?? err}`;
  }
  counts[status] = (counts[status] ?? 0) + 1;
  console.log([status, audit.id, audit.name, oneLine(reason)].join('\t'));
}
const total = audits.length;
console.log(
  `graphql-http audits: ${total} run, ${counts.ok} ok, ${counts.notice} notice, ${counts.warn} warn, ${counts.error} error`,
);
process.exit(counts.warn > 0 || counts.error > 0 ? 1 : 0);
