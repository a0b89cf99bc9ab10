package sandbox

import (
	"context"
	"errors"
	"io"

	"sandboxd/guest"
	"sandboxd/internal/apierror"
	"sandboxd/internal/checkpoint"
	"sandboxd/runtime"
)

// checkpoint streams the workspace from the guest into the checkpoint store, records it as
// the latest checkpoint and applies retention. The caller holds the sandbox's lock.
func (s *Service) checkpoint(ctx context.Context, rec runtime.Record) (checkpoint.Manifest, error) {
	start := s.now()
	tarStream, err := s.exportWorkspace(ctx, rec.ID)
	if err != nil {
		return checkpoint.Manifest{}, err
	}
	defer tarStream.Close()
	parent := rec.LatestCheckpoint
	if parent == "" {
		parent = sourceOf(rec)
	}
	m, err := s.ckpt.Save(ctx, scopeOf(rec), tarStream, parent)
	if err != nil {
		return checkpoint.Manifest{}, apierror.Wrap(err, apierror.Unavailable, "could not write the workspace checkpoint")
	}
	if _, err := s.driver.UpdateRecord(ctx, rec.ID, func(r *runtime.Record) error {
		r.LatestCheckpoint = m.ID
		return nil
	}); err != nil {
		return checkpoint.Manifest{}, s.runtimeError(rec.ID, err, "could not record the checkpoint")
	}
	s.metrics.lifecycle("checkpoint", "ok", s.now().Sub(start))
	s.log.Info("workspace checkpointed", "sandbox", rec.ID, "snapshot", m.ID, "bytes", m.Size, "ms", s.now().Sub(start).Milliseconds())
	s.retain(ctx, rec, m.ID)
	return m, nil
}

// exportWorkspace streams the workspace as tar: from the driver when it can read the
// workspace itself (runtime.WorkspaceExporter), else from the guest init.
func (s *Service) exportWorkspace(ctx context.Context, id string) (io.ReadCloser, error) {
	if ex, ok := s.driver.(runtime.WorkspaceExporter); ok {
		r, err := ex.ExportWorkspace(ctx, id)
		if err != nil {
			return nil, apierror.Wrap(err, apierror.Unavailable, "could not read the workspace for a checkpoint")
		}
		return r, nil
	}
	g, err := s.Guest(ctx, id)
	if err != nil {
		return nil, err
	}
	r, err := g.ExportWorkspace(ctx)
	if err != nil {
		return nil, apierror.Wrap(err, apierror.Unavailable, "could not read the workspace for a checkpoint")
	}
	return r, nil
}

// restore extracts checkpoint snapID of scope sc into the workspace of the running sandbox
// id, replacing what is there. The stream is hashed as it is read: a checkpoint whose hash
// does not match aborts the import before anything replaces the workspace.
func (s *Service) restore(ctx context.Context, id string, sc checkpoint.Scope, snapID string) error {
	start := s.now()
	r, _, err := s.ckpt.Open(ctx, sc, snapID)
	switch {
	case errors.Is(err, checkpoint.ErrCorrupt):
		return s.corruptCheckpoint(ctx, sc, snapID, err)
	case errors.Is(err, checkpoint.ErrNotFound):
		return apierror.Wrap(err, apierror.Unavailable, "could not open checkpoint %s: it no longer exists", snapID)
	case err != nil:
		return apierror.Wrap(err, apierror.Unavailable, "could not open checkpoint %s", snapID)
	}
	defer r.Close()
	g, err := s.Guest(ctx, id)
	if err != nil {
		return err
	}
	if _, err := g.ImportWorkspace(ctx, r, guest.ImportOptions{Replace: true, AllowExternalSymlinks: true}); err != nil {
		if errors.Is(err, checkpoint.ErrCorrupt) {
			return s.corruptCheckpoint(ctx, sc, snapID, err)
		}
		if guest.IsNoSpace(err) {
			return apierror.Wrap(err, apierror.PayloadTooLarge,
				"checkpoint %s does not fit the sandbox's disk: the disk filled up while it was restored", snapID).WithDetail("snapshot_id", snapID)
		}
		return apierror.Wrap(err, apierror.Unavailable, "could not restore checkpoint %s", snapID)
	}
	s.metrics.lifecycle("restore", "ok", s.now().Sub(start))
	s.log.Info("workspace restored", "sandbox", id, "snapshot", snapID, "ms", s.now().Sub(start).Milliseconds())
	return nil
}

// corruptCheckpoint is the error for a checkpoint whose data does not match its manifest: it
// names the newest earlier snapshot of the same sandbox that is intact (each candidate is read
// whole and hashed, newest first), so the caller can create a sandbox from it.
func (s *Service) corruptCheckpoint(ctx context.Context, sc checkpoint.Scope, snapID string, cause error) error {
	s.log.Error("corrupt checkpoint", "sandbox", sc.Sandbox, "snapshot", snapID, "err", cause)
	_, bad, _ := checkpoint.ParseID(snapID)
	good := ""
	if list, err := s.ckpt.List(ctx, sc); err == nil {
		for i := len(list) - 1; i >= 0 && good == ""; i-- {
			if m := list[i]; m.N < bad || bad == 0 && m.ID != snapID {
				if _, err := s.ckpt.Verify(ctx, sc, m.ID); err == nil {
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
