// Package execstream is the Redis side of exec output streaming: one bounded Redis Stream per
// exec holding its stdout/stderr chunks and then its exit status, a small meta hash per exec
// (owner, state, times, exit status, the guest log offset copied so far, the follower lease),
// and two indexes (running execs, ended execs) for the reconciler and the sweeper.
//
// Exactly one replica at a time copies an exec's output from the guest init into the stream: it
// holds the exec's follower lease (TryFollow). Append writes chunks and advances the stored guest
// offset atomically, only for the lease holder and only when the chunks start exactly at the
// stored offset, so a follower that takes over after a replica died continues where the last
// copied chunk ended: no loss, no duplicate. Any replica serves any reader (Read, Subscribe):
// the cursor is the stream entry id, and a reader whose cursor is older than what the bounded
// stream still holds gets an explicit truncated event, never a silent gap.
//
// Expiry (leases, retention) is data compared with a clock the caller passes in, never a key
// TTL: the embedded Redis (miniredis) does not expire keys on real time. Key schema and scripts:
// README.md beside this file.
package execstream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"sandboxd/internal/apierror"
)

// Stream names the output a chunk came from.
type Stream string

// The two output streams, and Gap.
const (
	Stdout Stream = "stdout"
	Stderr Stream = "stderr"
	// Gap marks a Chunk without output: the guest log bytes from its Start to its Offset are
	// lost (the guest's bounded log dropped them before they were copied). No entry is
	// written for it; readers get a truncated event for those bytes before the next entry.
	Gap Stream = "gap"
)

// State is an exec's state as the stream knows it.
type State string

// The states: running until the exit status has been appended, then ended.
const (
	Running State = "running"
	Ended   State = "ended"
)

// Errors. Those a client may see carry an apierror code.
var (
	ErrNotFound  = apierror.New(apierror.NotFound, "exec not found")
	ErrExists    = apierror.New(apierror.AlreadyExists, "exec already exists")
	ErrBadCursor = apierror.New(apierror.InvalidArgument, "malformed or unknown output cursor")
	ErrEnded     = apierror.New(apierror.InvalidState, "exec has ended")
	// ErrNotFollower means the caller does not hold a live follower lease (it lapsed, or another
	// replica took over): it must stop writing and call TryFollow again.
	ErrNotFollower = errors.New("execstream: not the exec's follower")
	// ErrOffset means the first chunk does not start at the stored guest offset (it would
	// duplicate or skip output): the follower reopens the guest log at the offset TryFollow gives.
	ErrOffset = errors.New("execstream: chunk does not start at the stored offset")
)

// Chunk is a piece of output copied from the guest init's log.
type Chunk struct {
	Stream Stream
	Data   []byte
	// Start is the guest log offset where the chunk begins: the stored offset for the first
	// chunk of an Append, the previous chunk's Offset for the others.
	Start int64
	// Offset is the guest log offset just after the chunk (guest/client's Record.Offset), where
	// the next follower resumes. For one guest record it is Start + RecordHeaderLen (of
	// guest/proto) + len(Data).
	Offset int64
}

// Exit is an exec's final status.
type Exit struct {
	// ExitCode is the exit code, 128+n when killed by signal n.
	ExitCode int
	// Signal names the signal that killed the command ("SIGKILL"), empty when it exited.
	Signal     string
	TimedOut   bool
	DurationMs int64
	// Error says why the command could not start or could not be followed to its end.
	Error string
	// Dropped counts output bytes an older guest init dropped at the end of the output (its
	// log was full): readers get a truncated event for them before the exit. A guest that
	// keeps the newest output reports its drops in place (Gap chunks) and this stays 0.
	Dropped int64
	// StdoutBytes and StderrBytes count every byte the command wrote to each, kept or not,
	// as the guest counted them (both 0 when unknown: no output, an older guest init, or an
	// exec that could not be followed to its end).
	StdoutBytes int64
	StderrBytes int64
}

// Meta is the state of one exec.
type Meta struct {
	ID      string
	Tenant  string
	Project string
	Sandbox string
	// Argv is a short summary of the command line (see Summarize).
	Argv      string
	State     State
	StartedAt time.Time
	// EndedAt is zero while running.
	EndedAt time.Time
	// Exit is set once ended.
	Exit *Exit
	// Offset is the guest log offset just after the last chunk copied into the stream.
	Offset int64
	// Bytes counts the output bytes appended (stdout and stderr), trimmed or not; output the
	// guest dropped before it was copied is not in it (Exit has the exact counts).
	Bytes int64
	// Follower is the token of the replica that holds (or last held) the follower lease;
	// LeaseUntil is when that lease ends (zero: nobody follows).
	Follower   string
	LeaseUntil time.Time
	// StdinOpen: the exec was started with its stdin open (or a terminal) and no call has
	// closed it yet. (Once ended, its stdin is closed whatever this says.)
	StdinOpen bool
	// TtyRows and TtyCols are the terminal's last size set for an exec run under one (0 for
	// none).
	TtyRows, TtyCols int
}

// Options bound the streams and tune reading. Zero values take the defaults.
type Options struct {
	// MaxLen bounds the entries of one exec's stream (default 50000). Trimmed with
	// XTRIM MAXLEN ~: a real Redis keeps somewhat more (it drops whole nodes only), the
	// embedded one trims exactly.
	MaxLen int64
	// MaxBytes bounds the guest log bytes one stream holds (output plus the 5-byte record
	// headers; default 16 MiB), give or take one chunk and the approximation of XTRIM MINID ~.
	MaxBytes int64
	// Retention is how long an ended exec's stream and status are kept (default 1 h); Sweep
	// deletes them after that.
	Retention time.Duration
	// MaxEndedBytes bounds the output all ended execs' streams hold together (default
	// 64 MiB; each counts as its guest log bytes, at most MaxBytes): Sweep deletes the oldest
	// ended execs beyond it, before their retention ends. Running execs are never deleted.
	MaxEndedBytes int64
	// Block is how long one XREAD of a subscription waits before it checks its context again
	// (default 5 s). A cancelled subscription ends within about this long.
	Block time.Duration
	// Buffer is the capacity of a subscription's channel, in events (default 16; each event
	// holds at most one chunk of up to 64 KiB).
	Buffer int
	// Now is the clock of Append's lease check and of ended_at (default time.Now).
	Now func() time.Time
	// Blocking, when set, is the client for the blocking XREADs of Read and Subscribe, so that
	// many waiting subscribers cannot take every connection of the pool Append uses.
	Blocking redis.UniversalClient
	// MaxPerSandbox bounds the members of one sandbox's exec index, the newest kept (default
	// DefaultMaxPerSandbox): List sees at most that many of a sandbox's execs.
	MaxPerSandbox int64
}

// Store keeps exec output streams and status in Redis.
type Store struct {
	rdb   redis.UniversalClient
	block redis.UniversalClient
	opts  Options
	// live are the windows that feed this replica's subscribers from its followers (live.go).
	live *feeds
}

// New returns a Store on rdb.
func New(rdb redis.UniversalClient, opts Options) *Store {
	if opts.MaxLen <= 0 {
		opts.MaxLen = 50000
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = 16 << 20
	}
	if opts.Retention <= 0 {
		opts.Retention = time.Hour
	}
	if opts.MaxEndedBytes <= 0 {
		opts.MaxEndedBytes = 64 << 20
	}
	if opts.Block <= 0 {
		opts.Block = 5 * time.Second
	}
	if opts.Buffer <= 0 {
		opts.Buffer = 16
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Store{rdb: rdb, block: opts.Blocking, opts: opts, live: newFeeds(opts)}
	if s.block == nil {
		s.block = rdb
	}
	return s
}

// Retention is how long an ended exec's stream and status are kept.
func (s *Store) Retention() time.Duration { return s.opts.Retention }

// MaxEndedBytes is the most output all ended execs' streams hold together.
func (s *Store) MaxEndedBytes() int64 { return s.opts.MaxEndedBytes }

// Keys. Every key of one exec shares the hash tag {<exec id>}; the two indexes are global keys
// written by separate commands, never inside a script with an exec's keys.
const (
	runningKey = "exec:running"
	endedKey   = "exec:ended"
)

func metaKey(id string) string { return "exec:{" + id + "}:meta" }
func outKey(id string) string  { return "exec:{" + id + "}:out" }

// sandboxKey is the index of one sandbox's execs (list.go).
func sandboxKey(sandboxID string) string { return "execs:sandbox:{" + sandboxID + "}" }

// validID reports whether id can be used inside a hash tag.
func validID(id string) bool {
	return id != "" && len(id) <= 128 && !strings.ContainsAny(id, "{}")
}

// maxArgv bounds the stored command-line summary.
const maxArgv = 256

// Summarize is a short, shell-quoted summary of a command line (at most 256 bytes, ending in
// "…" when cut), for status and listings.
func Summarize(argv []string) string {
	var b strings.Builder
	for i, a := range argv {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(shellQuote(a))
		if b.Len() > maxArgv {
			break
		}
	}
	return apierror.Truncate(b.String(), maxArgv)
}

func shellQuote(s string) string {
	if s == "" {
		return "''"
	}
	plain := true
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("@%_+=:,./-", r)) {
			plain = false
			break
		}
	}
	if plain {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func ms(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromMs(s string) time.Time {
	n, _ := strconv.ParseInt(s, 10, 64)
	if n <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(n).UTC()
}

// Create registers a new running exec (ID, Tenant, Project, Sandbox and Argv of m; StartedAt
// is now) and, when token is not empty, makes the caller its follower until now+lease, so no
// reconciler takes it over before the first TryFollow. ErrExists when the id is taken.
func (s *Store) Create(ctx context.Context, m Meta, token string, now time.Time, lease time.Duration) error {
	if !validID(m.ID) {
		return apierror.New(apierror.InvalidArgument, "invalid exec id %q", m.ID)
	}
	leaseUntil := int64(0)
	if token != "" {
		leaseUntil = now.Add(lease).UnixMilli()
	}
	stdin, tty := "0", ""
	if m.StdinOpen {
		stdin = "1"
	}
	if m.TtyRows > 0 && m.TtyCols > 0 {
		tty = ttyValue(m.TtyRows, m.TtyCols)
	}
	keys := []string{metaKey(m.ID)}
	args := []any{m.Tenant, m.Project, m.Sandbox, apierror.Truncate(m.Argv, maxArgv), now.UnixMilli(), token, leaseUntil, stdin, tty}
	// The indexes before the meta hash, in one round trip: Redis runs a connection's commands
	// in order. An index member without a meta hash is harmless (Orphans drops it after a grace
	// period, a listing skips it); a running exec missing from the running index would never
	// be found orphaned, so a hash made while an index write failed is deleted again.
	var created *redis.Cmd
	cmds, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAddNX(ctx, runningKey, redis.Z{Score: float64(now.UnixMilli()), Member: m.ID})
		s.indexSandbox(ctx, p, m)
		created = createScript.EvalSha(ctx, p, keys, args...)
		return nil
	})
	for _, c := range cmds {
		if c != created && c.Err() != nil {
			if n, _ := created.Int(); n == 1 {
				_ = s.rdb.Del(context.WithoutCancel(ctx), keys[0]).Err()
			}
			return fmt.Errorf("execstream create %s: %w", m.ID, c.Err())
		}
	}
	if err != nil && redis.HasErrorPrefix(created.Err(), "NOSCRIPT") {
		// A Redis that does not have the script yet (new, restarted, flushed): sent whole.
		created = createScript.Run(ctx, s.rdb, keys, args...)
	}
	n, err := created.Int()
	if err != nil {
		return fmt.Errorf("execstream create %s: %w", m.ID, err)
	}
	if n == 0 {
		return fmt.Errorf("execstream create %s: %w", m.ID, ErrExists)
	}
	return nil
}

// createScript creates the meta hash of a new exec.
// KEYS[1] meta hash. ARGV[1] tenant, ARGV[2] project, ARGV[3] sandbox, ARGV[4] argv summary,
// ARGV[5] started_at (unix ms), ARGV[6] follower token ("" for none), ARGV[7] lease_until
// (unix ms, 0 for none), ARGV[8] stdin ("1" open, "0" not), ARGV[9] tty ("<rows>x<cols>",
// "" for none). Returns 1 when created, 0 when the exec already exists (unchanged).
var createScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'tenant', ARGV[1], 'project', ARGV[2], 'sandbox', ARGV[3],
  'argv', ARGV[4], 'state', 'running', 'started_at', ARGV[5], 'offset', '0', 'bytes', '0',
  'follower', ARGV[6], 'lease_until', ARGV[7], 'stdin', ARGV[8], 'tty', ARGV[9])
return 1`)

// Get returns the state of an exec; ErrNotFound when it does not exist (or was swept).
func (s *Store) Get(ctx context.Context, execID string) (Meta, error) {
	if !validID(execID) {
		return Meta{}, fmt.Errorf("execstream get %q: %w", execID, ErrNotFound)
	}
	vals, err := s.rdb.HGetAll(ctx, metaKey(execID)).Result()
	if err != nil {
		return Meta{}, fmt.Errorf("execstream get %s: %w", execID, err)
	}
	m, ok := parseMeta(execID, vals)
	if !ok {
		return Meta{}, fmt.Errorf("execstream get %s: %w", execID, ErrNotFound)
	}
	return m, nil
}

func parseMeta(id string, v map[string]string) (Meta, bool) {
	if v["state"] == "" {
		return Meta{}, false
	}
	m := Meta{
		ID: id, Tenant: v["tenant"], Project: v["project"], Sandbox: v["sandbox"], Argv: v["argv"],
		State: State(v["state"]), StartedAt: fromMs(v["started_at"]), EndedAt: fromMs(v["ended_at"]),
		Follower: v["follower"], LeaseUntil: fromMs(v["lease_until"]),
	}
	m.Offset, _ = strconv.ParseInt(v["offset"], 10, 64)
	m.Bytes, _ = strconv.ParseInt(v["bytes"], 10, 64)
	m.StdinOpen = v["stdin"] == "1"
	m.TtyRows, m.TtyCols = parseTty(v["tty"])
	if m.State == Ended {
		code, _ := strconv.Atoi(v["exit_code"])
		dur, _ := strconv.ParseInt(v["duration_ms"], 10, 64)
		dropped, _ := strconv.ParseInt(v["dropped"], 10, 64)
		m.Exit = &Exit{ExitCode: code, Signal: v["signal"], TimedOut: v["timed_out"] == "1", DurationMs: dur, Error: v["error"], Dropped: dropped}
		m.Exit.StdoutBytes, _ = strconv.ParseInt(v["stdout_bytes"], 10, 64)
		m.Exit.StderrBytes, _ = strconv.ParseInt(v["stderr_bytes"], 10, 64)
	}
	return m, true
}
