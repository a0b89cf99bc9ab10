// Package agentrun keeps the records of agent runs in Redis: who owns a run, which agent,
// model and sandbox it has, the exec it runs as, whether it was cancelled, and its final status
// once known. internal/agents derives a running run's status from its exec; this
// package only stores. Key schema and scripts: README.md.
package agentrun

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNotFound: no run with that id.
var ErrNotFound = errors.New("agentrun: not found")

// Record is one agent run as stored.
type Record struct {
	ID      string
	Tenant  string
	Project string
	Sandbox string
	Agent   string
	Model   string
	// RunDir is the run's folder in the workspace (instruction and config).
	RunDir    string
	CreatedAt time.Time
	// ExecID is the detached exec the agent runs as ("" while QUEUED, or when it never ran).
	ExecID    string
	StartedAt time.Time
	Cancelled bool
	// Status is the final status once known ("" while it is derived from the exec); Reason,
	// ExitCode, Signal and EndedAt go with it.
	Status   string
	Reason   string
	ExitCode int
	Signal   string
	EndedAt  time.Time
}

// Options configures a Store.
type Options struct {
	// KeepPerSandbox is how many runs of one sandbox are kept (the oldest go first; default 100).
	KeepPerSandbox int64
}

// Store keeps agent run records.
type Store struct {
	rdb  redis.UniversalClient
	keep int64
}

// New returns a Store on rdb.
func New(rdb redis.UniversalClient, opts Options) *Store {
	if opts.KeepPerSandbox <= 0 {
		opts.KeepPerSandbox = 100
	}
	return &Store{rdb: rdb, keep: opts.KeepPerSandbox}
}

func metaKey(id string) string       { return "agentrun:{" + id + "}:meta" }
func indexKey(sandbox string) string { return "agentrun:{" + sandbox + "}:runs" }

func ms(t time.Time) string {
	if t.IsZero() {
		return "0"
	}
	return strconv.FormatInt(t.UnixMilli(), 10)
}

func fromMs(s string) time.Time {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n == 0 {
		return time.Time{}
	}
	return time.UnixMilli(n).UTC()
}

// Create stores a new run and indexes it under its sandbox; runs beyond KeepPerSandbox (the
// oldest) are deleted.
func (s *Store) Create(ctx context.Context, r Record) error {
	if err := s.rdb.HSet(ctx, metaKey(r.ID), map[string]any{
		"tenant": r.Tenant, "project": r.Project, "sandbox": r.Sandbox, "agent": r.Agent, "model": r.Model,
		"run_dir": r.RunDir, "created_at": ms(r.CreatedAt), "exec_id": r.ExecID, "started_at": ms(r.StartedAt),
		"cancelled": "0", "status": r.Status, "reason": r.Reason,
	}).Err(); err != nil {
		return err
	}
	if err := s.rdb.ZAdd(ctx, indexKey(r.Sandbox), redis.Z{Score: float64(r.CreatedAt.UnixMilli()), Member: r.ID}).Err(); err != nil {
		return err
	}
	old, err := s.rdb.ZRange(ctx, indexKey(r.Sandbox), 0, -s.keep-1).Result()
	if err != nil || len(old) == 0 {
		return nil // trimming is best effort; the next create tries again
	}
	for _, id := range old {
		s.rdb.Del(ctx, metaKey(id))
	}
	members := make([]any, len(old))
	for i, id := range old {
		members[i] = id
	}
	s.rdb.ZRem(ctx, indexKey(r.Sandbox), members...)
	return nil
}

// Get reads one run.
func (s *Store) Get(ctx context.Context, id string) (Record, error) {
	v, err := s.rdb.HGetAll(ctx, metaKey(id)).Result()
	if err != nil {
		return Record{}, err
	}
	if len(v) == 0 {
		return Record{}, ErrNotFound
	}
	code, _ := strconv.Atoi(v["exit_code"])
	return Record{ID: id, Tenant: v["tenant"], Project: v["project"], Sandbox: v["sandbox"], Agent: v["agent"],
		Model: v["model"], RunDir: v["run_dir"], CreatedAt: fromMs(v["created_at"]), ExecID: v["exec_id"],
		StartedAt: fromMs(v["started_at"]), Cancelled: v["cancelled"] == "1", Status: v["status"], Reason: v["reason"],
		ExitCode: code, Signal: v["signal"], EndedAt: fromMs(v["ended_at"])}, nil
}

// List returns up to limit runs of a sandbox, newest first. Index entries whose record is
// gone are dropped.
func (s *Store) List(ctx context.Context, sandbox string, limit int) ([]Record, error) {
	ids, err := s.rdb.ZRevRange(ctx, indexKey(sandbox), 0, int64(limit)-1).Result()
	if err != nil {
		return nil, err
	}
	out := make([]Record, 0, len(ids))
	for _, id := range ids {
		r, err := s.Get(ctx, id)
		if errors.Is(err, ErrNotFound) {
			s.rdb.ZRem(ctx, indexKey(sandbox), id)
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// SetExec records the exec the run started as.
func (s *Store) SetExec(ctx context.Context, id, execID string, at time.Time) error {
	return s.set(ctx, id, "exec_id", execID, "started_at", ms(at))
}

// Cancel marks the run cancelled (its exec is then killed by the domain).
func (s *Store) Cancel(ctx context.Context, id string) error {
	return s.set(ctx, id, "cancelled", "1")
}

// Finish records the run's final status. A run that has one keeps it (the first wins).
func (s *Store) Finish(ctx context.Context, id, status, reason string, exitCode int, signal string, at time.Time) error {
	n, err := finishScript.Run(ctx, s.rdb, []string{metaKey(id)}, status, reason, exitCode, signal, ms(at)).Int()
	if err != nil {
		return err
	}
	if n == 0 {
		return ErrNotFound
	}
	return nil
}

// finishScript sets the final status of a run unless it has one.
// KEYS[1] the run's meta hash. ARGV status, reason, exit code, signal, ended_at (unix ms).
// Returns 0 when the run does not exist, 1 when set, 2 when it had a status already.
var finishScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local st = redis.call('HGET', KEYS[1], 'status')
if st and st ~= '' then return 2 end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'reason', ARGV[2], 'exit_code', ARGV[3], 'signal', ARGV[4], 'ended_at', ARGV[5])
return 1
`)

// set writes fields of an existing run (never creating one).
func (s *Store) set(ctx context.Context, id string, kv ...any) error {
	n, err := setScript.Run(ctx, s.rdb, []string{metaKey(id)}, kv...).Int()
	if err != nil {
		return err
	}
	if n == 0 {
		return ErrNotFound
	}
	return nil
}

// setScript writes field/value pairs into a run's meta hash when it exists.
// KEYS[1] the run's meta hash. ARGV field, value, field, value, …
// Returns 0 when the run does not exist, else 1.
var setScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
`)
