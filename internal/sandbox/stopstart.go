package sandbox

import (
	"context"
	"errors"
	"io"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/checkpoint"
	"sandboxd/runtime"
)

// Stop checkpoints the workspace and releases the sandbox's compute and slot.
func (s *Service) Stop(ctx context.Context, p auth.Principal, id string) (Sandbox, error) {
	return s.stop(ctx, p, id, "")
}

func (s *Service) stop(ctx context.Context, p auth.Principal, id, why string) (Sandbox, error) {
	rec, err := s.transition(ctx, p, id, VerbStop, func(ctx context.Context, rec runtime.Record) (string, error) {
		reason, err := s.stopWork(ctx, rec)
		if reason == "" {
			reason = why
		}
		if err == nil {
			// The compute is gone: the slot goes back before STOPPED is recorded, so that
			// nobody who sees STOPPED still finds it counted (as destroy does).
			s.slots.release(ctx, rec.Tenant, rec.Project, id)
		}
		return reason, err
	})
	if err != nil {
		return Sandbox{}, err
	}
	return toSandbox(rec), nil
}

// stopWork checkpoints the workspace and stops the box. A paused sandbox's workspace was
// checkpointed by its pause: its memory image is discarded.
func (s *Service) stopWork(ctx context.Context, rec runtime.Record) (string, error) {
	if memoryKept(rec) && s.boxDead(ctx, rec.ID) {
		s.attachs.drop(rec.ID)
		if err := s.driver.Stop(ctx, rec.ID); err != nil {
			return "", runtimeError(s.log, rec.ID, err, "could not stop the sandbox's runtime")
		}
		if err := s.driver.DropMemoryImage(ctx, rec.ID); err != nil {
			s.log.Warn("dropping a stopped sandbox's memory image", "sandbox", rec.ID, "err", err)
		}
		s.forgetMemory(ctx, rec)
		return "", nil
	}
	if sr, ok := runtime.Capability[runtime.StoppedWorkspaceReader](s.driver); ok && sr.ReadsStoppedWorkspaces() {
		return s.stopThenCheckpoint(ctx, rec, sr)
	}
	reason := ""
	if _, err := s.ckpts.save(ctx, rec); err != nil {
		if !s.boxDead(ctx, rec.ID) {
			return "", err
		}
		// A dead box has no guest to stream from: its workspace is kept by the runtime and
		// the last checkpoint stays the latest.
		reason = "stopped without a new checkpoint: the sandbox's runtime had died"
	}
	s.attachs.drop(rec.ID)
	if err := s.driver.Stop(ctx, rec.ID); err != nil {
		return "", runtimeError(s.log, rec.ID, err, "could not stop the sandbox's runtime")
	}
	return reason, nil
}

// annCheckpointOwed says that the sandbox's runtime holds a newer workspace than its latest
// checkpoint and nothing is taking that checkpoint: set before a stop that checkpoints beside
// the stopped box (stopThenCheckpoint), cleared by the checkpoint it records. Left set (the
// read failed, or the replica died), the reconciler takes it in the background and a destroy
// takes it before the runtime goes.
const annCheckpointOwed = "checkpoint_owed"

// oweCheckpoint marks sandbox id's checkpoint owed (annCheckpointOwed) before its box stops
// for a checkpoint read beside it: a replica that dies between the stop and the recorded
// checkpoint leaves the mark, so that nothing (a destroy finished by the reconciler, say)
// removes the volume without that checkpoint. The checkpoint's record clears it.
func (s *Service) oweCheckpoint(ctx context.Context, id string) error {
	_, err := s.driver.UpdateRecord(ctx, id, func(r *runtime.Record) error {
		if r.Annotations == nil {
			r.Annotations = map[string]string{}
		}
		r.Annotations[annCheckpointOwed] = "true"
		return nil
	})
	if err != nil {
		return runtimeError(s.log, id, err, "could not record that the sandbox's checkpoint is owed")
	}
	return nil
}

// stopThenCheckpoint is stopWork for a runtime that reads a stopped box's workspace beside it
// (runtime.StoppedWorkspaceReader, the kube driver's reader pod): the box stops first, so the
// workspace no longer changes, and is checkpointed from its kept volume at the node's speed
// rather than through the box's own kernel and guest.
//
// The compute is released either way. When the checkpoint fails (the reader could not run or
// read), the workspace is still on the runtime's volume and start uses it: the stop succeeds
// and says so in its reason; the checkpoint stays owed (oweCheckpoint, marked before the
// stop), and a destroy takes it before removing the volume (or fails, keeping it).
func (s *Service) stopThenCheckpoint(ctx context.Context, rec runtime.Record, sr runtime.StoppedWorkspaceReader) (string, error) {
	_, stopped, err := s.stopAndRead(ctx, rec, sr)
	if err == nil {
		return "", nil
	}
	if !stopped || errors.Is(err, runtime.ErrFenced) {
		return "", err
	}
	s.log.Warn("a stopped sandbox's workspace could not be checkpointed; its runtime keeps it", "sandbox", rec.ID, "err", err)
	return "stopped without a new checkpoint (its workspace is kept on its volume): " + apierror.From(err).Message, nil
}

// stopAndRead marks the checkpoint owed, stops the box and checkpoints its workspace read
// beside it (runtime.StoppedWorkspaceReader's StopAndExport): stop and destroy share it.
// stopped reports that the box is stopped; err is then the checkpoint's.
func (s *Service) stopAndRead(ctx context.Context, rec runtime.Record, sr runtime.StoppedWorkspaceReader) (m checkpoint.Manifest, stopped bool, err error) {
	if err := s.oweCheckpoint(ctx, rec.ID); err != nil {
		return checkpoint.Manifest{}, false, err
	}
	s.attachs.drop(rec.ID)
	stream, err := sr.StopAndExport(ctx, rec.ID)
	if err != nil {
		return checkpoint.Manifest{}, false, runtimeError(s.log, rec.ID, err, "could not stop the sandbox's runtime")
	}
	m, err = s.ckpts.saveStopped(ctx, rec, func(context.Context, string) (io.ReadCloser, error) { return stream, nil })
	return m, true, err
}

// owedRetry is how long the reconciler waits after a failed try to take a stopped sandbox's
// owed checkpoint before it tries again.
const owedRetry = time.Minute

// payOwedCheckpoint takes, in the background, the checkpoint a stop could not take
// (annCheckpointOwed), so that the workspace is in the checkpoint store again and not on the
// runtime's volume alone. One try at a time per sandbox on a replica, then owedRetry after a
// failure; a sandbox whose lock is held (a start, a destroy) is left to that operation.
func (s *Service) payOwedCheckpoint(id string) {
	sr, ok := runtime.Capability[runtime.StoppedWorkspaceReader](s.driver)
	if !ok || !sr.ReadsStoppedWorkspaces() {
		return
	}
	if !s.owedPays.begin(id, s.now()) {
		return
	}
	s.chores.Add(1)
	go func() {
		defer s.chores.Done()
		defer s.owedPays.end(id)
		ctx, cancel := context.WithTimeout(s.bg, memoryStoreTimeout)
		defer cancel()
		err := s.payOwed(ctx, id, sr)
		if apierror.Is(err, apierror.InvalidState) {
			return // its lock is held: the next pass tries again
		}
		if err != nil {
			s.owedPays.fail(id, s.now())
			s.log.Warn("taking a stopped sandbox's owed checkpoint failed; the reconciler tries again",
				"sandbox", id, "retry_in", owedRetry, "err", err)
			return
		}
		s.owedPays.forget(id)
	}()
}

// payOwed is payOwedCheckpoint's try, under the sandbox's operation lock: a sandbox still
// STOPPED with its checkpoint owed is read beside its box, and its state reason cleared.
func (s *Service) payOwed(ctx context.Context, id string, sr runtime.StoppedWorkspaceReader) error {
	lock, err := s.lock(ctx, id)
	if err != nil {
		return err
	}
	defer lock.Unlock(ctx)
	ctx = runtime.WithFence(ctx, lock.Fence())
	s.cache.forget(id)
	b, err := s.driver.Get(ctx, id)
	if err != nil {
		return err
	}
	rec := b.Record
	if State(rec.State) != Stopped || rec.Annotations[annCheckpointOwed] == "" || b.Phase != runtime.PhaseStopped {
		return nil
	}
	m, err := s.ckpts.saveStopped(ctx, rec, sr.ExportStoppedWorkspace)
	if err != nil {
		return err
	}
	s.log.Info("took the checkpoint a stop could not", "sandbox", id, "snapshot", m.ID)
	_, err = s.setState(ctx, id, Stopped, Stopped, "")
	return err
}

// Start takes a concurrency slot, restores the workspace if the runtime lost it and starts the
// sandbox's compute.
func (s *Service) Start(ctx context.Context, p auth.Principal, id string) (Sandbox, error) {
	if _, err := s.Load(ctx, p, id, VerbStart); err != nil {
		return Sandbox{}, err
	}
	if err := s.slots.acquire(ctx, p.Tenant, p.Project, id); err != nil {
		return Sandbox{}, err
	}
	rec, err := s.transition(ctx, p, id, VerbStart, func(ctx context.Context, rec runtime.Record) (string, error) {
		return "", s.startWork(ctx, rec)
	})
	if err != nil {
		s.slots.releaseUnlessHolding(ctx, p.Tenant, p.Project, id)
		return Sandbox{}, err
	}
	return toSandbox(rec), nil
}

// startWork starts the box and restores its workspace when the runtime lost it.
func (s *Service) startWork(ctx context.Context, rec runtime.Record) error {
	s.attachs.drop(rec.ID)
	var fresh bool
	var err error
	if seeder, ok := s.driver.(runtime.WorkspaceSeeder); ok && rec.LatestCheckpoint != "" {
		// A lost workspace is extracted by the runtime before the box starts, at disk speed.
		fresh, err = seeder.StartSeeded(ctx, rec.ID, s.ckpts.seed(scopeOf(rec), rec.LatestCheckpoint))
		if serr := s.ckpts.seeded(ctx, scopeOf(rec), rec.LatestCheckpoint, err); serr != nil {
			return serr
		}
	} else {
		fresh, err = s.driver.Start(ctx, rec.ID)
	}
	if err != nil {
		return runtimeFailed(s.log, rec.ID, err, "could not start the sandbox's runtime")
	}
	if !fresh {
		return nil
	}
	if rec.LatestCheckpoint != "" {
		return s.ckpts.restore(ctx, rec.ID, scopeOf(rec), rec.LatestCheckpoint)
	}
	// Never checkpointed (its only stop found the box dead): the workspace it started from
	// is its source, fetched again for an archive or prefix.
	return s.boot.restore(ctx, rec)
}
