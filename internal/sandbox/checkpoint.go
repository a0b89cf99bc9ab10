package sandbox

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"time"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
	"sandboxd/internal/apierror"
	"sandboxd/internal/checkpoint"
	"sandboxd/runtime"
)

// checkpoints write sandboxes' workspaces to the checkpoint store (internal/checkpoint) and
// restore them from it, and keep each sandbox's newest ones.
type checkpoints struct {
	store   *checkpoint.Store
	driver  runtime.Driver
	attachs *attachments
	metrics *Metrics
	log     *slog.Logger
	now     func() time.Time
	// keep is how many checkpoints of each sandbox are kept (Config.KeepCheckpoints).
	keep int
}

// save streams the workspace from the guest into the checkpoint store, records it as
// the latest checkpoint and applies retention. The caller holds the sandbox's lock.
func (c *checkpoints) save(ctx context.Context, rec runtime.Record) (checkpoint.Manifest, error) {
	return c.record(ctx, rec, c.export, c.store.Save)
}

// saveStopped is save for a stopped box whose workspace the driver reads beside it
// (runtime.StoppedWorkspaceReader): open is the reader's stream (its StopAndExport or
// ExportStoppedWorkspace), a compressed tar that is stored as it comes
// (checkpoint.Store.SaveCompressed), bounded like the guest's stream by the box's disk (the
// volume may hold more: a sparse file, a volume without a quota).
func (c *checkpoints) saveStopped(ctx context.Context, rec runtime.Record, open func(ctx context.Context, id string) (io.ReadCloser, error)) (checkpoint.Manifest, error) {
	return c.record(ctx, rec, func(ctx context.Context, rec runtime.Record) (io.ReadCloser, error) {
		r, err := open(ctx, rec.ID)
		if err != nil {
			return nil, apierror.Wrap(err, apierror.Unavailable, "could not read the stopped sandbox's workspace for a checkpoint")
		}
		return r, nil
	}, func(ctx context.Context, sc checkpoint.Scope, r io.Reader, parent string) (checkpoint.Manifest, error) {
		rr := &readFailure{r: r}
		m, err := c.store.SaveCompressed(ctx, sc, rr, parent, exportLimit(rec.Spec.DiskBytes))
		if err != nil && rr.err != nil {
			// The reader failed (it could not run, or its stream broke): say so, rather
			// than that the store could not write.
			return m, apierror.Wrap(err, apierror.Unavailable, "could not read the stopped sandbox's workspace for a checkpoint")
		}
		return m, err
	})
}

// readFailure remembers the first error other than io.EOF that its reader returned.
type readFailure struct {
	r   io.Reader
	err error
}

func (f *readFailure) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err != nil && err != io.EOF && f.err == nil {
		f.err = err
	}
	return n, err
}

// record captures the workspace from the stream open gives and records it as the latest
// checkpoint (one that a stop could not take is no longer owed: annCheckpointOwed).
func (c *checkpoints) record(ctx context.Context, rec runtime.Record, open exportFunc, store storeFunc) (checkpoint.Manifest, error) {
	m, err := c.captureFrom(ctx, rec, open, store)
	if err != nil {
		return checkpoint.Manifest{}, err
	}
	if _, err := c.driver.UpdateRecord(ctx, rec.ID, func(r *runtime.Record) error {
		r.LatestCheckpoint = m.ID
		delete(r.Annotations, annCheckpointOwed)
		return nil
	}); err != nil {
		return checkpoint.Manifest{}, runtimeError(c.log, rec.ID, err, "could not record the checkpoint")
	}
	c.retain(ctx, rec, m.ID)
	return m, nil
}

// capture is save without the record: the caller records m.ID as the record's
// LatestCheckpoint in a write of its own (a pause's final one), then calls retain. A checkpoint
// captured and never recorded (the replica died) is an older one for retention to delete.
func (c *checkpoints) capture(ctx context.Context, rec runtime.Record) (checkpoint.Manifest, error) {
	return c.captureFrom(ctx, rec, c.export, c.store.Save)
}

// exportFunc opens a box's workspace as a tar (for storeFunc).
type exportFunc func(ctx context.Context, rec runtime.Record) (io.ReadCloser, error)

// storeFunc stores a workspace's tar stream as a checkpoint (checkpoint.Store.Save, or its
// SaveCompressed for a stream compressed already).
type storeFunc func(ctx context.Context, sc checkpoint.Scope, r io.Reader, parent string) (checkpoint.Manifest, error)

// captureFrom is capture from the stream open gives, stored by store.
func (c *checkpoints) captureFrom(ctx context.Context, rec runtime.Record, open exportFunc, store storeFunc) (checkpoint.Manifest, error) {
	start := c.now()
	tarStream, err := open(ctx, rec)
	if err != nil {
		return checkpoint.Manifest{}, err
	}
	defer tarStream.Close()
	parent := rec.LatestCheckpoint
	if parent == "" {
		parent = sourceOf(rec)
	}
	m, err := store(ctx, scopeOf(rec), tarStream, parent)
	if ae := (*apierror.Error)(nil); errors.As(err, &ae) {
		return checkpoint.Manifest{}, err // the store function said what failed
	}
	if err != nil {
		return checkpoint.Manifest{}, apierror.Wrap(err, apierror.Unavailable, "could not write the workspace checkpoint")
	}
	c.metrics.lifecycle("checkpoint", "ok", c.now().Sub(start))
	c.log.Info("workspace checkpointed", "sandbox", rec.ID, "snapshot", m.ID, "bytes", m.Size, "ms", c.now().Sub(start).Milliseconds())
	return m, nil
}

// settled is what captureSettled leaves: the checkpoint that holds the workspace now, the
// runtime's version of the workspace it holds ("" for none) and whether it is the latest one
// kept rather than a new one.
type settled struct {
	checkpoint string
	version    string
	kept       bool
}

// captureSettled is capture for a box in which nothing runs (a paused one). When the runtime
// tells that the workspace has not changed since the latest checkpoint was captured this way
// (runtime.WorkspaceExporter's WorkspaceVersion, annWorkspaceVersion), that checkpoint holds
// the same bytes and stays the latest: nothing is read or written (for an idle sandbox's
// pause, most of its checkpoint's cost on the local store, a round trip or more on GCS).
func (c *checkpoints) captureSettled(ctx context.Context, rec runtime.Record) (settled, error) {
	ex, ok := c.driver.(runtime.WorkspaceExporter)
	if !ok {
		m, err := c.capture(ctx, rec)
		return settled{checkpoint: m.ID}, err
	}
	since := ""
	if ckpt, v, ok := strings.Cut(rec.Annotations[annWorkspaceVersion], " "); ok && ckpt != "" && ckpt == rec.LatestCheckpoint {
		since = v
	}
	v, unchanged, err := ex.WorkspaceVersion(ctx, rec.ID, since, false)
	if err != nil {
		c.log.Warn("reading the workspace's version; checkpointing it", "sandbox", rec.ID, "err", err)
	}
	if unchanged {
		// Only a checkpoint still there stands for a new one.
		_, err := c.store.Get(ctx, scopeOf(rec), rec.LatestCheckpoint)
		if err == nil {
			c.log.Info("workspace unchanged since its latest checkpoint", "sandbox", rec.ID, "snapshot", rec.LatestCheckpoint)
			return settled{checkpoint: rec.LatestCheckpoint, version: v, kept: true}, nil
		}
		c.log.Warn("the workspace is unchanged but its latest checkpoint cannot be read; checkpointing it",
			"sandbox", rec.ID, "snapshot", rec.LatestCheckpoint, "err", err)
	}
	// A new checkpoint. Beside it the host writes the workspace back, so that the version
	// recorded with it is the one of what it holds: one read with writes pending would be an
	// earlier one, and cost the next pause of an unchanged workspace a checkpoint.
	var out settled
	done := make(chan struct{})
	if v != "" {
		go func() {
			defer close(done)
			sv, _, err := ex.WorkspaceVersion(ctx, rec.ID, "", true)
			if err != nil {
				c.log.Warn("reading the workspace's version", "sandbox", rec.ID, "err", err)
			}
			out.version = sv
		}()
	} else {
		close(done)
	}
	m, err := c.capture(ctx, rec)
	<-done
	out.checkpoint = m.ID
	return out, err
}

// export streams the workspace as tar: from the driver when it can read the
// workspace itself (runtime.WorkspaceExporter), else from the guest init, whose stream is
// bounded by the box's disk (exportLimit): whatever answers in the box cannot make a
// checkpoint larger than its workspace could be.
func (c *checkpoints) export(ctx context.Context, rec runtime.Record) (io.ReadCloser, error) {
	id := rec.ID
	if ex, ok := c.driver.(runtime.WorkspaceExporter); ok {
		r, err := ex.ExportWorkspace(ctx, id)
		if err != nil {
			return nil, apierror.Wrap(err, apierror.Unavailable, "could not read the workspace for a checkpoint")
		}
		return r, nil
	}
	g, err := c.attachs.get(ctx, id)
	if err != nil {
		return nil, err
	}
	r, err := g.ExportWorkspace(ctx)
	if err != nil {
		return nil, apierror.Wrap(err, apierror.Unavailable, "could not read the workspace for a checkpoint")
	}
	return &boundedExport{ReadCloser: r, left: exportLimit(rec.Spec.DiskBytes) + 1}, nil
}

// exportLimit bounds a guest's workspace tar for a disk of diskBytes (0: 10 GiB, the largest
// driver default): the data, and as much again for tar's headers and padding (a disk's worth
// of inodes of empty files and folders stays far below it), plus 64 MiB.
func exportLimit(diskBytes int64) int64 {
	if diskBytes <= 0 {
		diskBytes = 10 << 30
	}
	return 2*diskBytes + 64<<20
}

// boundedExport fails a guest's export stream once it has given more than its limit: left
// starts at the limit plus one, and the read that takes it to zero fails.
type boundedExport struct {
	io.ReadCloser
	left int64
}

func (b *boundedExport) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, errExportTooLarge
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	if b.left <= 0 {
		return n, errExportTooLarge
	}
	return n, err
}

var errExportTooLarge = errors.New("the sandbox's workspace export is larger than its disk could hold: refused")

// restore extracts checkpoint snapID of scope sc into the workspace of the running sandbox
// id, replacing what is there. The stream is hashed as it is read: a checkpoint whose hash
// does not match aborts the import before anything replaces the workspace.
func (c *checkpoints) restore(ctx context.Context, id string, sc checkpoint.Scope, snapID string) error {
	start := c.now()
	r, _, err := c.store.Open(ctx, sc, snapID)
	switch {
	case errors.Is(err, checkpoint.ErrCorrupt):
		return c.corrupt(ctx, sc, snapID, err)
	case errors.Is(err, checkpoint.ErrNotFound):
		return apierror.Wrap(err, apierror.Unavailable, "could not open checkpoint %s: it no longer exists", snapID)
	case err != nil:
		return apierror.Wrap(err, apierror.Unavailable, "could not open checkpoint %s", snapID)
	}
	defer r.Close()
	g, err := c.attachs.get(ctx, id)
	if err != nil {
		return err
	}
	if _, err := g.ImportWorkspace(ctx, r, client.ImportOptions{Replace: true, AllowExternalSymlinks: true}); err != nil {
		return c.restoreError(ctx, sc, snapID, err)
	}
	c.metrics.lifecycle("restore", "ok", c.now().Sub(start))
	c.log.Info("workspace restored", "sandbox", id, "snapshot", snapID, "ms", c.now().Sub(start).Milliseconds())
	return nil
}

// restoreError is the error of a restore of checkpoint snapID that failed with err (through
// the guest, or on the host by a runtime.WorkspaceSeeder).
func (c *checkpoints) restoreError(ctx context.Context, sc checkpoint.Scope, snapID string, err error) error {
	switch {
	case errors.Is(err, checkpoint.ErrCorrupt):
		return c.corrupt(ctx, sc, snapID, err)
	case errors.Is(err, checkpoint.ErrNotFound):
		return apierror.Wrap(err, apierror.Unavailable, "could not open checkpoint %s: it no longer exists", snapID)
	case proto.IsNoSpace(err):
		return apierror.Wrap(err, apierror.PayloadTooLarge,
			"checkpoint %s does not fit the sandbox's disk: the disk filled up while it was restored", snapID).WithDetail("snapshot_id", snapID)
	}
	return apierror.Wrap(err, apierror.Unavailable, "could not restore checkpoint %s", snapID)
}

// seed opens checkpoint snapID for a runtime.WorkspaceSeeder, which extracts it on the host
// before the box starts; the reader checks the hash as restore's does.
func (c *checkpoints) seed(sc checkpoint.Scope, snapID string) runtime.Seed {
	return func(ctx context.Context) (io.ReadCloser, error) {
		r, _, err := c.store.Open(ctx, sc, snapID)
		if err != nil {
			return nil, err
		}
		// The runtime writes the files while the next ones are read and decompressed.
		return checkpoint.Prefetch(r), nil
	}
}

// seeded reports, for a seeded create or start that failed with err, the restore error of its
// seed, or nil when the failure was not the seed's.
func (c *checkpoints) seeded(ctx context.Context, sc checkpoint.Scope, snapID string, err error) error {
	var se *runtime.SeedError
	if !errors.As(err, &se) {
		return nil
	}
	return c.restoreError(ctx, sc, snapID, se.Err)
}

// corrupt is the error for a checkpoint whose data does not match its manifest: it
// names the newest earlier snapshot of the same sandbox that is intact (each candidate is read
// whole and hashed, newest first), so the caller can create a sandbox from it.
func (c *checkpoints) corrupt(ctx context.Context, sc checkpoint.Scope, snapID string, cause error) error {
	c.log.Error("corrupt checkpoint", "sandbox", sc.Sandbox, "snapshot", snapID, "err", cause)
	_, bad, _ := checkpoint.ParseID(snapID)
	good := ""
	if list, err := c.store.List(ctx, sc); err == nil {
		for i := len(list) - 1; i >= 0 && good == ""; i-- {
			if m := list[i]; m.N < bad || bad == 0 && m.ID != snapID {
				if _, err := c.store.Verify(ctx, sc, m.ID); err == nil {
					good = m.ID
				}
			}
		}
	}
	if good == "" {
		return apierror.Wrap(cause, apierror.CheckpointCorrupt,
			"checkpoint %s is corrupt (its data does not match its manifest) and no earlier snapshot of this sandbox is intact", snapID).
			WithDetail("snapshot_id", snapID)
	}
	return apierror.Wrap(cause, apierror.CheckpointCorrupt,
		"checkpoint %s is corrupt (its data does not match its manifest); the last good snapshot is %s: create a sandbox from it with source.snapshot_id", snapID, good).
		WithDetail("snapshot_id", snapID).WithDetail("last_good_snapshot_id", good)
}

// delete deletes one checkpoint.
func (c *checkpoints) delete(ctx context.Context, sc checkpoint.Scope, snapshotID string) error {
	if err := c.store.Delete(ctx, sc, snapshotID); err != nil {
		return snapshotError(err, snapshotID)
	}
	c.log.Info("snapshot deleted", "sandbox", sc.Sandbox, "snapshot", snapshotID)
	return nil
}

// retain deletes the sandbox's checkpoints beyond the configured number, never latest (the
// one just recorded). A failure only delays it to the next checkpoint.
func (c *checkpoints) retain(ctx context.Context, rec runtime.Record, latest string) {
	deleted, err := c.store.Retain(context.WithoutCancel(ctx), scopeOf(rec), c.keep, latest)
	if err != nil {
		c.log.Warn("deleting old snapshots failed", "sandbox", rec.ID, "err", err)
	}
	if len(deleted) > 0 {
		c.log.Info("old snapshots deleted", "sandbox", rec.ID, "count", len(deleted), "keep", c.keep)
	}
}
