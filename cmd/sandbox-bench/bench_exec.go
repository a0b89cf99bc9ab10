package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// bareSkipReason says why the bare rows cannot run ("" when they can).
func (b *bench) bareSkipReason() string {
	switch {
	case b.stateDir == "":
		return "no --state-dir"
	case b.runsc == "":
		return "no runsc"
	default:
		return ""
	}
}

// finishSandbox destroys a sandbox a suite made (untimed), joining the error to err.
func (b *bench) finishSandbox(id string, err *error) {
	if id == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if derr := b.destroySandbox(ctx, id); derr != nil {
		*err = errors.Join(*err, derr)
	}
}

// benchExec: the round trip of a tiny command through REST, GraphQL POST and GraphQL over a
// WebSocket kept open, next to a bare `runsc exec` on the same sandbox.
func benchExec(ctx context.Context, b *bench) (groups []*Group, err error) {
	id, _, err := b.createSandbox(ctx)
	defer b.finishSandbox(id, &err)
	if err != nil {
		return nil, fmt.Errorf("creating the sandbox: %w", err)
	}
	skip := b.bareSkipReason()
	var flags []string
	if skip == "" {
		if flags, err = b.containerFlags(id); err != nil {
			return nil, err
		}
	}
	ws, err := b.api.dialWS(ctx)
	if err != nil {
		return nil, err
	}
	defer ws.close()
	// The CPU of the sandbox's processes around each run of the first group's paths.
	boxCPU := map[*Result]*cpuMeter{}

	for _, c := range []struct {
		name string
		argv []string
		want string
	}{
		{"exec `true`", []string{"true"}, ""},
		{"exec `echo hi`", []string{"echo", "hi"}, "hi\n"},
	} {
		g := &Group{Name: c.name}
		groups = append(groups, g)
		rest := g.result("REST POST …/exec", false)
		gqlPost := g.result("GraphQL POST mutation", false)
		gqlWS := g.result("GraphQL WebSocket mutation", false)
		bare := g.result("bare runsc exec", true)
		restBody := execBody(c.argv, "")
		gqlBody := gqlExecRequest(id, c.argv)
		steps := []step{
			{rest, func(ctx context.Context) (time.Duration, error) {
				var res execResult
				d, err := timed(func() (err error) {
					res, err = b.api.exec(ctx, id, restBody)
					return err
				})
				if err != nil {
					return d, err
				}
				return d, res.check(c.want)
			}},
			{gqlPost, func(ctx context.Context) (time.Duration, error) {
				var res execResult
				d, err := timed(func() (err error) {
					res, err = b.api.gqlExec(ctx, gqlBody)
					return err
				})
				if err != nil {
					return d, err
				}
				return d, res.check(c.want)
			}},
			{gqlWS, func(ctx context.Context) (time.Duration, error) {
				var op string
				var payload json.RawMessage
				d, err := timed(func() (err error) {
					if op, err = ws.subscribe(ctx, gqlBody); err != nil {
						return err
					}
					payload, err = ws.answer(ctx, op)
					return err
				})
				if err != nil {
					return d, err
				}
				if err := ws.complete(ctx, op); err != nil {
					return d, err
				}
				res, err := execResultOf(payload)
				if err != nil {
					return d, err
				}
				return d, res.check(c.want)
			}},
		}
		if skip != "" {
			bare.Skipped = skip
		} else {
			steps = append(steps, step{bare, func(ctx context.Context) (time.Duration, error) {
				var out string
				d, err := timed(func() (err error) {
					out, err = b.runscExec(ctx, flags, id, c.argv...)
					return err
				})
				if err == nil && c.want != "" && out != c.want {
					err = fmt.Errorf("got stdout %q, want %q", out, c.want)
				}
				return d, err
			}})
		}
		if len(groups) == 1 {
			for i := range steps {
				steps[i] = b.meteredStep(id, steps[i], boxCPU)
			}
		}
		if err := interleave(ctx, g.Name, b.opts.warmup, b.opts.execN, steps); err != nil {
			return groups, err
		}
	}
	groups[0].Note = "one sandbox of the default profile; REST and GraphQL POST over a keep-alive HTTP connection; " +
		"WebSocket: one graphql-transport-ws connection kept open, the exec mutation sent as `subscribe`, timed until its `next`; " +
		"bare: `runsc <the driver's global flags> exec <sandbox id> …` on the same sandbox (no guest init in its path). " +
		"The paths alternate round by round, the first one rotating."
	floor := groups[0].reference("floor: posix_spawn + waitpid of /bin/true inside the sandbox")
	floorCPU, err := b.execFloor(ctx, id, floor)
	if err != nil {
		return groups, fmt.Errorf("the in-sandbox floor: %w", err)
	}
	groups[0].Note += " " + floorNote(groups[0], floor, max(b.opts.warmup, 1)) + " " + boxCPUNote(groups[0], boxCPU, floorCPU)
	return groups, nil
}

// meteredStep wraps s so that the CPU the sandbox's processes use during each of its runs
// (untimed snapshots around the timed call) is summed into meters[s.res].
func (b *bench) meteredStep(id string, s step, meters map[*Result]*cpuMeter) step {
	m := &cpuMeter{}
	meters[s.res] = m
	run := s.run
	s.run = func(ctx context.Context) (time.Duration, error) {
		before := b.cpuSnapshot(id)
		d, err := run(ctx)
		m.add(before, b.cpuSnapshot(id))
		return d, err
	}
	return s
}

// boxCPUNote gives the CPU the sandbox's processes (gVisor's kernel, its gofer and the
// processes' host stubs) used per exec of each path, next to what one spawn of the floor costs
// them: it follows the traps into gVisor an exec makes and the threads it wakes, which on a
// host where those are dear is most of an exec's time.
func boxCPUNote(g *Group, meters map[*Result]*cpuMeter, floor time.Duration) string {
	var parts []string
	for _, r := range g.Results {
		if m := meters[r]; m != nil && m.runs > 0 {
			parts = append(parts, fmt.Sprintf("%s %s", r.Label, fmtDuration(m.total.box/time.Duration(m.runs))))
		}
	}
	return fmt.Sprintf("CPU of the sandbox's processes per exec (/proc ticks of 10 ms, over every round, warm-ups included): %s; "+
		"per spawn of the floor %s (python's own start, measured by an exec of `python3 -c pass`, taken off).",
		strings.Join(parts, "; "), fmtDuration(floor))
}

// floorScript times posix_spawn + waitpid of /bin/true inside the sandbox, the way Go's os/exec
// starts a process: argv[1] recorded spawns after argv[2] unrecorded ones; prints the recorded
// times (ns) as a JSON list. A spawn that does not exit 0 fails the script.
const floorScript = `import json, os, sys, time
n, warm = int(sys.argv[1]), int(sys.argv[2])
out = []
for i in range(warm + n):
    t0 = time.perf_counter_ns()
    pid = os.posix_spawn("/bin/true", ["true"], os.environ)
    _, status = os.waitpid(pid, 0)
    t1 = time.perf_counter_ns()
    if status != 0:
        sys.exit("true exited with status %d" % status)
    if i >= warm:
        out.append(t1 - t0)
print(json.dumps(out))
`

// floorSpawns is how many spawns the floor row records at least (the floor is the
// median of 50).
const floorSpawns = 50

// execFloor runs floorScript in sandbox id by one REST exec (untimed from outside) and records
// each spawn it timed into res. It returns the CPU the sandbox's processes spent per spawn:
// that exec's, less an exec of python3 that spawns nothing, over every spawn.
func (b *bench) execFloor(ctx context.Context, id string, res *Result) (time.Duration, error) {
	n, warm := max(b.opts.execN, floorSpawns), max(b.opts.warmup, 1)
	before := b.cpuSnapshot(id)
	if out, err := b.api.exec(ctx, id, execBody([]string{"python3", "-c", "pass"}, "")); err != nil {
		return 0, err
	} else if err := out.check(""); err != nil {
		return 0, err
	}
	mid := b.cpuSnapshot(id)
	out, err := b.api.exec(ctx, id, execBody([]string{"python3", "-c", floorScript, fmt.Sprint(n), fmt.Sprint(warm)}, ""))
	if err != nil {
		return 0, err
	}
	after := b.cpuSnapshot(id)
	if err := out.check(""); err != nil {
		return 0, err
	}
	var ns []int64
	if err := json.Unmarshal([]byte(out.Stdout), &ns); err != nil {
		return 0, fmt.Errorf("decoding the script's timings %q: %w", out.Stdout, err)
	}
	if len(ns) != n {
		return 0, fmt.Errorf("got %d timings, want %d", len(ns), n)
	}
	for _, v := range ns {
		res.add(time.Duration(v))
	}
	spawns := after.box - mid.box - (mid.box - before.box)
	return max(spawns, 0) / time.Duration(n+warm), nil
}

// floorNote says how the floor row was measured and what each of the group's paths costs
// above it (difference of the medians).
func floorNote(g *Group, floor *Result, warm int) string {
	f := summarize(floor.Samples).Median
	var gaps []string
	for _, r := range g.Results {
		if r == floor || len(r.Samples) == 0 {
			continue
		}
		gaps = append(gaps, fmt.Sprintf("%s %s", r.Label, fmtDuration(summarize(r.Samples).Median-f)))
	}
	return fmt.Sprintf("Floor: one REST exec of python3 in the same sandbox, after the rounds, timing %d spawns of "+
		"`os.posix_spawn(\"/bin/true\")` + `os.waitpid` with `time.perf_counter_ns` (after %d unrecorded ones), which is how "+
		"Go's os/exec starts a process: what a command costs inside gVisor before any control plane. "+
		"Above the floor (median − floor median): %s.", len(floor.Samples), warm, strings.Join(gaps, "; "))
}

// benchCreate: REST create + REST exec `true` of a new sandbox each round (destroyed untimed),
// next to bare runsc create + start + exec `true` of the driver's own bundle (deleted untimed).
func benchCreate(ctx context.Context, b *bench) (groups []*Group, err error) {
	g := &Group{Name: "create → first exec `true`"}
	groups = []*Group{g}
	ours := g.result("REST create + REST exec", false)
	bare := g.result("bare runsc create + start + exec", true)
	var raw *rawBundle
	if skip := b.bareSkipReason(); skip != "" {
		bare.Skipped = skip
	} else {
		// A reference sandbox whose bundle and flags the bare rows copy.
		ref, _, err := b.createSandbox(ctx)
		if err == nil {
			raw, err = b.newRawBundle(ref)
		}
		b.finishSandbox(ref, &err)
		if err != nil {
			return groups, fmt.Errorf("preparing the bare bundle: %w", err)
		}
	}
	body := execBody([]string{"true"}, "")
	steps := []step{{ours, func(ctx context.Context) (time.Duration, error) {
		var id string
		d, err := timed(func() (err error) {
			if id, _, err = b.createSandbox(ctx); err != nil {
				return err
			}
			res, err := b.api.exec(ctx, id, body)
			if err != nil {
				return err
			}
			return res.check("")
		})
		b.finishSandbox(id, &err)
		return d, err
	}}}
	if raw != nil {
		steps = append(steps, step{bare, raw.createStartExec})
	}
	err = interleave(ctx, g.Name, min(b.opts.warmup, 1), b.opts.createN, steps)
	g.Note = "ours: a new sandbox each round (record, workspace, bundle, runsc create + start, guest init ready, " +
		"then the first exec's attach), destroyed outside the timed part; bare: the OCI config.json the driver wrote " +
		"for a reference sandbox (same rootfs, mounts, limits, the guest init as PID 1) with its own empty workspace " +
		"and no cgroupsPath, in its own --root with the driver's other global flags, `runsc create` + `start` + " +
		"`exec <id> true`, `delete -force` outside the timed part."
	return groups, err
}
