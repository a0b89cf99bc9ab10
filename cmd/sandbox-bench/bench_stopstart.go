package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"sandboxd/internal/benchws"
)

// genWorkspace writes the benchmark's workspace (benchws.Script).
const genWorkspace = benchws.Script

// countWorkspace prints "<regular files> <bytes>" of everything under /workspace (what
// `find /workspace -type f` lists).
const countWorkspace = `import os, stat
n = size = 0
for root, dirs, files in os.walk("/workspace"):
    for f in files:
        st = os.lstat(os.path.join(root, f))
        if stat.S_ISREG(st.st_mode):
            n += 1
            size += st.st_size
print(n, size)
`

func fmtMB(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }

// wsCount is what countWorkspace found.
type wsCount struct{ files, bytes int64 }

// workspaceCount counts the regular files and bytes of a sandbox's /workspace (python3 in the
// sandbox).
func (b *bench) workspaceCount(ctx context.Context, id string) (wsCount, error) {
	res, err := b.api.exec(ctx, id, execBody([]string{"python3", "-c", countWorkspace}, ""))
	if err == nil {
		err = res.check("")
	}
	if err != nil {
		return wsCount{}, fmt.Errorf("counting the workspace of %s: %w", id, err)
	}
	var c wsCount
	if _, err := fmt.Sscan(res.Stdout, &c.files, &c.bytes); err != nil {
		return wsCount{}, fmt.Errorf("counting the workspace of %s: got %q: %w", id, res.Stdout, err)
	}
	return c, nil
}

// benchStopStart: REST stop and REST start of a sandbox with a generated workspace, next to a
// bare tar | zstd -1 -T0 of its host folder and a bare zstd -d | tar -x of that archive; then
// REST create from the last stop's snapshot (a real restore) next to a plain create and the
// same bare extraction.
func benchStopStart(ctx context.Context, b *bench) (groups []*Group, err error) {
	mb := b.opts.workspaceMB
	stop := &Group{Name: fmt.Sprintf("stop, %d MB workspace", mb)}
	start := &Group{Name: fmt.Sprintf("start, %d MB workspace", mb)}
	restore := &Group{Name: fmt.Sprintf("restore, %d MB workspace", mb)}
	groups = []*Group{stop, start, restore}
	oursStop := stop.result("REST POST …/stop", false)
	bareTar := stop.result("bare tar -cf - | zstd -1 -T0 > file", true)
	oursStart := start.result("REST POST …/start", false)
	bareUntar := start.result("bare zstd -d < file | tar -x", true)
	oursRestore := restore.result("REST create from the snapshot", false)
	emptyCreate := restore.reference("REST create (empty)")
	bareRestore := restore.result("bare zstd -d < file | tar -x", true)

	id, _, err := b.createSandbox(ctx)
	defer b.finishSandbox(id, &err)
	if err != nil {
		return groups, fmt.Errorf("creating the sandbox: %w", err)
	}
	progress("generating the workspace: %d files, %d MB (python3 in the sandbox)", b.opts.workspaceFiles, mb)
	var res execResult
	gen, err := timed(func() (err error) {
		argv := []string{"python3", "-c", genWorkspace, strconv.Itoa(mb * 1_000_000), strconv.Itoa(b.opts.workspaceFiles)}
		res, err = b.api.exec(ctx, id, execBody(argv, ""))
		return err
	})
	if err == nil {
		err = res.check("")
	}
	if err != nil {
		return groups, fmt.Errorf("generating the workspace: %w", err)
	}
	var files, size int64
	if _, err := fmt.Sscan(res.Stdout, &files, &size); err != nil {
		return groups, fmt.Errorf("generating the workspace: got %q: %w", res.Stdout, err)
	}
	progress("workspace: %d files, %s in %s", files, fmtMB(size), fmtDuration(gen))
	// What every restore must bring back: the source's whole /workspace.
	want, err := b.workspaceCount(ctx, id)
	if err != nil {
		return groups, err
	}
	if want.files != files || want.bytes != size {
		return groups, fmt.Errorf("the generated workspace has %d files, %d bytes, want %d files, %d bytes", want.files, want.bytes, files, size)
	}
	// Runs before the destroy (defers run last first): an empty workspace keeps the destroy's
	// final checkpoint, which nobody measures, short.
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		body := execBody([]string{"rm", "-rf", "/workspace/bench-data"}, "")
		_, err := b.api.exec(ctx, id, body)
		var ae *apiError
		if errors.As(err, &ae) && ae.Status == http.StatusServiceUnavailable {
			// Once more after the Retry-After: the first request after a long idle spell
			// following a start has been seen to find the attach broken (logged here).
			progress("emptying the workspace before the destroy: %v; retrying", err)
			time.Sleep(max(ae.RetryAfter, time.Second))
			_, err = b.api.exec(ctx, id, body)
		}
		if err != nil {
			progress("emptying the workspace before the destroy: %v", err)
		}
	}()

	// snap is the latest snapshot after the last stop: its checkpoint of the workspace.
	var snap string
	steps := []step{
		{oursStop, func(ctx context.Context) (time.Duration, error) {
			return timed(func() error {
				sb, err := b.api.lifecycle(ctx, id, "stop", "STOPPED")
				snap = sb.LatestSnapshotID
				return err
			})
		}},
		{oursStart, func(ctx context.Context) (time.Duration, error) {
			return timed(func() error {
				_, err := b.api.lifecycle(ctx, id, "start", "RUNNING")
				return err
			})
		}},
	}
	archive := filepath.Join(b.tmp, "workspace.tar.zst")
	extract := filepath.Join(b.tmp, "extract")
	// untar extracts the archive into a fresh folder, timing the extraction only.
	untar := func(ctx context.Context) (time.Duration, error) {
		if err := os.RemoveAll(extract); err != nil {
			return 0, err
		}
		if err := os.Mkdir(extract, 0o755); err != nil {
			return 0, err
		}
		return timed(func() error { return zstdUntar(ctx, archive, extract) })
	}
	skip := b.bareSkipReason()
	if skip != "" {
		bareTar.Skipped, bareUntar.Skipped, bareRestore.Skipped = skip, skip, skip
	} else {
		// The box's own ext4 disk is mounted at disk/, the workspace its workspace/ folder.
		// It is unmounted while the sandbox is stopped: the bare rows read a copy of it, made
		// once here, on the file system the benchmark's temporary files are on.
		box := b.boxPath(id, filepath.Join("disk", "workspace"))
		if _, err := os.Stat(box); err != nil {
			return groups, fmt.Errorf("the workspace host folder: %w", err)
		}
		ws := filepath.Join(b.tmp, "workspace-copy")
		if out, err := exec.CommandContext(ctx, "cp", "-a", box, ws).CombinedOutput(); err != nil {
			return groups, fmt.Errorf("copying the workspace for the bare rows: %v: %s", err, out)
		}
		steps = append(steps,
			step{bareTar, func(ctx context.Context) (time.Duration, error) {
				if err := os.Remove(archive); err != nil && !os.IsNotExist(err) {
					return 0, err
				}
				return timed(func() error { return tarZstd(ctx, ws, archive) })
			}},
			step{bareUntar, untar})
	}
	// Stop before start; the bare compression before its extraction; which side goes first
	// alternates round by round.
	order := func(round int) []int {
		if len(steps) == 2 {
			return []int{0, 1}
		}
		if round%2 == 0 {
			return []int{0, 2, 1, 3}
		}
		return []int{2, 0, 3, 1}
	}
	err = interleaveOrdered(ctx, "stop/start", 0, b.opts.stopStart, steps, order)
	if err == nil && snap == "" {
		err = fmt.Errorf("the stopped sandbox %s has no latest_snapshot_id", id)
	}
	if err == nil {
		// A sandbox from the snapshot, a plain one, and the bare extraction, each round.
		rsteps := []step{
			{oursRestore, b.createStep(snap, want)},
			{emptyCreate, b.createStep("", wsCount{})},
		}
		if skip == "" {
			rsteps = append(rsteps, step{bareRestore, untar})
		}
		err = interleave(ctx, "restore", 0, b.opts.stopStart, rsteps)
	}
	os.RemoveAll(extract)

	note := fmt.Sprintf("workspace: %d files, %s (every third file random bytes, the rest text), made by python3 in the sandbox in %s",
		files, fmtMB(size), fmtDuration(gen))
	if fi, err := os.Stat(archive); err == nil {
		note += fmt.Sprintf("; bare tar.zst %s", fmtMB(fi.Size()))
	}
	if ck := latestCheckpoint(b.stateDir, id); ck > 0 {
		note += fmt.Sprintf(", checkpoint object %s", fmtMB(ck))
	}
	stop.Note = note + ". Ours: the guest init tars the workspace, sandboxd compresses it (Go zstd level 1) into the " +
		"local checkpoint store (fsynced; the bare pipeline does not fsync), then `runsc delete -force`."
	start.Note = "ours: runsc create + start and the guest init ready. The local driver keeps the workspace folder on " +
		"the host, so a start restores nothing (a restore runs only when the folder is gone): the bare extraction " +
		"is what a restore's data work would cost, not a like-for-like counterpart (the restore group is)."
	restore.Note = restoreNote(oursRestore, emptyCreate, bareRestore, want)
	return groups, err
}

// createStep is a round of REST create (from snapshot snapID, or empty when ""), timed until
// the answer (RUNNING). Outside the timed part the new sandbox's /workspace is counted and
// must hold want, then it is emptied and destroyed, so the project's concurrency limit is
// never near and the destroy's final checkpoint stays small.
func (b *bench) createStep(snapID string, want wsCount) func(ctx context.Context) (time.Duration, error) {
	return func(ctx context.Context) (_ time.Duration, err error) {
		id, d, err := b.createSandboxFrom(ctx, snapID)
		defer b.finishSandbox(id, &err)
		if err != nil {
			return 0, err
		}
		got, err := b.workspaceCount(ctx, id)
		if err != nil {
			return 0, err
		}
		if got != want {
			return 0, fmt.Errorf("sandbox %s created from %q has %d files, %d bytes in /workspace, want %d files, %d bytes",
				id, snapID, got.files, got.bytes, want.files, want.bytes)
		}
		if want.files > 0 {
			res, err := b.api.exec(ctx, id, execBody([]string{"rm", "-rf", "/workspace/bench-data"}, ""))
			if err == nil {
				err = res.check("")
			}
			if err != nil {
				return 0, fmt.Errorf("emptying the workspace of %s: %w", id, err)
			}
		}
		return d, nil
	}
}

// restoreNote describes the restore group, with the restore's own cost: ours less the plain
// create measured in the same rounds.
func restoreNote(ours, empty, bare *Result, want wsCount) string {
	note := fmt.Sprintf("ours: REST create of the %s profile with `source.snapshot_id` = the latest_snapshot_id the last "+
		"stop above answered (its checkpoint object), timed until the answer (RUNNING): record, slot, the box's disk, "+
		"then the local runtime reads the object from the local checkpoint store, checks its hash and decompresses it "+
		"(Go zstd) while it extracts the tar on the host into a staging folder of the new disk and moves it into place, "+
		"before runsc create + start and the guest init ready (a runtime that cannot extract on the host streams the tar "+
		"to the running box's guest init instead). So ours includes a box create: the reference row is a plain create "+
		"of the same profile in the same rounds", benchProfile)
	o, e, bs := summarize(ours.Samples), summarize(empty.Samples), summarize(bare.Samples)
	if e.N > 0 {
		note += fmt.Sprintf(" (median %s)", fmtDuration(e.Median))
		if o.N > 0 {
			note += fmt.Sprintf("; the restore's own cost is about the difference of the medians, %s", fmtDuration(o.Median-e.Median))
			if bs.N > 0 && bs.Median > 0 {
				note += fmt.Sprintf(" (%.2f× the bare extraction)", float64(o.Median-e.Median)/float64(bs.Median))
			}
		}
	}
	note += fmt.Sprintf(". The paths alternate round by round (first one rotating), no warm-up, after the stop/start "+
		"rounds. After each create, untimed, the benchmark counts the sandbox's /workspace (python3 in the sandbox: the "+
		"regular files `find /workspace -type f` lists, and their bytes): a restored one must hold the source's %d files, "+
		"%s, an empty one none, or the run fails; each is then emptied and destroyed outside the timed part. Bare: the "+
		"start row's extraction of the bare tar.zst into a fresh folder.", want.files, fmtMB(want.bytes))
	return note
}

// latestCheckpoint is the size of the largest checkpoint object of a sandbox in the local
// checkpoint store under the state folder (0 when none is found there).
func latestCheckpoint(stateDir, id string) int64 {
	if stateDir == "" {
		return 0
	}
	matches, _ := filepath.Glob(filepath.Join(stateDir, "checkpoint-store", "checkpoints", "*", "*", id, "*.tar.zst"))
	var best int64
	for _, m := range matches {
		if fi, err := os.Stat(m); err == nil && fi.Size() > best {
			best = fi.Size()
		}
	}
	return best
}

// pipeline runs two commands with the first one's stdout as the second one's stdin.
func pipeline(a, b *exec.Cmd) error {
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	var aErr, bErr bytes.Buffer
	a.Stdout, a.Stderr = pw, &aErr
	b.Stdin, b.Stderr = pr, &bErr
	if err := a.Start(); err != nil {
		pr.Close()
		pw.Close()
		return err
	}
	pw.Close()
	err = b.Start()
	pr.Close()
	if err != nil {
		_ = a.Process.Kill()
		_ = a.Wait()
		return err
	}
	errA, errB := a.Wait(), b.Wait()
	if errA != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(a.Args, " "), errA, bytes.TrimSpace(aErr.Bytes()))
	}
	if errB != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(b.Args, " "), errB, bytes.TrimSpace(bErr.Bytes()))
	}
	return nil
}

// tarZstd is `tar -C src -cf - . | zstd -1 -T0 > dst`.
func tarZstd(ctx context.Context, src, dst string) error {
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	z := exec.CommandContext(ctx, "zstd", "-1", "-T0", "-q", "-c")
	z.Stdout = out
	err = pipeline(exec.CommandContext(ctx, "tar", "-C", src, "-cf", "-", "."), z)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// zstdUntar is `zstd -d < src | tar -x -C dst`.
func zstdUntar(ctx context.Context, src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	z := exec.CommandContext(ctx, "zstd", "-d", "-q", "-c")
	z.Stdin = in
	return pipeline(z, exec.CommandContext(ctx, "tar", "-x", "-C", dst))
}
