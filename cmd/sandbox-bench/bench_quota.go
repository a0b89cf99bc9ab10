package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"sandboxd/internal/quota"
)

// redisServer is a redis-server this run started.
type redisServer struct {
	addr string
	cmd  *exec.Cmd
	done chan struct{}
}

// startRedis starts redis-server (bin) on a free loopback port without persistence, its log
// in dir, and waits until it answers PING.
func startRedis(ctx context.Context, bin, dir string) (*redisServer, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	_, port, _ := strings.Cut(addr, ":")
	logPath := filepath.Join(dir, "redis.log")
	cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", logPath)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	r := &redisServer{addr: addr, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(r.done)
	}()
	progress("started redis-server (pid %d) on %s", cmd.Process.Pid, addr)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := rdb.Ping(pctx).Err()
		cancel()
		if err == nil {
			return r, nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			r.stop()
			log, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("redis-server on %s did not answer: %v; log: %s", addr, err, strings.TrimSpace(string(log)))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop kills the redis-server by its pid and waits for it.
func (r *redisServer) stop() {
	_ = r.cmd.Process.Kill()
	<-r.done
	progress("stopped redis-server (pid %d)", r.cmd.Process.Pid)
}

// benchQuota: the quota package's Acquire + Release of one slot against a real redis-server,
// serial and with concurrent goroutines, next to a SET + DEL pair on the same client.
// sandboxd's own Redis is out of reach when it runs the embedded one, so the suite starts its
// own redis-server (skipped when there is none on PATH).
func benchQuota(ctx context.Context, b *bench) ([]*Group, error) {
	conc := max(b.opts.quotaConc, 1)
	serial := &Group{Name: "quota acquire + release, serial"}
	pgroup := &Group{Name: fmt.Sprintf("quota acquire + release, %d concurrent", conc)}
	groups := []*Group{serial, pgroup}
	sOurs, sBare := serial.result("quota.Acquire + Release", false), serial.result("bare SET + DEL", true)
	pOurs, pBare := pgroup.result("quota.Acquire + Release", false), pgroup.result("bare SET + DEL", true)
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		for _, r := range []*Result{sOurs, sBare, pOurs, pBare} {
			r.Skipped = "no redis-server on PATH"
		}
		serial.Note = "needs a redis-server on PATH (the started sandboxd's embedded Redis is not reachable from outside)"
		progress("quota: no redis-server on PATH: skipped")
		return groups, nil
	}
	dir, err := os.MkdirTemp(b.tmp, "redis-")
	if err != nil {
		return groups, err
	}
	rs, err := startRedis(ctx, bin, dir)
	if err != nil {
		return groups, err
	}
	defer rs.stop()
	version := "redis-server"
	if out, err := exec.Command(bin, "--version").Output(); err == nil {
		if f := strings.Fields(string(out)); len(f) >= 3 {
			version += " " + strings.TrimPrefix(f[2], "v=")
		}
	}

	noRuntime := func(context.Context, string, string) ([]string, error) { return nil, nil }
	opts := quota.Options{Limits: quota.Limits{Default: 1000}, Settle: -1}
	var seq atomic.Int64
	pair := func(q *quota.Quota) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			id := fmt.Sprintf("sbx_bench%016d", seq.Add(1))
			if _, err := q.Acquire(ctx, "bench", "quota", id); err != nil {
				return err
			}
			return q.Release(ctx, "bench", "quota", id)
		}
	}
	setDel := func(rdb *redis.Client) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			key := fmt.Sprintf("bench:{bench:quota}:k%d", seq.Add(1))
			if err := rdb.Set(ctx, key, "1", 0).Err(); err != nil {
				return err
			}
			return rdb.Del(ctx, key).Err()
		}
	}
	timedOp := func(op func(context.Context) error) func(context.Context) (time.Duration, error) {
		return func(ctx context.Context) (time.Duration, error) {
			return timed(func() error { return op(ctx) })
		}
	}

	// Serial: one connection (pool of one) for both paths.
	one := redis.NewClient(&redis.Options{Addr: rs.addr, PoolSize: 1})
	defer one.Close()
	q1 := quota.New(one, noRuntime, opts)
	if _, err := q1.Usage(ctx, "bench", "quota"); err != nil { // builds the project's set
		return groups, err
	}
	if err := interleave(ctx, serial.Name, 20, max(b.opts.quotaN, 1), []step{
		{sOurs, timedOp(pair(q1))},
		{sBare, timedOp(setDel(one))},
	}); err != nil {
		return groups, err
	}

	// Concurrent: a pool with a connection per goroutine.
	pool := redis.NewClient(&redis.Options{Addr: rs.addr, PoolSize: conc + 4})
	defer pool.Close()
	qn := quota.New(pool, noRuntime, opts)
	ours, bare := &rateStep{res: pOurs, op: pair(qn)}, &rateStep{res: pBare, op: setDel(pool)}
	ours.res.RateUnit, bare.res.RateUnit = "pairs/s", "pairs/s"
	if err := interleaveLoad(ctx, pgroup.Name, conc, 3, time.Second, 300*time.Millisecond, []*rateStep{ours, bare}); err != nil {
		return groups, err
	}
	if n, err := pool.ZCard(ctx, "quota:{bench:quota}:slots").Result(); err != nil || n != 0 {
		return groups, fmt.Errorf("quota: %d slots left held after every release (%v)", n, err)
	}
	serial.Note = fmt.Sprintf("internal/quota on a %s started by the benchmark (no persistence) on loopback: a pair is "+
		"`Acquire` (the acquire Lua script by EVALSHA: drop expired leases, count, ZADD) then `Release` (the release script: "+
		"ZREM) of a new sandbox id in one tenant:project, limit 1000 (never reached); bare: `SET` then `DEL` of a new key, "+
		"two round trips as well. Serial: one client with a pool of one connection for both paths, alternating pair by pair.", version)
	pgroup.Note = fmt.Sprintf("%d goroutines in a closed loop on one client (pool of %d connections), all in the same "+
		"tenant:project (one sorted set), 3 × 1 s per path alternating after a 0.3 s warm-up; throughput is pairs per second "+
		"(ratio ours/bare in parentheses); the benchmark's goroutines share the cores with redis-server.", conc, conc+4)
	return groups, nil
}
