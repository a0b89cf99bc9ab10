package sandbox

import (
	"context"
	"errors"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/runtime"
)

// Destroy checkpoints the workspace (when the sandbox runs), removes the runtime and answers
// with the final snapshot id.
func (s *Service) Destroy(ctx context.Context, p auth.Principal, id string) (DestroyResult, error) {
	return s.destroy(ctx, p, id, Destroyed, "")
}

// destroy is Destroy; final is the state the last event reports (DESTROYED, or EXPIRED when the
// TTL ended it).
func (s *Service) destroy(ctx context.Context, p auth.Principal, id string, final State, why string) (DestroyResult, error) {
	var snapshot string
	rec, err := s.transition(ctx, p, id, VerbDestroy, func(ctx context.Context, rec runtime.Record) (string, error) {
		var err error
		snapshot, err = s.destroyWork(ctx, rec, final, why)
		return "", err
	})
	if err != nil {
		return DestroyResult{}, err
	}
	rec.LatestCheckpoint = snapshot
	rec.State = string(final)
	rec.StateReason = why
	return DestroyResult{Sandbox: toSandbox(rec), SnapshotID: snapshot}, nil
}

// destroyWork takes the final checkpoint, removes the box, the lookup and the slot, and
// publishes the final event. It returns the final snapshot id.
func (s *Service) destroyWork(ctx context.Context, rec runtime.Record, final State, why string) (string, error) {
	id := rec.ID
	snapshot := rec.LatestCheckpoint
	box, err := s.driver.Get(ctx, id)
	_, exporter := s.driver.(runtime.WorkspaceExporter)
	sr, reads := runtime.Capability[runtime.StoppedWorkspaceReader](s.driver)
	reads = reads && sr.ReadsStoppedWorkspaces()
	// A running box is checkpointed; so is a failed one whose workspace the driver can
	// still read. A stopped box's latest checkpoint was taken when it stopped.
	if err == nil && box.Phase == runtime.PhaseRunning && reads {
		// Stopped first and read beside it, as a stop does (stopThenCheckpoint). A read that
		// fails leaves the sandbox STOPPED, its checkpoint owed, and the destroy refused.
		m, stopped, err := s.stopAndRead(ctx, rec, sr)
		if err != nil {
			if !stopped || errors.Is(err, runtime.ErrFenced) {
				return "", err
			}
			s.slots.release(ctx, rec.Tenant, rec.Project, id)
			return "", &leftAt{err: err, state: Stopped,
				reason: "stopped, not destroyed: its final checkpoint could not be taken (its workspace is kept on its volume): " + apierror.From(err).Message}
		}
		snapshot = m.ID
	} else if err == nil && (box.Phase == runtime.PhaseRunning || (exporter && box.Phase == runtime.PhaseFailed)) {
		m, err := s.ckpts.save(ctx, rec)
		if err != nil && !s.boxDead(ctx, id) {
			return "", err
		}
		if err == nil {
			snapshot = m.ID
		}
	}
	// A stopped box whose stop did not checkpoint it (stopThenCheckpoint: the read failed, or
	// its replica died before it was recorded): its volume is read now, and a destroy that
	// cannot read it fails, keeping the volume.
	if reads && err == nil && box.Phase == runtime.PhaseStopped && rec.Annotations[annCheckpointOwed] != "" {
		m, err := s.ckpts.saveStopped(ctx, rec, sr.ExportStoppedWorkspace)
		if err != nil {
			return "", err
		}
		snapshot = m.ID
	}
	s.attachs.drop(id)
	if err := s.driver.Delete(ctx, id); err != nil {
		return "", runtimeError(s.log, id, err, "could not remove the sandbox's runtime")
	}
	// A paused sandbox's memory goes with it (its workspace snapshots stay).
	if memoryKept(rec) {
		s.forgetStores(rec)
		s.mem.discard(ctx, rec, "")
	}
	if err := s.store.Delete(ctx, entryOf(rec)); err != nil {
		s.log.Warn("removing the lookup failed; the next read cleans it", "sandbox", id, "err", err)
	}
	_ = s.store.ForgetActivity(ctx, id)
	s.slots.release(ctx, rec.Tenant, rec.Project, id)
	rec.State, rec.StateReason = string(final), why
	s.publish(ctx, rec, Destroying)
	return snapshot, nil
}

// boxDead reports whether the box's compute is gone (so no checkpoint can be taken).
func (s *Service) boxDead(ctx context.Context, id string) bool {
	box, err := s.driver.Get(ctx, id)
	return err == nil && box.Phase != runtime.PhaseRunning
}
