package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// benchVs: an exec of `true` (or --vs-command) through REST on this run's server and on a
// second server of another build or rootfs (--vs-sandboxd, --vs-init-binary, --vs-rootfs), one
// sandbox each, in alternating rounds of --exec-n execs (the side that goes first alternates
// too). A change worth a fraction of a millisecond shows in how many rounds one build was
// faster and in the median of the rounds' differences, where two runs of the exec suite one
// after the other cannot show it: on a noisy host their medians move by more than that. With
// --vs-first-byte each exec goes through REST SSE and is timed to its first stdout bytes (the
// stream suite's first-byte row, side by side). Only with --only vs.
func benchVs(ctx context.Context, b *bench) (groups []*Group, err error) {
	o := b.opts
	if b.server == nil {
		return nil, errors.New("the vs suite starts its own second server: it does not run with --url")
	}
	if o.vsSandboxd == "" && o.vsInit == "" && o.vsRootfs == "" {
		return nil, errors.New("the vs suite needs --vs-sandboxd, --vs-init-binary or --vs-rootfs (the build or rootfs to compare with)")
	}
	argv := strings.Fields(o.vsCommand)
	if len(argv) == 0 {
		return nil, errors.New("--vs-command is empty")
	}
	if o.vsIdle < 0 || o.vsIdle > time.Minute {
		return nil, fmt.Errorf("--vs-idle must be between 0 and 1m, got %v", o.vsIdle)
	}
	if o.vsRounds < 1 || o.execN < 1 {
		return nil, fmt.Errorf("the vs suite needs --vs-rounds and --exec-n of at least 1 (got %d and %d)", o.vsRounds, o.execN)
	}
	vo := *o
	if o.vsSandboxd != "" {
		vo.sandboxd = o.vsSandboxd
	}
	if o.vsInit != "" {
		vo.initBin = o.vsInit
	}
	if o.vsRootfs != "" {
		if fi, err := os.Stat(filepath.Join(o.vsRootfs, "bin")); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("--vs-rootfs %s has no bin folder: not a rootfs (scripts/ensure-rootfs.sh)", o.vsRootfs)
		}
		vo.rootfs = o.vsRootfs
	}
	for _, c := range []struct{ what, path string }{{"--vs-sandboxd", vo.sandboxd}, {"--vs-init-binary", vo.initBin}} {
		if err := checkFile(c.what, c.path, "scripts/build.sh"); err != nil {
			return nil, err
		}
	}
	// The server starts commands through the spawner program beside its init when there is
	// one: a side without it is slower by that alone (2.1 ms per exec of true on a 2-core host,
	// an A/A run showed), not by its build.
	if this, other := hasSpawner(o.initBin), hasSpawner(vo.initBin); this != other {
		return nil, fmt.Errorf("only one side has the spawner program beside its init (%s: %v, %s: %v): copy %s beside the other's init, so that the builds are compared, not the spawner",
			o.initBin, this, vo.initBin, other, spawnerName)
	}
	dir := filepath.Join(b.tmp, "vs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	vs, err := startServer(ctx, &vo, dir)
	if vs != nil {
		defer func() { err = errors.Join(err, b.stopVs(vs)) }()
	}
	if err != nil {
		return nil, fmt.Errorf("starting the --vs server: %w", err)
	}

	type side struct {
		label  string
		api    *client
		id     string
		res    *Result
		rounds []time.Duration // each round's median
		cpu    cpuMeter        // around each recorded round
	}
	pace := ""
	if o.vsIdle > 0 {
		pace = fmt.Sprintf(", each after %v idle", o.vsIdle)
	}
	what := "exec of `%s` through REST"
	if o.vsFirstByte {
		what = "first stdout bytes of `%s` through REST SSE"
	}
	g := &Group{Name: fmt.Sprintf(what+", this build against another (%d alternating rounds of %d%s)", o.vsCommand, o.vsRounds, o.execN, pace)}
	this := &side{label: "this build", api: b.api}
	other := &side{label: "the --vs build", api: newClient(vs.url, vs.key)}
	this.res = g.result(this.label, false)
	other.res = g.result(other.label, true)
	sides := []*side{this, other}
	for _, s := range sides {
		sb, err := s.api.create(ctx, "")
		if s == this {
			b.track(sb.ID)
		}
		if err != nil {
			return nil, fmt.Errorf("creating the sandbox on %s: %w", s.label, err)
		}
		s.id = sb.ID
	}
	defer b.finishSandbox(this.id, &err)
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if derr := other.api.destroy(dctx, other.id); derr != nil {
			err = errors.Join(err, fmt.Errorf("destroying the --vs server's sandbox: %w", derr))
		}
	}()

	body := execBody(argv, "")
	round := func(s *side, n int, record bool) error {
		var ds []time.Duration
		before := b.cpuSnapshot(s.id)
		for range n {
			if record && o.vsIdle > 0 {
				select {
				case <-time.After(o.vsIdle):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			d, err := vsExec(ctx, s.api, s.id, body, o.vsFirstByte)
			if err != nil {
				return fmt.Errorf("%s: exec: %w", s.label, err)
			}
			ds = append(ds, d)
		}
		if !record {
			return nil
		}
		s.cpu.add(before, b.cpuSnapshot(s.id))
		for _, d := range ds {
			s.res.add(d)
		}
		slices.Sort(ds)
		s.rounds = append(s.rounds, median(ds))
		return nil
	}
	for range max(o.warmup, 1) {
		for _, s := range sides {
			if err := round(s, 5, false); err != nil {
				return nil, err
			}
		}
	}
	for i := range o.vsRounds {
		order := sides
		if i%2 == 1 {
			order = []*side{other, this}
		}
		for _, s := range order {
			if err := round(s, o.execN, true); err != nil {
				return []*Group{g}, err
			}
		}
	}
	perExec := func(s *side) time.Duration { return s.cpu.total.box / time.Duration(s.cpu.runs*o.execN) }
	g.Note = vsNote(this.rounds, other.rounds, perExec(this), perExec(other), b.boxCPUHow(this.id))
	return []*Group{g}, nil
}

// vsExec runs one exec of the vs suite and returns its time: a waited REST exec to its answer,
// or with firstByte a REST SSE exec to its first stdout bytes (read to its exit event).
func vsExec(ctx context.Context, api *client, id string, body []byte, firstByte bool) (time.Duration, error) {
	if !firstByte {
		t0 := time.Now()
		r, err := api.exec(ctx, id, body)
		d := time.Since(t0)
		if err == nil {
			err = r.check("")
		}
		return d, err
	}
	r, err := api.sseExec(ctx, id, body)
	switch {
	case err != nil:
		return 0, err
	case !r.exited:
		return 0, errors.New("the event stream ended without an exit event")
	case r.stdoutBytes == 0:
		return 0, errors.New("the command wrote nothing to stdout: --vs-first-byte times the first stdout bytes")
	}
	return r.first, r.exit.check("")
}

// vsNote sums up the rounds of the vs suite: in how many this build's median was lower, the
// median of the rounds' differences (this minus the other), and the CPU of each sandbox's
// processes per exec.
func vsNote(this, other []time.Duration, thisCPU, otherCPU time.Duration, how string) string {
	n := min(len(this), len(other))
	faster := 0
	diffs := make([]time.Duration, 0, n)
	for i := range n {
		if this[i] < other[i] {
			faster++
		}
		diffs = append(diffs, this[i]-other[i])
	}
	slices.Sort(diffs)
	md := "none"
	if n > 0 {
		md = fmt.Sprintf("%+.2f ms", float64(median(diffs))/float64(time.Millisecond))
	}
	return fmt.Sprintf("This build was faster in %d of %d rounds; the median of the rounds' differences (this build's median minus the other's) is %s. "+
		"CPU of the sandbox's processes per exec (%s): this build %s, the --vs build %s.",
		faster, n, md, how, fmtDuration(thisCPU), fmtDuration(otherCPU))
}

// stopVs stops the vs suite's server and deletes what it left in its runsc root.
func (b *bench) stopVs(vs *server) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []error
	for _, msg := range b.stopServer(ctx, vs) {
		errs = append(errs, errors.New("the --vs server: "+msg))
	}
	return errors.Join(errs...)
}

// spawnerName is the spawner program's file name, which sandboxd looks for beside the init.
const spawnerName = "sandbox-spawn"

// hasSpawner reports whether the init binary at initBin has the spawner program beside it.
func hasSpawner(initBin string) bool {
	fi, err := os.Stat(filepath.Join(filepath.Dir(initBin), spawnerName))
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}
