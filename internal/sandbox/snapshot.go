package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/checkpoint"
	"sandboxd/runtime"
)

// Snapshots are the workspace checkpoints of internal/checkpoint as callers see them: the ones
// stop and destroy take, and the ones Snapshot takes of a running sandbox. A snapshot id names
// its sandbox (snap_<the sandbox's ULID>_<n>); it is looked up only under the caller's
// tenant:project, so another project's snapshot is NOT_FOUND. Snapshots outlive their sandbox:
// a destroyed sandbox's snapshots stay listed until they are deleted.

// sourceOf returns the snapshot the sandbox was created from ("" for none).
func sourceOf(rec runtime.Record) string { return rec.Annotations[annSourceSnapshot] }

// Snapshot checkpoints a running sandbox's workspace without stopping it. It holds the
// sandbox's operation lock meanwhile, so a stop, start or destroy waits (INVALID_STATE with
// Retry-After); commands keep running. The new snapshot becomes the sandbox's latest.
func (s *Service) Snapshot(ctx context.Context, p auth.Principal, id string) (SnapshotInfo, error) {
	start := s.now()
	if _, err := s.Load(ctx, p, id, VerbSnapshot); err != nil {
		return SnapshotInfo{}, err
	}
	lock, err := s.lock(ctx, id)
	if err != nil {
		return SnapshotInfo{}, err
	}
	defer lock.Unlock(ctx)
	ctx = runtime.WithFence(ctx, lock.Fence())
	// Load again under the lock: the state may have moved while we waited.
	rec, err := s.Load(ctx, p, id, VerbSnapshot)
	if err != nil {
		return SnapshotInfo{}, err
	}
	m, err := s.ckpts.save(ctx, rec)
	s.metrics.lifecycle(string(VerbSnapshot), outcome(err), s.now().Sub(start))
	if err != nil {
		return SnapshotInfo{}, err
	}
	return toSnapshotInfo(m), nil
}

// ListSnapshots returns the snapshots of one of the caller's sandboxes, or of the caller's
// whole project when sandboxID is "", newest first, at most limit (default 50, at most the
// page size limit). A destroyed sandbox's snapshots are listed as long as any is left.
func (s *Service) ListSnapshots(ctx context.Context, p auth.Principal, sandboxID string, limit int) ([]SnapshotInfo, error) {
	page, err := s.SnapshotPage(ctx, p, sandboxID, SnapshotListOptions{Limit: limit})
	return page.Snapshots, err
}

// GetSnapshot returns one snapshot of the caller's project.
func (s *Service) GetSnapshot(ctx context.Context, p auth.Principal, snapshotID string) (SnapshotInfo, error) {
	sc, err := snapshotScope(p.Tenant, p.Project, snapshotID)
	if err != nil {
		return SnapshotInfo{}, err
	}
	m, err := s.ckpts.store.Get(ctx, sc, snapshotID)
	if err != nil {
		return SnapshotInfo{}, snapshotError(err, snapshotID)
	}
	return toSnapshotInfo(m), nil
}

// DeleteSnapshot deletes one snapshot of the caller's project. The latest snapshot of a
// sandbox that is not RUNNING is refused with INVALID_STATE: it may be the only copy of the
// workspace (a stopped sandbox's always is). When a running sandbox's latest snapshot is
// deleted, the newest one left becomes its latest.
func (s *Service) DeleteSnapshot(ctx context.Context, p auth.Principal, snapshotID string) error {
	sc, err := snapshotScope(p.Tenant, p.Project, snapshotID)
	if err != nil {
		return err
	}
	if _, err := s.ckpts.store.Get(ctx, sc, snapshotID); err != nil && !errors.Is(err, checkpoint.ErrCorrupt) {
		return snapshotError(err, snapshotID) // a corrupt snapshot can be deleted
	}
	_, err = s.Load(ctx, p, sc.Sandbox, VerbGet)
	if apierror.Is(err, apierror.NotFound) {
		// The sandbox is gone; its snapshots are the caller's to delete.
		return s.ckpts.delete(ctx, sc, snapshotID)
	}
	if err != nil {
		return err
	}
	lock, err := s.lock(ctx, sc.Sandbox)
	if err != nil {
		return err
	}
	defer lock.Unlock(ctx)
	ctx = runtime.WithFence(ctx, lock.Fence())
	rec, err := s.Load(ctx, p, sc.Sandbox, VerbGet)
	if apierror.Is(err, apierror.NotFound) {
		return s.ckpts.delete(ctx, sc, snapshotID)
	}
	if err != nil {
		return err
	}
	if rec.LatestCheckpoint != snapshotID {
		return s.ckpts.delete(ctx, sc, snapshotID)
	}
	if st := State(rec.State); st != Running {
		return apierror.New(apierror.InvalidState,
			"cannot delete snapshot %s: it is the latest snapshot of sandbox %s, which is %s, so it may be the only copy of its workspace (start the sandbox first, or destroy it)",
			snapshotID, rec.ID, st).WithDetail("state", string(st))
	}
	if err := s.ckpts.delete(ctx, sc, snapshotID); err != nil {
		return err
	}
	// The running sandbox's workspace is live; its latest is now the newest one left.
	latest, err := s.ckpts.store.Latest(ctx, sc)
	if err != nil && !errors.Is(err, checkpoint.ErrNotFound) {
		s.log.Warn("finding the latest snapshot left failed", "sandbox", rec.ID, "err", err)
		return nil
	}
	if _, err := s.driver.UpdateRecord(context.WithoutCancel(ctx), rec.ID, func(r *runtime.Record) error {
		if r.LatestCheckpoint == snapshotID {
			r.LatestCheckpoint = latest.ID
		}
		return nil
	}); err != nil {
		s.log.Warn("recording the latest snapshot failed", "sandbox", rec.ID, "err", err)
	}
	return nil
}

// snapshotFits refuses (INVALID_ARGUMENT: the same request can never succeed, so it is no
// state conflict) a snapshot that holds more bytes than a disk of diskBytes. Its raw size (the
// tar stream) is a lower bound of what its files take on a disk, close enough to refuse on;
// diskBytes 0 is the runtime's default disk, not known here: not checked.
func snapshotFits(m checkpoint.Manifest, diskBytes int64) error {
	if diskBytes <= 0 || m.RawSize <= diskBytes {
		return nil
	}
	return apierror.New(apierror.InvalidArgument,
		"source snapshot %s holds %d bytes, more than the sandbox's disk (%s); use a profile with a larger disk",
		m.ID, m.RawSize, diskLabel(diskBytes)).
		WithDetail("field", "source.snapshot_id").WithDetail("source_bytes", m.RawSize).WithDetail("disk_mb", diskBytes>>20)
}

// diskLabel names a sandbox's disk in messages.
func diskLabel(diskBytes int64) string {
	if diskBytes <= 0 {
		return "the runtime's default disk"
	}
	return fmt.Sprintf("disk_mb %d", diskBytes>>20)
}

// snapshotScope is the checkpoint scope of snapshot id within tenant:project. A malformed id is
// NOT_FOUND, like a malformed sandbox id.
func snapshotScope(tenant, project, id string) (checkpoint.Scope, error) {
	sandboxID, _, err := checkpoint.ParseID(id)
	if err != nil {
		return checkpoint.Scope{}, snapshotNotFound(id)
	}
	return checkpoint.Scope{Tenant: tenant, Project: project, Sandbox: sandboxID}, nil
}

func snapshotNotFound(id string) error {
	return apierror.New(apierror.NotFound, "snapshot %s not found", apierror.Truncate(id, 64))
}

// snapshotError turns a checkpoint store error about snapshot id into a client error.
func snapshotError(err error, id string) error {
	switch {
	case errors.Is(err, checkpoint.ErrNotFound), errors.Is(err, checkpoint.ErrInvalidID), errors.Is(err, checkpoint.ErrInvalidScope):
		return snapshotNotFound(id)
	case errors.Is(err, checkpoint.ErrCorrupt):
		return apierror.Wrap(err, apierror.Unavailable, "snapshot %s is corrupt", id)
	}
	return storeError(err)
}

func storeError(err error) error {
	if errors.Is(err, checkpoint.ErrInvalidScope) {
		return apierror.Wrap(err, apierror.InvalidArgument, "this tenant or project cannot hold snapshots")
	}
	return apierror.Wrap(err, apierror.Unavailable, "the checkpoint store is unavailable").WithRetryAfter(time.Second)
}

func toSnapshotInfo(m checkpoint.Manifest) SnapshotInfo {
	return SnapshotInfo{ID: m.ID, SandboxID: m.Sandbox, CreatedAt: m.CreatedAt, SizeBytes: m.Size,
		RawSizeBytes: m.RawSize, SHA256: m.SHA256, Parent: m.Parent}
}
