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
	// The first group's floor, measured in its rounds (floorStep).
	var floor *Result
	perRound := floorPerRound(b.opts.execN)

	for _, c := range []struct {
		name string
		argv []string
		want string
	}{
		{"exec `true`", []string{"true"}, ""},
		{"exec `echo hi`", []string{"echo", "hi"}, "hi\n"},
		// How agents run their commands: a login shell's start is paid by every one of them.
		{"exec `bash -lc true`", []string{"bash", "-lc", "true"}, ""},
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
			{rest, func(ctx context.Context) (time.Duration, error) { return b.timedExec(ctx, id, restBody, c.want) }},
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
			floor = g.reference("floor: posix_spawn + waitpid of /bin/true inside the sandbox")
			steps = append(steps, b.floorStep(id, floorWait, floor, b.opts.warmup, perRound))
		}
		if err := interleave(ctx, g.Name, b.opts.warmup, b.opts.execN, steps); err != nil {
			return groups, err
		}
	}
	groups[0].Note = "one sandbox of the default profile; REST and GraphQL POST over a keep-alive HTTP connection; " +
		"WebSocket: one graphql-transport-ws connection kept open, the exec mutation sent as `subscribe`, timed until its `next`; " +
		"bare: `runsc <the driver's global flags> exec <sandbox id> …` on the same sandbox (no guest init in its path). " +
		"The paths alternate round by round, the first one rotating."
	idle, err := b.benchExecAfterIdle(ctx, id)
	if idle != nil {
		groups = append(groups, idle)
	}
	if err != nil {
		return groups, err
	}
	floorCPU, err := b.floorSpawnCPU(ctx, id)
	if err != nil {
		return groups, fmt.Errorf("the in-sandbox floor's CPU: %w", err)
	}
	groups[0].Note += " " + floorNote(groups[0], floor, perRound, "`os.posix_spawn(\"/bin/true\")` + `os.waitpid`") +
		" " + boxCPUNote(groups[0], boxCPU, floorCPU, b.boxCPUHow(id))
	if idle != nil {
		// The floor's spawns follow one another inside one process; so does this group's
		// back-to-back exec, while the first group's paths each follow other work.
		idle.Note += " Against the first group's floor (its spawns back to back): " + strings.TrimPrefix(aboveFloor(idle, floor), "Above the floor ")
	}
	return groups, nil
}

// execIdle is how long the idle path of benchExecAfterIdle waits before each exec: past the
// server's read cache (1 s) and its once-a-second activity write, and long enough for the box's
// threads to sleep. idleRounds bounds its rounds (each costs the wait).
const (
	execIdle   = 1500 * time.Millisecond
	idleRounds = 15
)

// benchExecAfterIdle is the pace of an agent that thinks between commands: a REST exec of
// `true` after the sandbox sat idle for execIdle, next to one right after another exec.
func (b *bench) benchExecAfterIdle(ctx context.Context, id string) (*Group, error) {
	g := &Group{Name: "exec `true` after an idle pause (an agent's pace)"}
	warm := g.result("REST POST …/exec, right after another exec", false)
	idle := g.result(fmt.Sprintf("REST POST …/exec, after %v idle", execIdle), false)
	body := execBody([]string{"true"}, "")
	run := func(ctx context.Context) (time.Duration, error) { return b.timedExec(ctx, id, body, "") }
	steps := []step{
		{warm, run},
		{idle, func(ctx context.Context) (time.Duration, error) {
			select {
			case <-time.After(execIdle):
			case <-ctx.Done():
				return 0, ctx.Err()
			}
			return run(ctx)
		}},
	}
	if err := interleave(ctx, g.Name, b.opts.warmup, min(b.opts.execN, idleRounds), steps); err != nil {
		return g, err
	}
	g.Note = fmt.Sprintf("the same sandbox and connection; the idle path waits %v, untimed, before each exec: "+
		"the server's read cache (1 s) and its activity clock (written at most once a second) have lapsed, and the box's threads sleep. "+
		"The back-to-back path runs right after another exec. Idle minus back to back (medians): %s.",
		execIdle, fmtDuration(summarize(idle.Samples).Median-summarize(warm.Samples).Median))
	return g, nil
}

// timedExec times one REST exec of body in sandbox id, then checks its answer (stdout want).
func (b *bench) timedExec(ctx context.Context, id string, body []byte, want string) (time.Duration, error) {
	var res execResult
	d, err := timed(func() (err error) {
		res, err = b.api.exec(ctx, id, body)
		return err
	})
	if err != nil {
		return d, err
	}
	return d, res.check(want)
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
func boxCPUNote(g *Group, meters map[*Result]*cpuMeter, floor time.Duration, how string) string {
	var parts []string
	for _, r := range g.Results {
		if m := meters[r]; m != nil && m.runs > 0 {
			parts = append(parts, fmt.Sprintf("%s %s", r.Label, fmtDuration(m.total.box/time.Duration(m.runs))))
		}
	}
	return fmt.Sprintf("CPU of the sandbox's processes per exec (%s, over every round, warm-ups included): %s; "+
		"per spawn of the floor %s (one exec of %d spawns after the rounds, untimed; python's own start, measured by an exec of "+
		"`python3 -c pass`, taken off).",
		how, strings.Join(parts, "; "), fmtDuration(floor), floorSpawns+floorWarm)
}

// floorScript times spawns of a tiny command inside the sandbox with python's posix_spawn, the
// way Go's os/exec starts a process. argv[1] is the mode: "wait", posix_spawn of /bin/true +
// waitpid (the floor of an exec); "first", posix_spawn of `/bin/echo x` with stdout on
// a pipe, timed to the first byte read from it (the floor of a first byte), then read to its
// end and waited for, untimed. argv[2] recorded spawns follow argv[3] unrecorded ones; it
// prints the recorded times (ns) as a JSON list. A spawn that does not exit 0, or an echo that
// writes anything but "x\n", fails the script.
const floorScript = `import json, os, sys, time
mode, n, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
out = []
for i in range(warm + n):
    if mode == "first":
        r, w = os.pipe()
        t0 = time.perf_counter_ns()
        pid = os.posix_spawn("/bin/echo", ["echo", "x"], os.environ, file_actions=[(os.POSIX_SPAWN_DUP2, w, 1)])
        os.close(w)
        data = os.read(r, 64)
        t1 = time.perf_counter_ns()
        while True:
            more = os.read(r, 64)
            if not more:
                break
            data += more
        os.close(r)
        _, status = os.waitpid(pid, 0)
        if data != b"x\n":
            sys.exit("echo wrote %r" % data)
    else:
        t0 = time.perf_counter_ns()
        pid = os.posix_spawn("/bin/true", ["true"], os.environ)
        _, status = os.waitpid(pid, 0)
        t1 = time.perf_counter_ns()
    if status != 0:
        sys.exit("the spawned command exited with status %d" % status)
    if i >= warm:
        out.append(t1 - t0)
print(json.dumps(out))
`

// Floor modes of floorScript.
const (
	floorWait  = "wait"
	floorFirst = "first"
)

// floorSpawns is how many spawns a floor row records at least (the floor is the median
// of 50); floorWarm is how many each of the script's runs makes first, unrecorded (python's
// first spawns fault in its spawn path).
const (
	floorSpawns = 50
	floorWarm   = 2
)

// floorPerRound is how many spawns each round's floor step records so that rounds of them
// record floorSpawns at least.
func floorPerRound(rounds int) int {
	r := max(rounds, 1)
	return max((floorSpawns+r-1)/r, 1)
}

// floorStep is a step of an interleaved loop that times, inside sandbox id, perRound spawns
// of floorScript's mode (after floorWarm unrecorded ones) by one REST exec of python3, and from
// its (warmup+1)-th run on records every one of them into floor. So the floor is measured in
// the same rounds as the paths set against it, not before or after them. The step's own
// result (the script's whole exec, python's start included) is no row of any group.
func (b *bench) floorStep(id, mode string, floor *Result, warmup, perRound int) step {
	runs := 0
	argv := floorArgv(mode, perRound)
	return step{res: &Result{Label: floor.Label + " (its script's exec)"}, run: func(ctx context.Context) (time.Duration, error) {
		runs++
		var out execResult
		d, err := timed(func() (err error) {
			out, err = b.api.exec(ctx, id, execBody(argv, ""))
			return err
		})
		if err != nil {
			return d, err
		}
		ns, err := floorTimings(out, perRound)
		if err != nil {
			return d, err
		}
		if runs > warmup {
			for _, v := range ns {
				floor.add(v)
			}
		}
		return d, nil
	}}
}

// floorArgv is the command that runs floorScript in mode, recording n spawns after floorWarm.
func floorArgv(mode string, n int) []string {
	return []string{"python3", "-c", floorScript, mode, fmt.Sprint(n), fmt.Sprint(floorWarm)}
}

// floorTimings checks one run of floorScript and decodes the n spawn times it printed.
func floorTimings(out execResult, n int) ([]time.Duration, error) {
	if err := out.check(""); err != nil {
		return nil, err
	}
	var ns []int64
	if err := json.Unmarshal([]byte(out.Stdout), &ns); err != nil {
		return nil, fmt.Errorf("decoding the floor script's timings %q: %w", out.Stdout, err)
	}
	if len(ns) != n {
		return nil, fmt.Errorf("the floor script printed %d timings, want %d", len(ns), n)
	}
	d := make([]time.Duration, len(ns))
	for i, v := range ns {
		if v <= 0 {
			return nil, fmt.Errorf("the floor script printed a timing of %d ns", v)
		}
		d[i] = time.Duration(v)
	}
	return d, nil
}

// floorSpawnCPU is the CPU the sandbox's processes spend per spawn of the floor (mode wait):
// one exec of floorScript with floorSpawns spawns after the rounds, less an exec of python3
// that spawns nothing, over every spawn it made. Its timings are not recorded: the floor row
// holds only the spawns timed in the rounds. (Where CPU is read in ticks of 10 ms, it takes
// many spawns in one exec to see one's cost.)
func (b *bench) floorSpawnCPU(ctx context.Context, id string) (time.Duration, error) {
	before := b.cpuSnapshot(id)
	if out, err := b.api.exec(ctx, id, execBody([]string{"python3", "-c", "pass"}, "")); err != nil {
		return 0, err
	} else if err := out.check(""); err != nil {
		return 0, err
	}
	mid := b.cpuSnapshot(id)
	out, err := b.api.exec(ctx, id, execBody(floorArgv(floorWait, floorSpawns), ""))
	if err != nil {
		return 0, err
	}
	after := b.cpuSnapshot(id)
	if _, err := floorTimings(out, floorSpawns); err != nil {
		return 0, err
	}
	spawns := after.box - mid.box - (mid.box - before.box)
	return max(spawns, 0) / time.Duration(floorSpawns+floorWarm), nil
}

// aboveFloor gives what each of the group's timed paths costs above the floor (difference of
// the medians).
func aboveFloor(g *Group, floor *Result) string {
	f := summarize(floor.Samples).Median
	var gaps []string
	for _, r := range g.Results {
		if r.Reference || len(r.Samples) == 0 { // the floor itself is a reference row
			continue
		}
		gaps = append(gaps, fmt.Sprintf("%s %s", r.Label, fmtDuration(summarize(r.Samples).Median-f)))
	}
	return "Above the floor (median − floor median): " + strings.Join(gaps, "; ") + "."
}

// floorNote says how a floor row was measured and what the group's paths cost above it.
func floorNote(g *Group, floor *Result, perRound int, what string) string {
	return fmt.Sprintf("Floor: in every round, like one more path, one REST exec of python3 in the same sandbox timing %d spawns of "+
		"%s with `time.perf_counter_ns` (after %d unrecorded ones), which is how Go's os/exec starts a process: what it "+
		"costs inside gVisor before any control plane, measured side by side with the paths (%d spawns recorded). %s",
		perRound, what, floorWarm, len(floor.Samples), aboveFloor(g, floor))
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
