package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sandboxd/guest/proto"
)

// holdMemory is the python3 program of the loaded sandbox: it holds argv[1] MiB of random bytes
// (incompressible: the worst case for an image's compression) and sleeps.
const holdMemory = `import os, sys, time
held = bytearray(os.urandom(int(sys.argv[1]) << 20))
open("/tmp/held", "w").write(str(len(held)))
time.sleep(100000)
`

// benchPause: REST pause and REST resume of a sandbox, next to a bare `runsc checkpoint` and
// `runsc restore` of a container of the same bundle (the driver's OCI config of the same
// sandbox: rootfs, mounts, limits, the guest init as PID 1, with the same workload), for an idle
// sandbox and for one running python3 that holds 200 MiB; and the memory images' sizes.
func benchPause(ctx context.Context, b *bench) (groups []*Group, err error) {
	for _, load := range []struct {
		name string
		mib  int
	}{{"idle sandbox", 0}, {"python3 holding 200 MiB", 200}} {
		gs, err := b.pauseGroups(ctx, load.name, load.mib)
		groups = append(groups, gs...)
		if err != nil {
			return groups, err
		}
	}
	return groups, nil
}

func (b *bench) pauseGroups(ctx context.Context, name string, mib int) (groups []*Group, err error) {
	pause := &Group{Name: "pause, " + name}
	resume := &Group{Name: "resume, " + name}
	size := &Group{Name: "memory image, " + name}
	groups = []*Group{pause, resume, size}
	oursPause := pause.result("REST POST …/pause", false)
	oursPauseWritten := pause.result("REST POST …/pause, a file written in /workspace before it", false)
	barePause := pause.result("bare runsc checkpoint --image-path", true)
	oursStored := pause.result("REST POST …/pause, until its image is stored", false)
	oursResume := resume.result("REST POST …/resume", false)
	bareResume := resume.result("bare runsc restore --image-path --bundle --detach", true)
	storedSize := size.valueResult("ours: stored object (tar + zstd)", "MiB", false)
	rawSize := size.valueResult("ours: image (tar)", "MiB", false)
	bareSize := size.valueResult("bare: runsc's image folder", "MiB", true)

	id, _, err := b.createSandbox(ctx)
	defer b.finishSandbox(id, &err)
	if err != nil {
		return groups, fmt.Errorf("creating the sandbox: %w", err)
	}
	workload := []string{"sh", "-c", "echo idle"}
	if mib > 0 {
		workload = []string{"sh", "-c", fmt.Sprintf("(python3 -c '%s' %d) </dev/null >/dev/null 2>&1 &", holdMemory, mib)}
	}
	if res, err := b.api.exec(ctx, id, execBody(workload, "")); err != nil {
		return groups, fmt.Errorf("starting the workload: %w", err)
	} else if err := res.check(""); err != nil {
		return groups, fmt.Errorf("starting the workload: %w", err)
	}
	if mib > 0 {
		if err := b.waitHeld(ctx, id); err != nil {
			return groups, err
		}
	}
	steps := []step{
		{oursPause, func(ctx context.Context) (time.Duration, error) {
			return timed(func() error {
				_, err := b.api.lifecycle(ctx, id, "pause", "PAUSED")
				return err
			})
		}},
		{oursResume, func(ctx context.Context) (time.Duration, error) {
			var reason string
			d, err := timed(func() error {
				sb, err := b.api.lifecycle(ctx, id, "resume", "RUNNING")
				reason = sb.StateReason
				return err
			})
			if err == nil && reason != "" {
				err = fmt.Errorf("resume of %s: %s", id, reason)
			}
			return d, err
		}},
	}
	skip := b.bareSkipReason()
	var raw *rawBundle
	if skip != "" {
		barePause.Skipped, bareResume.Skipped, bareSize.Skipped = skip, skip, skip
	} else {
		if raw, err = b.newRawBundle(id); err != nil {
			return groups, err
		}
		// runsc cannot save a socket bound on a host folder: the bare box's init gets none
		// (sandboxd's init closes its own for the pause).
		if err := raw.dropHostSocket(); err != nil {
			return groups, err
		}
		bare, err := raw.startBare(ctx, mib)
		if err != nil {
			return groups, err
		}
		defer func() {
			if derr := b.deleteRaw(raw, bare.id); derr != nil && err == nil {
				err = derr
			}
		}()
		steps = append(steps,
			step{barePause, bare.checkpoint},
			step{bareResume, bare.restore})
	}
	// Each side pauses before it resumes; which side goes first alternates.
	order := func(round int) []int {
		if len(steps) == 2 {
			return []int{0, 1}
		}
		if round%2 == 0 {
			return []int{0, 1, 2, 3}
		}
		return []int{2, 3, 0, 1}
	}
	// The pause answers before its image is stored: the store is waited for (untimed for the
	// pause, and before the resume, which it would otherwise share the cores with) and timed
	// as a row of its own, from the pause's request.
	//
	// Half the pauses follow a write in /workspace (untimed), so that they take a new workspace
	// checkpoint; the others find the workspace unchanged since the pause before and keep its
	// checkpoint. Each kind is a row of its own. The kinds go in pairs of rounds (written
	// when k/2 is odd), so that each kind comes after ours and after the bare side alike: the
	// bare side's 200 MiB image is still being written back when a pause that follows it runs.
	var images [][2]int64
	var storedIn []time.Duration
	watchSize := step{oursPause, steps[0].run}
	pauses := 0
	steps[0].res = &Result{Label: "REST POST …/pause"} // the rows are added to below
	steps[0].run = func(ctx context.Context) (time.Duration, error) {
		k := pauses
		pauses++
		written := k/2%2 == 1
		if written {
			body := execBody([]string{"sh", "-c", fmt.Sprintf("echo %d > /workspace/pause-%d", k, k%4)}, "")
			if res, err := b.api.exec(ctx, id, body); err != nil {
				return 0, err
			} else if err := res.check(""); err != nil {
				return 0, err
			}
		}
		before := b.newestMemoryManifest(id)
		t0 := time.Now()
		d, err := watchSize.run(ctx)
		switch {
		case err != nil || k == 0: // the warm-up round's
		case written:
			oursPauseWritten.add(d)
		default:
			oursPause.add(d)
		}
		if err != nil || b.stateDir == "" {
			return d, err
		}
		m, err := b.waitMemoryManifest(ctx, id, before)
		if err != nil {
			return d, err
		}
		storedIn = append(storedIn, time.Since(t0))
		if stored, raw, ok := memoryImageSize(m); ok {
			images = append(images, [2]int64{stored, raw})
		}
		return d, nil
	}
	n := b.opts.stopStart + 2
	err = interleaveOrdered(ctx, pause.Name, 1, n, steps, order)
	if err == nil && mib == 0 {
		// A long-lived sandbox has run many commands: the idle pause again once it ran
		// historyExecs more, each remembered by its guest init.
		oursHistory := pause.result(fmt.Sprintf("REST POST …/pause, after %d more commands ran in it", historyExecs), false)
		rawHistory := size.valueResult(fmt.Sprintf("ours: image (tar), after %d more commands", historyExecs), "MiB", false)
		err = b.pauseAfterHistory(ctx, id, watchSize, steps[1], oursHistory, rawHistory, n)
	}
	for k, im := range images {
		if k == 0 {
			continue // the warm-up round's
		}
		storedSize.addValue(float64(im[0]) / (1 << 20))
		rawSize.addValue(float64(im[1]) / (1 << 20))
	}
	for k, d := range storedIn {
		if k > 0 {
			oursStored.add(d)
		}
	}
	if b.stateDir == "" {
		oursStored.Skipped = "needs the server's state folder (a server this command started)"
	}
	if raw != nil {
		for _, s := range raw.imageSizes {
			bareSize.addValue(float64(s) / (1 << 20))
		}
	}
	what := "an idle sandbox (its guest init, nothing else)"
	if mib > 0 {
		what = fmt.Sprintf("a sandbox whose python3 holds %d MiB of random bytes (incompressible)", mib)
	}
	pause.Note = what + ". Ours: the guest init closes its host socket, `runsc checkpoint` into the box's folder, the " +
		"workspace's version (its disk's mount and write count), a workspace checkpoint unless the workspace is " +
		"unchanged since the latest one (the row \"a file written in /workspace before it\": half the pauses, in pairs of " +
		"rounds, follow such a write, untimed, and take a new one; the others keep the one before), the record; the box's " +
		"container deleted after the answer; the slot, the answer. The image (tar) is then compressed (Go zstd level 1) with its CRC-32C sums into the local checkpoint " +
		"store (fsynced) after the answer: the row \"until its image is stored\" times that, from the pause's request to " +
		"the stored manifest (polled every 2 ms), and the benchmark waits for it before the resume. Bare: `runsc checkpoint " +
		"--image-path` of a container of the same OCI config (its init without a host socket) running the same workload, " +
		"then (untimed) `runsc delete`; after a bare restore its python3 (a `runsc exec` process, which a restore does not " +
		"bring back) is started again before the next checkpoint, untimed." +
		historyNote(mib)
	resume.Note = "ours: the slot; the runtime's kept copy of the image, its files checked against the CRC-32C sums taken " +
		"when it was stored (the stored copy is read only when they do not match); the disk mounted again, the reopen " +
		"marker, `runsc restore` of the box's bundle, the restored init finding the marker (it polls for it) and listening, " +
		"the first attach; the answer is RUNNING with no state_reason (the memory restored). Bare: `runsc restore " +
		"--image-path --bundle --detach` of the bare image."
	size.Note = "per pause: the stored object and the image's tar (memory/… in the checkpoint store); bare: the bytes of " +
		"runsc's image folder (checkpoint.img, pages_meta.img, pages.img)."
	return groups, err
}

// historyNote describes the rows after historyExecs commands (idle load only).
func historyNote(mib int) string {
	if mib > 0 {
		return ""
	}
	return fmt.Sprintf(" The row \"after %d more commands ran in it\": once the rounds above are done, %d execs of `true` "+
		"through REST, then rounds of a pause (timed), its stored image (untimed) and a resume (untimed), against the same bare row.",
		historyExecs, historyExecs)
}

// historyExecs is how many commands the sandbox runs before the pause rows "after … more
// commands".
const historyExecs = 300

// pauseAfterHistory runs historyExecs commands (`true`) in the sandbox, then n rounds of a
// timed pause (the rounds' own pause step; into res, the first a warm-up), the wait for its
// stored image (its tar's size into raw) and an untimed resume (the rounds' resume step).
func (b *bench) pauseAfterHistory(ctx context.Context, id string, pause, resume step, res, raw *Result, n int) error {
	progress("pause: running %d commands in %s", historyExecs, id)
	for i := range historyExecs {
		r, err := b.api.exec(ctx, id, execBody([]string{"true"}, ""))
		if err == nil {
			err = r.check("")
		}
		if err != nil {
			return fmt.Errorf("command %d of %d: %w", i+1, historyExecs, err)
		}
	}
	for k := range n {
		before := b.newestMemoryManifest(id)
		d, err := pause.run(ctx)
		if err != nil {
			return err
		}
		if k > 0 {
			res.add(d)
		}
		if b.stateDir != "" {
			m, err := b.waitMemoryManifest(ctx, id, before)
			if err != nil {
				return err
			}
			if _, rawSize, ok := memoryImageSize(m); ok && k > 0 {
				raw.addValue(float64(rawSize) / (1 << 20))
			}
		}
		if _, err := resume.run(ctx); err != nil {
			return err
		}
	}
	return nil
}

// waitHeld waits until the sandbox's python3 holds its memory (/tmp/held exists).
func (b *bench) waitHeld(ctx context.Context, id string) error {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		res, err := b.api.exec(ctx, id, execBody([]string{"test", "-e", "/tmp/held"}, ""))
		if err != nil {
			return err
		}
		if res.ExitCode == 0 {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("the python3 of %s did not hold its memory within 2 min", id)
}

// newestMemoryManifest is the path of the newest stored memory image manifest of a sandbox in
// the local checkpoint store under the state folder ("" for none): its manifests are
// <n>.json (beside them, the local store keeps hidden .<key>.meta.json files).
func (b *bench) newestMemoryManifest(id string) string {
	if b.stateDir == "" {
		return ""
	}
	matches, _ := filepath.Glob(filepath.Join(b.stateDir, "checkpoint-store", "memory", "*", "*", id, "[0-9]*.json"))
	if len(matches) == 0 {
		return ""
	}
	return matches[len(matches)-1] // numbered, zero-padded: the newest sorts last
}

// waitMemoryManifest waits until the sandbox has a stored memory image manifest newer than
// before and returns its path.
func (b *bench) waitMemoryManifest(ctx context.Context, id, before string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		if m := b.newestMemoryManifest(id); m > before {
			return m, nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("the memory image of %s was not stored within 2 min after its pause", id)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// memoryImageSize reads a stored memory image manifest: its object's size and its tar's.
func memoryImageSize(manifest string) (stored, raw int64, ok bool) {
	data, err := os.ReadFile(manifest)
	if err != nil {
		return 0, 0, false
	}
	var m struct {
		Size    int64 `json:"size"`
		RawSize int64 `json:"raw_size"`
	}
	if json.Unmarshal(data, &m) != nil {
		return 0, 0, false
	}
	return m.Size, m.RawSize, true
}

// dropHostSocket removes the host socket from the raw bundle's guest init (its environment):
// runsc cannot checkpoint a box whose process holds a socket bound on a host folder.
func (r *rawBundle) dropHostSocket() error {
	path := filepath.Join(r.bundle, "config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var spec map[string]any
	if err := json.Unmarshal(data, &spec); err != nil {
		return err
	}
	proc, _ := spec["process"].(map[string]any)
	env, _ := proc["env"].([]any)
	kept := env[:0]
	for _, e := range env {
		if s, ok := e.(string); ok && strings.HasPrefix(s, "SBX_HOST_SOCKET=") {
			continue
		}
		kept = append(kept, e)
	}
	proc["env"] = kept
	out, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o600)
}

// bareBox is one container of a raw bundle that the bare rows checkpoint and restore.
type bareBox struct {
	r     *rawBundle
	id    string
	image string
	// mib is what its python3 holds (0: none). A process `runsc exec` started does not come
	// back from a restore (it is a zombie then: only PID 1's tree goes on), so each checkpoint
	// after a restore starts a new one first (untimed).
	mib      int
	restored bool
}

// startBare creates and starts a container of the raw bundle (untimed) and starts the
// workload in it: nothing, or python3 holding mib MiB (a detached `runsc exec`).
func (r *rawBundle) startBare(ctx context.Context, mib int) (*bareBox, error) {
	box := &bareBox{r: r, id: "rawpause-" + randomHex(8), image: filepath.Join(filepath.Dir(r.bundle), "image"), mib: mib}
	r.b.mu.Lock()
	if r.b.raw[r] == nil {
		r.b.raw[r] = map[string]bool{}
	}
	r.b.raw[r][box.id] = true
	r.b.mu.Unlock()
	if r.keyFile != "" {
		if err := os.WriteFile(r.keyFile, []byte(proto.EncodeChannelKey(proto.NewChannelKey())), 0o400); err != nil {
			return box, err
		}
	}
	if err := r.b.runscLogged(ctx, r.logPath, r.flags, "create", "--bundle="+r.bundle, box.id); err != nil {
		return box, err
	}
	if err := r.b.runscLogged(ctx, r.logPath, r.flags, "start", box.id); err != nil {
		return box, err
	}
	return box, box.hold(ctx)
}

// hold starts the box's python3 and waits until it holds its memory (nothing for mib 0).
func (x *bareBox) hold(ctx context.Context) error {
	if x.mib == 0 {
		return nil
	}
	r := x.r
	if _, err := r.b.runscExec(ctx, r.flags, x.id, "rm", "-f", "/tmp/held"); err != nil {
		return err
	}
	if err := r.b.runscLogged(ctx, r.logPath, r.flags, "exec", "--detach", x.id, "python3", "-c", holdMemory, fmt.Sprint(x.mib)); err != nil {
		return err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, err := r.b.runscExec(ctx, r.flags, x.id, "test", "-e", "/tmp/held"); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the bare box's python3 did not hold its memory within 2 min")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkpoint is the timed bare pause: `runsc checkpoint --image-path` into a fresh folder;
// the container is deleted afterwards (untimed), and the image's size recorded.
func (x *bareBox) checkpoint(ctx context.Context) (time.Duration, error) {
	if x.restored {
		if err := x.hold(ctx); err != nil {
			return 0, err
		}
	}
	if err := os.RemoveAll(x.image); err != nil {
		return 0, err
	}
	if err := os.Mkdir(x.image, 0o700); err != nil {
		return 0, err
	}
	d, err := timed(func() error {
		return x.r.b.runscRun(ctx, x.r.flags, "checkpoint", "--image-path="+x.image, x.id)
	})
	if err != nil {
		return d, err
	}
	x.r.imageSizes = append(x.r.imageSizes, dirSize(x.image))
	return d, x.r.b.runscRun(ctx, x.r.flags, "delete", "-force", x.id)
}

// restore is the timed bare resume: `runsc restore` of the image into a container of the
// same id.
func (x *bareBox) restore(ctx context.Context) (time.Duration, error) {
	x.restored = true
	return timed(func() error {
		return x.r.b.runscLogged(ctx, x.r.logPath, x.r.flags, "restore", "--image-path="+x.image, "--bundle="+x.r.bundle, "--detach", x.id)
	})
}

// dirSize is the bytes of the regular files directly in dir.
func dirSize(dir string) int64 {
	entries, _ := os.ReadDir(dir)
	var n int64
	for _, e := range entries {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
	}
	return n
}
