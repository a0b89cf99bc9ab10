package execstream

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/redis/go-redis/v9"
)

// The per-sandbox index: a sorted set per sandbox whose members are its exec ids, all with
// score 0, so that Redis orders them by id, and exec ids are ULIDs: by start time. It is a
// hint, like the running and ended indexes: Create adds the member before the meta hash, a
// listing drops members whose meta hash is gone, Sweep removes the execs it deletes, and each
// index keeps the newest MaxPerSandbox members.

// DefaultMaxPerSandbox is Options.MaxPerSandbox's default.
const DefaultMaxPerSandbox = 10000

// indexSandbox queues on p the commands that add m to its sandbox's index and trim the index
// to its newest members.
func (s *Store) indexSandbox(ctx context.Context, p redis.Pipeliner, m Meta) {
	if m.Sandbox == "" || !validID(m.Sandbox) {
		return
	}
	key := sandboxKey(m.Sandbox)
	p.ZAddNX(ctx, key, redis.Z{Score: 0, Member: m.ID})
	p.ZRemRangeByRank(ctx, key, 0, -s.maxPerSandbox()-1)
}

func (s *Store) maxPerSandbox() int64 {
	if s.opts.MaxPerSandbox > 0 {
		return s.opts.MaxPerSandbox
	}
	return DefaultMaxPerSandbox
}

// List returns a page of one sandbox's execs, newest first: at most limit of them after the
// exec id after ("" for the first page), only those in state when it is not "", and the
// cursor of the next page ("" on the last one). It reads at most listScanBudget(limit) members
// of the index (and never more than its bound): a filtered page that has not filled by then is
// short, even empty, and has a cursor all the same.
func (s *Store) List(ctx context.Context, sandboxID string, state State, after string, limit int) ([]Meta, string, error) {
	if !validID(sandboxID) || limit <= 0 || (after != "" && !validID(after)) {
		return nil, "", nil
	}
	key := sandboxKey(sandboxID)
	start := "+"
	if after != "" {
		start = "(" + after
	}
	batch := int64(min(max(limit+1, 64), 256))
	budget, scanned := listScanBudget(limit), 0
	var out []Meta
	for {
		ids, err := s.rdb.ZRevRangeByLex(ctx, key, &redis.ZRangeBy{Min: "-", Max: start, Count: batch}).Result()
		if err != nil {
			return nil, "", fmt.Errorf("execstream list %s: %w", sandboxID, err)
		}
		if len(ids) == 0 {
			return out, "", nil
		}
		cmds := make([]*redis.MapStringStringCmd, len(ids))
		if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, id := range ids {
				cmds[i] = p.HGetAll(ctx, metaKey(id))
			}
			return nil
		}); err != nil {
			return nil, "", fmt.Errorf("execstream list %s: %w", sandboxID, err)
		}
		var stale []any
		for i, id := range ids {
			m, ok := parseMeta(id, cmds[i].Val())
			if !ok {
				if createdBefore(id, s.opts.Now().Add(-createGrace)) {
					stale = append(stale, id)
				}
				continue
			}
			if m.Sandbox != sandboxID || (state != "" && m.State != state) {
				continue
			}
			out = append(out, m)
			if len(out) > limit {
				if len(stale) > 0 {
					_ = s.rdb.ZRem(ctx, key, stale...).Err() // a hint: repaired next time otherwise
				}
				return out[:limit], out[limit-1].ID, nil
			}
		}
		if len(stale) > 0 {
			_ = s.rdb.ZRem(ctx, key, stale...).Err()
		}
		if int64(len(ids)) < batch {
			return out, "", nil
		}
		if scanned += len(ids); scanned >= budget {
			// A filter that matches little must not read the whole index in one call: the
			// page ends here, short or even empty, with the cursor of the last member read.
			return out, ids[len(ids)-1], nil
		}
		start = "(" + ids[len(ids)-1]
	}
}

// listScanBudget is how many index members one List reads at most for a page of limit: a
// filtered page that has not filled by then ends early with a cursor.
func listScanBudget(limit int) int { return 20*limit + 1000 }

// createdBefore reports whether an exec id's ULID was made before t (true for an id that is
// not "<prefix>_<ULID>": no exec of ours).
func createdBefore(id string, t time.Time) bool {
	_, u, ok := strings.Cut(id, "_")
	if !ok {
		return true
	}
	v, err := ulid.ParseStrict(u)
	if err != nil {
		return true
	}
	return ulid.Time(v.Time()).Before(t)
}

// CloseStdin records that a running exec's stdin was closed. An exec that ended or is gone is
// left as it is.
func (s *Store) CloseStdin(ctx context.Context, execID string) error {
	return s.setRunning(ctx, execID, "stdin", "0")
}

// SetTty records a running exec's new terminal size.
func (s *Store) SetTty(ctx context.Context, execID string, rows, cols int) error {
	return s.setRunning(ctx, execID, "tty", ttyValue(rows, cols))
}

func (s *Store) setRunning(ctx context.Context, execID, field, value string) error {
	if !validID(execID) {
		return fmt.Errorf("execstream set %q: %w", execID, ErrNotFound)
	}
	n, err := setRunningScript.Run(ctx, s.rdb, []string{metaKey(execID)}, field, value).Int()
	if err != nil {
		return fmt.Errorf("execstream set %s: %w", execID, err)
	}
	if n == 0 {
		return fmt.Errorf("execstream set %s: %w", execID, ErrNotFound)
	}
	return nil
}

// setRunningScript sets one field of a running exec's meta hash.
// KEYS[1] meta hash. ARGV[1] field, ARGV[2] value. Returns 1 when set, 0 when the exec does
// not exist, -3 when it ended (nothing written).
var setRunningScript = redis.NewScript(`
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return 0 end
if st ~= 'running' then return -3 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1`)

// ttyValue is the meta hash's form of a terminal size: "<rows>x<cols>".
func ttyValue(rows, cols int) string {
	return strconv.Itoa(rows) + "x" + strconv.Itoa(cols)
}

func parseTty(v string) (rows, cols int) {
	r, c, ok := strings.Cut(v, "x")
	if !ok {
		return 0, 0
	}
	rows, err1 := strconv.Atoi(r)
	cols, err2 := strconv.Atoi(c)
	if err1 != nil || err2 != nil || rows <= 0 || cols <= 0 {
		return 0, 0
	}
	return rows, cols
}
