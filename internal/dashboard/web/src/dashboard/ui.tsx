// Small pieces the panels share: the error list, formatting.
import { useMemo, useState } from 'preact/hooks';
import { ApiError } from './api';

export interface Errors {
  list: { id: number; text: string }[];
  // report shows an error (its code and message) until it is dismissed.
  report: (err: unknown, what?: string) => void;
  dismiss: (id: number) => void;
  // guard runs fn and reports what it throws.
  guard: <T>(what: string, fn: () => Promise<T>) => Promise<T | undefined>;
}

let seq = 0;

export function useErrors(): Errors {
  const [list, setList] = useState<{ id: number; text: string }[]>([]);
  return useMemo(() => {
    const report = (err: unknown, what?: string) => {
      const text = err instanceof ApiError ? `${err.code}: ${err.message}` : String(err);
      const id = ++seq;
      setList((l) => [...l.slice(-4), { id, text: what ? `${what}: ${text}` : text }]);
    };
    return {
      list,
      report,
      dismiss: (id: number) => setList((l) => l.filter((e) => e.id !== id)),
      guard: async <T,>(what: string, fn: () => Promise<T>) => {
        try {
          return await fn();
        } catch (err) {
          report(err, what);
          return undefined;
        }
      },
    };
  }, [list]);
}

export function ErrorList({ errors }: { errors: Errors }) {
  if (errors.list.length === 0) return null;
  return (
    <ul class="errors" id="errors">
      {errors.list.map((e) => (
        <li key={e.id}>
          <span>{e.text}</span>
          <button type="button" aria-label="dismiss" onClick={() => errors.dismiss(e.id)}>
            ×
          </button>
        </li>
      ))}
    </ul>
  );
}

export function bytes(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let v = n;
  let i = -1;
  do {
    v /= 1024;
    i++;
  } while (v >= 1024 && i < units.length - 1);
  return `${v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`;
}

export function when(t: string | null): string {
  if (!t) return '—';
  const d = new Date(t);
  return Number.isNaN(d.getTime()) ? t : d.toLocaleString();
}
