package execstream

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"sandboxd/internal/apierror"
)

// TryFollow takes or renews the follower lease of an exec for the replica token until
// now+lease. ok is true when the caller now holds it; false (with a nil error) while another
// replica's lease is live. resumeOffset is the guest log offset just after the last chunk
// already in the stream: the new follower opens the guest log there, so nothing is copied twice
// or skipped. ErrNotFound for an unknown exec, ErrEnded once its exit status is in the stream.
//
// Leases are compared with the callers' clocks: a lease must be much longer than the clock skew
// between replicas (seconds, not milliseconds). Skew never breaks the stream itself: Append is
// fenced by the token and the stored offset.
func (s *Store) TryFollow(ctx context.Context, execID, replicaToken string, now time.Time, lease time.Duration) (resumeOffset int64, ok bool, err error) {
	if !validID(execID) {
		return 0, false, fmt.Errorf("execstream follow %q: %w", execID, ErrNotFound)
	}
	if replicaToken == "" {
		return 0, false, fmt.Errorf("execstream follow %s: empty replica token", execID)
	}
	res, err := followScript.Run(ctx, s.rdb, []string{metaKey(execID)},
		replicaToken, now.UnixMilli(), now.Add(lease).UnixMilli()).Int64Slice()
	if err != nil {
		return 0, false, fmt.Errorf("execstream follow %s: %w", execID, err)
	}
	switch res[0] {
	case -1:
		return 0, false, fmt.Errorf("execstream follow %s: %w", execID, ErrNotFound)
	case -2:
		return res[1], false, fmt.Errorf("execstream follow %s: %w", execID, ErrEnded)
	}
	return res[1], res[0] == 1, nil
}

// followScript takes or renews a follower lease.
// KEYS[1] meta hash. ARGV[1] replica token, ARGV[2] now (unix ms), ARGV[3] lease_until (unix
// ms). Returns {status, offset}: status 1 = the lease is ARGV[1]'s until ARGV[3] (taken,
// renewed, or taken over from a holder whose lease_until <= now); 0 = another holder's lease is
// live (nothing changed); -1 = no such exec; -2 = the exec has ended (nothing changed). offset
// is the stored guest offset.
var followScript = redis.NewScript(`
local m = redis.call('HMGET', KEYS[1], 'state', 'follower', 'lease_until', 'offset')
if not m[1] then return {-1, 0} end
local off = tonumber(m[4]) or 0
if m[1] ~= 'running' then return {-2, off} end
if m[2] and m[2] ~= '' and m[2] ~= ARGV[1] and (tonumber(m[3]) or 0) > tonumber(ARGV[2]) then
  return {0, off}
end
redis.call('HSET', KEYS[1], 'follower', ARGV[1], 'lease_until', ARGV[3])
return {1, off}`)

// Release gives up the follower lease if token holds it (a replica shutting down), so that
// another replica can take over at once instead of after the lease. It reports whether the
// lease was held.
func (s *Store) Release(ctx context.Context, execID, token string) (bool, error) {
	if !validID(execID) {
		return false, fmt.Errorf("execstream release %q: %w", execID, ErrNotFound)
	}
	n, err := releaseScript.Run(ctx, s.rdb, []string{metaKey(execID)}, token).Int()
	if err != nil {
		return false, fmt.Errorf("execstream release %s: %w", execID, err)
	}
	return n == 1, nil
}

// releaseScript ends a follower lease early.
// KEYS[1] meta hash. ARGV[1] replica token. Returns 1 when ARGV[1] was the follower (its
// lease_until is now 0), else 0 (nothing changed).
var releaseScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'follower') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'lease_until', '0')
return 1`)

// Append writes chunks and then, when exit is not nil, the exit status to the exec's stream,
// and advances the stored guest offset to the last chunk's Offset, all in one script. It first
// checks that token holds a live lease (by the Store's clock): ErrNotFollower otherwise, and
// nothing is written. The first chunk must start at the stored offset and each next chunk where
// the previous one ended: ErrOffset otherwise (nothing written). ErrEnded once the exit status
// is in the stream; ErrNotFound for an unknown exec. After the exit the lease is over, and the
// follower moves the exec to the ended index with Ended (beside whatever else it does then:
// the indexes are no part of what a reader of the exec sees).
func (s *Store) Append(ctx context.Context, execID, token string, chunks []Chunk, exit *Exit) error {
	if !validID(execID) {
		return fmt.Errorf("execstream append %q: %w", execID, ErrNotFound)
	}
	if len(chunks) == 0 && exit == nil {
		return nil
	}
	for i, c := range chunks {
		if c.Stream != Stdout && c.Stream != Stderr && c.Stream != Gap {
			return fmt.Errorf("execstream append %s: chunk %d: unknown stream %q", execID, i, c.Stream)
		}
		if c.Stream == Gap && len(c.Data) > 0 {
			return fmt.Errorf("execstream append %s: chunk %d: a gap with data", execID, i)
		}
		if c.Start < 0 || c.Offset <= c.Start {
			return fmt.Errorf("execstream append %s: chunk %d: offset %d does not follow start %d", execID, i, c.Offset, c.Start)
		}
		if i > 0 && c.Start != chunks[i-1].Offset {
			return fmt.Errorf("execstream append %s: chunk %d starts at %d, the previous one ended at %d: %w",
				execID, i, c.Start, chunks[i-1].Offset, ErrOffset)
		}
	}
	now := s.opts.Now()
	args := make([]any, 0, 14+4*len(chunks))
	args = append(args, token, now.UnixMilli(), s.opts.MaxLen, s.opts.MaxBytes, len(chunks))
	if exit != nil {
		timedOut := 0
		if exit.TimedOut {
			timedOut = 1
		}
		args = append(args, 1, exit.ExitCode, exit.Signal, timedOut, exit.DurationMs, apierror.Truncate(exit.Error, 1024), exit.Dropped,
			exit.StdoutBytes, exit.StderrBytes)
	} else {
		args = append(args, 0, 0, "", 0, 0, "", 0, 0, 0)
	}
	for _, c := range chunks {
		args = append(args, string(c.Stream), c.Start, c.Offset, c.Data)
	}
	if offerable(chunks) {
		// This replica's subscribers have the chunks now, beside the round trip (live.go).
		s.live.offer(execID, chunks)
	}
	res, err := appendScript.Run(ctx, s.rdb, []string{metaKey(execID), outKey(execID)}, args...).Int64Slice()
	if err != nil {
		return fmt.Errorf("execstream append %s: %w", execID, err)
	}
	switch res[0] {
	case 0:
		return fmt.Errorf("execstream append %s: %w", execID, ErrNotFound)
	case -1:
		return fmt.Errorf("execstream append %s: %w", execID, ErrNotFollower)
	case -2:
		return fmt.Errorf("execstream append %s: stored offset %d, first chunk starts at %d: %w", execID, res[1], chunks[0].Start, ErrOffset)
	case -3:
		return fmt.Errorf("execstream append %s: %w", execID, ErrEnded)
	}
	// Redis has the batch: this replica's subscribers may have the exit from memory now (and the
	// chunks, when they were not offered).
	var end *End
	if exit != nil {
		end = &End{At: time.UnixMilli(now.UnixMilli()).UTC(), Bytes: res[2]}
	}
	s.live.publish(execID, chunks, exit, end, res[1])
	return nil
}

// offerable reports whether a batch's chunks may reach this replica's subscribers before Redis
// takes them: a batch within MaxLead, and without a gap (where the guest's log had dropped
// output before this follower read it: another follower may have copied that output, and the
// window then gives what Redis has).
func offerable(chunks []Chunk) bool {
	if len(chunks) == 0 || chunks[len(chunks)-1].Offset-chunks[0].Start > MaxLead {
		return false
	}
	for _, c := range chunks {
		if c.Stream == Gap {
			return false
		}
	}
	return true
}

// Ended moves an exec whose exit status Append wrote from the running index to the ended one
// (Sweep's), in one round trip. The indexes live in other hash slots than the exec's keys, so
// they are not moved by Append's script. A failure here (or a follower that died before it)
// loses nothing: Orphans moves an ended exec it still finds in the running index.
func (s *Store) Ended(ctx context.Context, execID string) error {
	if !validID(execID) {
		return fmt.Errorf("execstream ended %q: %w", execID, ErrNotFound)
	}
	now := s.opts.Now()
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, endedKey, redis.Z{Score: float64(now.UnixMilli()), Member: execID})
		p.ZRem(ctx, runningKey, execID)
		return nil
	})
	if err != nil {
		return fmt.Errorf("execstream ended %s: %w", execID, err)
	}
	return nil
}

// appendScript appends chunks and an optional exit status, fenced by the follower lease and
// the stored guest offset.
// KEYS[1] meta hash, KEYS[2] output stream.
// ARGV[1] replica token, ARGV[2] now (unix ms), ARGV[3] MaxLen, ARGV[4] MaxBytes, ARGV[5] n =
// number of chunks, ARGV[6] 1 when an exit status follows the chunks, ARGV[7] exit code,
// ARGV[8] signal, ARGV[9] timed_out (0|1), ARGV[10] duration (ms), ARGV[11] error, ARGV[12]
// dropped (output bytes an older guest dropped at the end), ARGV[13] stdout_bytes, ARGV[14]
// stderr_bytes (what the command wrote, kept or not; 0 when unknown); then 4 values per chunk
// from ARGV[15]: stream (stdout|stderr|gap), start offset, end offset, data.
// Returns {status, offset, bytes}: 1 = written, offset is the new stored offset and bytes the
// output bytes appended in all (the meta hash's bytes); 0 = no such exec; -1 = ARGV[1] is not
// the follower or its lease_until <= now; -2 = the chunks do not start at the stored offset (or
// are not contiguous); -3 = the exec has ended. Nothing is written unless status is 1.
// Chunk entries get the id "<end offset>-0" and fields stream, start, data; a gap chunk only
// moves the offset on (no entry: readers see the hole as a truncated event). The exit entry
// gets "<stored offset>-1" and fields exit=1, code, signal, timed_out, duration_ms, error,
// dropped, stdout_bytes, stderr_bytes, start, and what the meta hash records of the end:
// ended_at (ARGV[2]) and bytes (its bytes after this batch), so that a subscriber's exit event
// needs no read of the hash. Then the stream is trimmed to MAXLEN ~ ARGV[3] and
// MINID ~ "<last end - ARGV[4] + 1>-0", which never drops the newest entry. On the exit the
// meta hash records state=ended, ended_at and the status, and the lease ends (lease_until 0).
var appendScript = redis.NewScript(`
local m = redis.call('HMGET', KEYS[1], 'state', 'follower', 'lease_until', 'offset', 'bytes')
if not m[1] then return {0, 0, 0} end
local off = m[4]
if m[1] ~= 'running' then return {-3, tonumber(off), 0} end
if m[2] ~= ARGV[1] or (tonumber(m[3]) or 0) <= tonumber(ARGV[2]) then return {-1, tonumber(off), 0} end
local n = tonumber(ARGV[5])
local expect = tonumber(off)
for i = 0, n - 1 do
  local j = 15 + 4 * i
  if tonumber(ARGV[j + 1]) ~= expect then return {-2, tonumber(off), 0} end
  expect = tonumber(ARGV[j + 2])
end
local bytes = 0
for i = 0, n - 1 do
  local j = 15 + 4 * i
  if ARGV[j] ~= 'gap' then
    redis.call('XADD', KEYS[2], ARGV[j + 2] .. '-0', 'stream', ARGV[j], 'start', ARGV[j + 1], 'data', ARGV[j + 3])
    bytes = bytes + string.len(ARGV[j + 3])
  end
  off = ARGV[j + 2]
end
if ARGV[6] == '1' then
  redis.call('XADD', KEYS[2], off .. '-1', 'exit', '1', 'code', ARGV[7], 'signal', ARGV[8],
    'timed_out', ARGV[9], 'duration_ms', ARGV[10], 'error', ARGV[11], 'dropped', ARGV[12],
    'stdout_bytes', ARGV[13], 'stderr_bytes', ARGV[14], 'start', off,
    'ended_at', ARGV[2], 'bytes', (tonumber(m[5]) or 0) + bytes)
end
local maxlen = tonumber(ARGV[3])
if maxlen > 0 then redis.call('XTRIM', KEYS[2], 'MAXLEN', '~', maxlen) end
local minid = tonumber(off) - tonumber(ARGV[4]) + 1
if tonumber(ARGV[4]) > 0 and minid > 0 then
  redis.call('XTRIM', KEYS[2], 'MINID', '~', string.format('%d-0', minid))
end
redis.call('HSET', KEYS[1], 'offset', off)
local total = redis.call('HINCRBY', KEYS[1], 'bytes', bytes)
if ARGV[6] == '1' then
  redis.call('HSET', KEYS[1], 'state', 'ended', 'ended_at', ARGV[2], 'lease_until', '0',
    'exit_code', ARGV[7], 'signal', ARGV[8], 'timed_out', ARGV[9], 'duration_ms', ARGV[10], 'error', ARGV[11],
    'dropped', ARGV[12], 'stdout_bytes', ARGV[13], 'stderr_bytes', ARGV[14])
end
return {1, tonumber(off), total}`)

// createGrace is how long a running-index member may lack its meta hash before Orphans drops
// it: Create adds the member just before it writes the hash.
const createGrace = time.Minute

// Orphans returns the running execs whose follower lease has lapsed (or that never had a
// follower): a reconciler calls TryFollow on each and copies on from the stored offset. It
// also repairs the indexes: an ended exec still listed as running moves to the ended index,
// and a member whose meta hash is gone (swept, flushed, or a Create that failed) is dropped.
func (s *Store) Orphans(ctx context.Context, now time.Time) ([]Meta, error) {
	members, err := s.rdb.ZRangeWithScores(ctx, runningKey, 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("execstream orphans: %w", err)
	}
	var out []Meta
	const batch = 256
	for len(members) > 0 {
		part := members[:min(batch, len(members))]
		members = members[len(part):]
		cmds := make([]*redis.MapStringStringCmd, len(part))
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, z := range part {
				cmds[i] = p.HGetAll(ctx, metaKey(z.Member.(string)))
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("execstream orphans: %w", err)
		}
		var stale []any
		var ended []Meta
		for i, z := range part {
			id := z.Member.(string)
			m, ok := parseMeta(id, cmds[i].Val())
			switch {
			case !ok:
				if time.UnixMilli(int64(z.Score)).Before(now.Add(-createGrace)) {
					stale = append(stale, id)
				}
			case m.State != Running:
				ended = append(ended, m)
			case !m.LeaseUntil.After(now):
				out = append(out, m)
			}
		}
		if len(stale) > 0 || len(ended) > 0 {
			_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, m := range ended {
					p.ZAdd(ctx, endedKey, redis.Z{Score: float64(ms(m.EndedAt)), Member: m.ID})
					stale = append(stale, m.ID)
				}
				p.ZRem(ctx, runningKey, stale...)
				return nil
			})
			if err != nil {
				return nil, fmt.Errorf("execstream orphans: repairing the index: %w", err)
			}
		}
	}
	return out, nil
}

// Sweep deletes the stream and status of every exec that ended at or before now-Retention,
// then of the oldest ended execs while the ended ones hold more than MaxEndedBytes together,
// and returns how many it deleted. Running execs are never swept (the domain appends an exit
// status, with Error, for an exec whose sandbox is gone).
func (s *Store) Sweep(ctx context.Context, now time.Time) (int, error) {
	cutoff := now.Add(-s.opts.Retention).UnixMilli()
	removed := 0
	const batch = 256
	for {
		ids, err := s.rdb.ZRangeByScore(ctx, endedKey, &redis.ZRangeBy{
			Min: "-inf", Max: fmt.Sprint(cutoff), Count: batch,
		}).Result()
		if err != nil {
			return removed, fmt.Errorf("execstream sweep: %w", err)
		}
		var drop []any
		for _, id := range ids {
			n, err := s.sweepOne(ctx, id, cutoff)
			if err != nil {
				return removed, fmt.Errorf("execstream sweep %s: %w", id, err)
			}
			if n == 1 {
				removed++
			}
			if n != -2 {
				drop = append(drop, id)
			}
		}
		if len(drop) > 0 {
			if err := s.rdb.ZRem(ctx, endedKey, drop...).Err(); err != nil {
				return removed, fmt.Errorf("execstream sweep: %w", err)
			}
		}
		if len(ids) < batch || len(drop) < len(ids) {
			break
		}
	}
	n, err := s.sweepOverBudget(ctx)
	return removed + n, err
}

// sweepOverBudget deletes the oldest ended execs while all ended execs' streams together hold
// more than MaxEndedBytes.
func (s *Store) sweepOverBudget(ctx context.Context) (int, error) {
	ids, err := s.rdb.ZRevRange(ctx, endedKey, 0, -1).Result() // newest first
	if err != nil {
		return 0, fmt.Errorf("execstream sweep: %w", err)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	offs := make([]*redis.StringCmd, len(ids))
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			offs[i] = p.HGet(ctx, metaKey(id), "offset")
		}
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		return 0, fmt.Errorf("execstream sweep: %w", err)
	}
	var total int64
	removed := 0
	var drop []any
	for i, id := range ids {
		size, _ := strconv.ParseInt(offs[i].Val(), 10, 64)
		total += min(size, s.opts.MaxBytes)
		if total <= s.opts.MaxEndedBytes {
			continue
		}
		n, err := s.sweepOne(ctx, id, math.MaxInt64)
		if err != nil {
			return removed, fmt.Errorf("execstream sweep %s: %w", id, err)
		}
		if n == 1 {
			removed++
		}
		if n != -1 {
			drop = append(drop, id)
		}
	}
	if len(drop) > 0 {
		if err := s.rdb.ZRem(ctx, endedKey, drop...).Err(); err != nil {
			return removed, fmt.Errorf("execstream sweep: %w", err)
		}
	}
	return removed, nil
}

// sweepOne runs sweepScript on one exec and, when it deleted the exec, takes it off its
// sandbox's index (a separate command: another hash slot).
func (s *Store) sweepOne(ctx context.Context, id string, cutoff int64) (int, error) {
	res, err := sweepScript.Run(ctx, s.rdb, []string{metaKey(id), outKey(id)}, cutoff).Slice()
	if err != nil || len(res) != 2 {
		return 0, fmt.Errorf("execstream sweep: %v %w", res, err)
	}
	n, _ := res[0].(int64)
	if sbx, _ := res[1].(string); n == 1 && sbx != "" {
		if err := s.rdb.ZRem(ctx, sandboxKey(sbx), id).Err(); err != nil {
			return int(n), err
		}
	}
	return int(n), nil
}

// sweepScript deletes one ended exec whose retention is over.
// KEYS[1] meta hash, KEYS[2] output stream. ARGV[1] cutoff (unix ms). Returns {status,
// sandbox}: status 1 when the exec ended at or before the cutoff and both keys were deleted
// (sandbox: the exec's sandbox id, for its index); 0 when the meta hash is missing (a leftover
// stream is deleted); -1 when the exec is still running (kept); -2 when it ended after the
// cutoff (kept); sandbox is "" but for 1.
var sweepScript = redis.NewScript(`
local m = redis.call('HMGET', KEYS[1], 'state', 'ended_at', 'sandbox')
if not m[1] then redis.call('DEL', KEYS[2]) return {0, ''} end
if m[1] ~= 'ended' then return {-1, ''} end
if (tonumber(m[2]) or 0) > tonumber(ARGV[1]) then return {-2, ''} end
redis.call('DEL', KEYS[1], KEYS[2])
return {1, m[3] or ''}`)
