package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"sandboxd/guest/proto"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/checkpoint"
	"sandboxd/runtime"
)

// Pause and resume. A pause keeps what a stop loses: the sandbox's memory and processes, as
// the runtime's image of them (runsc checkpoint on the local runtime), stored compressed and
// sha256-checked in the checkpoint store beside the workspace checkpoints (memories, under the
// MemoryPrefix), together with a workspace checkpoint (the fallback, and the sandbox's latest
// snapshot). A PAUSED sandbox holds no compute and no concurrency slot. A resume takes a slot
// (QUOTA_EXCEEDED with Retry-After when the project is full, as a start) and restores the image:
// processes, open files, /tmp and running commands go on where they were. When the image cannot
// bring them back (it is gone, corrupt, made on another host or by another runsc build, or the
// runtime refuses it), the resume starts the sandbox on its workspace instead, RUNNING with
// state_reason "memory not restored: …": never a broken sandbox. A store that does not answer
// is no such case: the resume fails with UNAVAILABLE and the sandbox stays PAUSED.
//
// A pause answers once the runtime keeps the image (runsc's files on the host's disk) and the
// box is released; the image goes to the store after the answer (storeMemory), since its upload
// is most of a large sandbox's pause. Until it is stored the record names the kept image
// (annMemoryPending, the pause's time) and a resume restores from the runtime's copy; a store
// that fails leaves it so, and the reconciler stores it again. The record carries the stored
// image's id (annMemoryImage) from the moment it is stored until a resume, stop or destroy is
// done with it; whatever image of the sandbox is not recorded is deleted by the next of them,
// and a store that ends after the sandbox moved on deletes what it stored.

// MemoryPrefix is where the memory images live in the checkpoint store (beside "checkpoints").
const MemoryPrefix = "memory"

// Record annotations of pause and resume.
const (
	// annMemoryImage is the id of the paused sandbox's stored memory image.
	annMemoryImage = "memory_image"
	// annMemoryPending is set while the runtime keeps a paused sandbox's image and it is not
	// stored yet: the time of the pause that made it, which the store checks before recording.
	annMemoryPending = "memory_pending"
	// annWorkspaceVersion pairs the latest checkpoint a pause took with the runtime's version of
	// the workspace it holds ("<checkpoint> <version>", runtime.WorkspaceExporter): a later
	// pause that finds the same version keeps that checkpoint. Any other checkpoint recorded as
	// the latest (a stop's, a snapshot's, a deletion's) unpairs it.
	annWorkspaceVersion = "workspace_version"
	// annAutostopAction is "pause" when idle auto-stop pauses the sandbox instead of stopping it.
	annAutostopAction = "autostop_action"
	// annAutoResume is "true" when exec and file calls on the PAUSED sandbox resume it first.
	annAutoResume = "auto_resume"
)

// Values of CreateRequest.AutostopAction.
const (
	AutostopStop  = "stop"
	AutostopPause = "pause"
)

// KeepsProcesses reports whether a sandbox in this state still has the processes it had when
// it last ran, to be brought back by a resume (PAUSING, PAUSED, RESUMING): a command running
// in it has not ended.
func (st State) KeepsProcesses() bool { return st == Pausing || st == Paused || st == Resuming }

// memoryKept reports whether the record names a memory image of the sandbox: a stored one, or
// one the runtime keeps that is on its way to the store.
func memoryKept(rec runtime.Record) bool {
	return rec.Annotations[annMemoryImage] != "" || rec.Annotations[annMemoryPending] != ""
}

// memoryStoreTimeout bounds the store of one memory image (up to the sandbox's memory size).
const memoryStoreTimeout = 30 * time.Minute

// memoryStoreRetry is how long the reconciler waits after a failed store of a pause's image
// before it reads the image again.
const memoryStoreRetry = time.Minute

// memories store paused sandboxes' memory images.
type memories struct {
	store  *checkpoint.Store
	driver runtime.Driver
	log    *slog.Logger
}

// save stores the image the driver kept for the sandbox.
func (m *memories) save(ctx context.Context, rec runtime.Record) (checkpoint.Manifest, error) {
	r, err := m.driver.MemoryImage(ctx, rec.ID)
	if err != nil {
		return checkpoint.Manifest{}, err
	}
	defer r.Close()
	return m.store.Save(ctx, scopeOf(rec), r, "")
}

// discard deletes the sandbox's stored images except keep ("" for all). Best effort: the next
// discard tries again.
func (m *memories) discard(ctx context.Context, rec runtime.Record, keep string) {
	protect := []string{}
	if keep != "" {
		protect = append(protect, keep)
	}
	if _, err := m.store.Retain(context.WithoutCancel(ctx), scopeOf(rec), 0, protect...); err != nil {
		m.log.Warn("deleting memory images failed", "sandbox", rec.ID, "err", err)
	}
}

// Pause saves a running sandbox's memory and workspace and releases its compute and slot.
func (s *Service) Pause(ctx context.Context, p auth.Principal, id string) (Sandbox, error) {
	return s.pause(ctx, p, id, "")
}

// pause is Pause; why is the state_reason of the PAUSED sandbox (an auto-stop's).
func (s *Service) pause(ctx context.Context, p auth.Principal, id, why string) (Sandbox, error) {
	start := s.now()
	if _, err := s.Load(ctx, p, id, VerbPause); err != nil {
		return Sandbox{}, err
	}
	lock, err := s.lock(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	defer lock.Unlock(ctx)
	ctx = runtime.WithFence(ctx, lock.Fence())
	rec, err := s.Load(ctx, p, id, VerbPause)
	if err != nil {
		return Sandbox{}, err
	}
	if rec, err = s.setState(ctx, id, Running, Pausing, ""); err != nil {
		return Sandbox{}, err
	}
	// The work must finish even if the client goes away: the record says where it is going.
	wctx := context.WithoutCancel(ctx)
	o, err := s.pauseWork(wctx, rec)
	if err != nil {
		s.metrics.lifecycle(string(VerbPause), "error", s.now().Sub(start))
		if errors.Is(err, runtime.ErrFenced) {
			return Sandbox{}, err
		}
		// Nothing changed while the box runs on: it is RUNNING again. A box whose compute is
		// gone stays PAUSING, for the reconciler to finish.
		if !s.boxDead(wctx, id) {
			if _, serr := s.setState(wctx, id, Pausing, Running, ""); serr != nil {
				s.log.Error("could not roll a failed pause back", "sandbox", id, "err", serr)
			}
		}
		return Sandbox{}, err
	}
	reason := o.reason
	if reason == "" {
		reason = why
	}
	rec, err = s.setStateWith(wctx, id, Pausing, o.to, reason, o.mark)
	s.metrics.lifecycle(string(VerbPause), outcome(err), s.now().Sub(start))
	if err != nil {
		return Sandbox{}, err
	}
	s.pauseRecorded(rec, o)
	s.log.Info("sandbox paused", "sandbox", id, "state", o.to, "ms", s.now().Sub(start).Milliseconds())
	return toSandbox(rec), nil
}

// pauseOutcome is what a pause's work leaves: the state it ends in and why, and what the final
// record write carries with that state.
type pauseOutcome struct {
	to     State
	reason string
	// token is the time of the pause whose image the runtime keeps (annMemoryPending), for the
	// store to take after the answer.
	token string
	// checkpoint is the workspace checkpoint the pause took, the record's latest from then on:
	// the latest one already when keptCheckpoint (the workspace had not changed since it was
	// taken). version is the runtime's version of the workspace it holds (annWorkspaceVersion).
	checkpoint     string
	version        string
	keptCheckpoint bool
}

// mark applies the outcome to the record, in the write that moves it to o.to: one write (and
// fsync) for the state, the kept image and the checkpoint, not three. A replica that dies
// before it leaves the record PAUSING, and the reconciler's pauseWork finds the kept image
// (the runtime's Pause of a box it paused before is a no-op) and takes the checkpoint again.
func (o pauseOutcome) mark(r *runtime.Record) {
	if o.token != "" {
		if r.Annotations == nil {
			r.Annotations = map[string]string{}
		}
		r.Annotations[annMemoryPending] = o.token
		delete(r.Annotations, annMemoryImage)
	}
	if o.checkpoint != "" {
		r.LatestCheckpoint = o.checkpoint
		if r.Annotations == nil {
			r.Annotations = map[string]string{}
		}
		if o.version != "" {
			r.Annotations[annWorkspaceVersion] = o.checkpoint + " " + o.version
		} else {
			delete(r.Annotations, annWorkspaceVersion)
		}
	}
}

// pauseRecorded starts what follows a pause's final record write, after the answer: the old
// workspace checkpoints' retention, and the store of the memory image.
func (s *Service) pauseRecorded(rec runtime.Record, o pauseOutcome) {
	if o.checkpoint != "" && !o.keptCheckpoint {
		s.chore(func(ctx context.Context) { s.ckpts.retain(ctx, rec, o.checkpoint) })
	}
	if o.token != "" {
		s.storeMemory(rec, o.token)
	}
}

// pauseWork saves the box's memory and workspace and releases its compute and slot. It
// returns the state the pause ends in: PAUSED, or STOPPED with the reason when the memory
// could not be kept after all (a checkpoint that failed ended the box), with what the final
// record write carries (pauseOutcome.mark). An error means the box runs on as before (or,
// with its compute gone, that the reconciler must finish).
func (s *Service) pauseWork(ctx context.Context, rec runtime.Record) (pauseOutcome, error) {
	id := rec.ID
	if img := rec.Annotations[annMemoryImage]; img != "" && s.boxDead(ctx, id) {
		// An interrupted pause stored and recorded its image already (the reconciler
		// finishing it): what is left is to release the slot.
		if _, err := s.mem.store.Get(ctx, scopeOf(rec), img); err == nil {
			s.slots.release(ctx, rec.Tenant, rec.Project, id)
			return pauseOutcome{to: Paused}, nil
		}
	}
	// The workspace checkpoint is taken once the processes are saved and ended, so that it
	// holds what the memory image's open files refer to. A driver that cannot read a workspace
	// without its guest (no runtime.WorkspaceExporter) gets it from the guest first.
	_, exporter := s.driver.(runtime.WorkspaceExporter)
	var early error
	if !exporter {
		_, early = s.ckpts.save(ctx, rec)
	}
	pctx, endAttach := s.attachs.forPause(ctx, id)
	err := s.driver.Pause(pctx, id)
	endAttach()
	if err != nil {
		if errors.Is(err, runtime.ErrFenced) {
			return pauseOutcome{}, fencedOff(s.log, id, err)
		}
		if errors.Is(err, runtime.ErrUnsupported) {
			return pauseOutcome{}, apierror.Wrap(err, apierror.Unsupported,
				"the %s runtime cannot pause a sandbox (it cannot keep a sandbox's memory): stop it instead", s.driver.Name()).
				WithDetail("reason", "pause_unsupported")
		}
		var ge *proto.Error
		if errors.As(err, &ge) && ge.Code == proto.ErrCodeState {
			return pauseOutcome{}, apierror.Wrap(err, apierror.InvalidState, "cannot pause sandbox %s: %s", id, ge.Message).
				WithDetail("state", string(Running)).WithDetail("reason", "pause_refused")
		}
		if !s.boxDead(ctx, id) {
			return pauseOutcome{}, apierror.Wrap(err, apierror.Unavailable, "could not pause the sandbox; it runs on").WithRetryAfter(time.Second)
		}
		// The failed checkpoint ended the box: keep its workspace, as a stop of a dead box does.
		s.log.Warn("a pause failed and ended the sandbox's processes; stopping it", "sandbox", id, "err", err)
		to, reason, err := s.pauseFallback(ctx, rec, "its runtime could not save its memory ("+oneLine(err)+")")
		return pauseOutcome{to: to, reason: reason}, err
	}
	// The runtime keeps the image: the final write names it (the pause's time, which the store
	// checks before recording), so that whatever comes after it (a crash, a store that fails)
	// leaves a PAUSED sandbox a resume brings back.
	o := pauseOutcome{to: Paused, token: s.now().UTC().Format(time.RFC3339Nano)}
	werr := early
	if exporter {
		var ws settled
		if ws, werr = s.ckpts.captureSettled(ctx, rec); werr == nil {
			o.checkpoint, o.version, o.keptCheckpoint = ws.checkpoint, ws.version, ws.kept
		}
	}
	if werr != nil {
		// The workspace is on the sandbox's disk and the runtime keeps the memory image: the
		// pause holds. Only the fallback snapshot is older.
		s.log.Warn("a pause's workspace checkpoint failed", "sandbox", id, "err", werr)
		o.reason = "paused without a new workspace snapshot: " + apierror.From(werr).Message
	}
	if err := s.driver.Stop(ctx, id); err != nil {
		return pauseOutcome{}, runtimeError(s.log, id, err, "could not release the paused sandbox's compute")
	}
	// The compute is gone: the slot goes back before PAUSED is recorded (as a stop's). The
	// runtime keeps its copy of the image (a resume on this host restores from it); the store's
	// copy follows the final write (pauseRecorded).
	s.slots.release(ctx, rec.Tenant, rec.Project, id)
	return o, nil
}

// errMovedOn is a stored memory image's record update refused: the sandbox is no longer paused
// on the image the store read.
var errMovedOn = errors.New("the sandbox is no longer paused on this image")

// storeMemory stores, in the background, the image the runtime keeps for the sandbox's pause
// token, and records it while the sandbox is still paused on that image; else it deletes what
// it stored. One store per pause at a time on a replica. A store that fails leaves the record
// as it was: the runtime's copy serves a resume, and the reconciler stores it again once
// memoryStoreRetry has passed.
func (s *Service) storeMemory(rec runtime.Record, token string) {
	key := rec.ID + "/" + token
	if !s.memStores.begin(key, s.now()) {
		return
	}
	s.chores.Add(1)
	go func() {
		defer s.chores.Done()
		defer s.memStores.end(key)
		ctx, cancel := context.WithTimeout(s.bg, memoryStoreTimeout)
		defer cancel()
		start := s.now()
		m, err := s.mem.save(ctx, rec)
		if errors.Is(err, runtime.ErrNotFound) {
			s.memStores.forget(key)
			return // resumed, stopped or destroyed meanwhile: the runtime's copy is gone
		}
		if err != nil {
			s.memStores.fail(key, s.now())
			s.log.Warn("storing a memory image failed; the runtime keeps it and the reconciler tries again",
				"sandbox", rec.ID, "retry_in", memoryStoreRetry, "err", err)
			return
		}
		s.memStores.forget(key)
		// Without the pause's fence (its lock is long gone): the check below, atomic with the
		// write, is what keeps a late store from naming an image the sandbox is no longer on.
		_, err = s.driver.UpdateRecord(ctx, rec.ID, func(r *runtime.Record) error {
			if st := State(r.State); r.Annotations[annMemoryPending] != token || st != Pausing && st != Paused {
				return errMovedOn
			}
			r.Annotations[annMemoryImage] = m.ID
			delete(r.Annotations, annMemoryPending)
			return nil
		})
		if err != nil {
			if !errors.Is(err, errMovedOn) && !errors.Is(err, runtime.ErrNotFound) {
				s.log.Warn("recording a stored memory image failed; deleting it", "sandbox", rec.ID, "err", err)
			}
			if derr := s.mem.store.Delete(context.WithoutCancel(ctx), scopeOf(rec), m.ID); derr != nil {
				s.log.Warn("deleting a memory image nobody needs", "sandbox", rec.ID, "image", m.ID, "err", derr)
			}
			return
		}
		s.mem.discard(ctx, rec, m.ID)
		s.log.Info("memory image stored", "sandbox", rec.ID, "image", m.ID, "bytes", m.Size, "raw_bytes", m.RawSize,
			"ms", s.now().Sub(start).Milliseconds())
	}()
}

// pauseFallback stops a box whose pause lost its memory (why says how): its workspace is
// checkpointed from the runtime and kept, as a stop's, and its slot released.
func (s *Service) pauseFallback(ctx context.Context, rec runtime.Record, why string) (State, string, error) {
	stopWhy, err := s.stopWork(ctx, rec)
	if err != nil {
		return "", "", err
	}
	s.slots.release(ctx, rec.Tenant, rec.Project, rec.ID)
	_ = s.driver.DropMemoryImage(ctx, rec.ID)
	reason := "stopped instead of paused: " + why + "; its processes ended, its workspace is kept"
	if stopWhy != "" {
		reason += " (" + stopWhy + ")"
	}
	return Stopped, reason, nil
}

// Resume brings a paused sandbox back with its processes (or, when its memory cannot be
// restored, starts it on its workspace). It takes a concurrency slot.
func (s *Service) Resume(ctx context.Context, p auth.Principal, id string) (Sandbox, error) {
	start := s.now()
	if _, err := s.Load(ctx, p, id, VerbResume); err != nil {
		return Sandbox{}, err
	}
	if err := s.slots.acquire(ctx, p.Tenant, p.Project, id); err != nil {
		return Sandbox{}, err
	}
	sb, err := s.resume(ctx, p, id)
	s.metrics.lifecycle(string(VerbResume), outcome(err), s.now().Sub(start))
	if err != nil {
		s.slots.releaseUnlessHolding(ctx, p.Tenant, p.Project, id)
		return Sandbox{}, err
	}
	s.log.Info("sandbox resumed", "sandbox", id, "reason", sb.StateReason, "ms", s.now().Sub(start).Milliseconds())
	return sb, nil
}

func (s *Service) resume(ctx context.Context, p auth.Principal, id string) (Sandbox, error) {
	lock, err := s.lock(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	defer lock.Unlock(ctx)
	ctx = runtime.WithFence(ctx, lock.Fence())
	rec, err := s.Load(ctx, p, id, VerbResume)
	if err != nil {
		return Sandbox{}, err
	}
	if rec, err = s.setState(ctx, id, Paused, Resuming, ""); err != nil {
		return Sandbox{}, err
	}
	wctx := context.WithoutCancel(ctx)
	reason, kept, err := s.resumeWork(wctx, rec)
	if err != nil {
		if errors.Is(err, runtime.ErrFenced) {
			return Sandbox{}, err
		}
		back, why := Paused, ""
		if !kept {
			back, why = Failed, "resume failed: "+apierror.From(err).Message
		}
		if _, serr := s.setState(wctx, id, Resuming, back, why); serr != nil {
			s.log.Error("could not roll a failed resume back", "sandbox", id, "err", serr)
		}
		return Sandbox{}, err
	}
	rec, err = s.setState(wctx, id, Resuming, Running, reason)
	if err != nil {
		return Sandbox{}, err
	}
	return toSandbox(rec), nil
}

// resumeWork restores the box from its memory image, or starts it on its workspace when the
// image cannot bring its processes back; reason is then "memory not restored: …". An error
// with kept set left everything as it was (a store that did not answer): the sandbox is PAUSED
// still, its image intact. Without kept, the start failed too.
func (s *Service) resumeWork(ctx context.Context, rec runtime.Record) (reason string, kept bool, err error) {
	id := rec.ID
	s.attachs.drop(id)
	why, err := s.restoreMemory(ctx, rec)
	switch {
	case err == nil && why == "":
		s.forgetMemory(ctx, rec)
		return "", false, nil
	case errors.Is(err, runtime.ErrFenced):
		return "", false, fencedOff(s.log, id, err)
	case err != nil:
		return "", true, err
	}
	s.log.Warn("a resume could not restore the sandbox's memory; starting it on its workspace", "sandbox", id, "why", why)
	if err := s.startWork(ctx, rec); err != nil {
		return "", false, err
	}
	s.forgetMemory(ctx, rec)
	return "memory not restored: " + why + "; the sandbox was started on its workspace (its processes ended)", false, nil
}

// restoreMemory restores the box from its memory image (the runtime's kept copy when it has an
// intact one, else the stored copy). It answers why when the image cannot bring the processes
// back (the caller starts the box on its workspace), an error when the resume should fail and
// keep everything (the store or the runtime did not answer).
func (s *Service) restoreMemory(ctx context.Context, rec runtime.Record) (why string, err error) {
	id := rec.ID
	img, pending := rec.Annotations[annMemoryImage], rec.Annotations[annMemoryPending]
	name := img
	if img == "" {
		name = "(the runtime's copy of the pause at " + pending + ", never stored)"
	}
	if box, gerr := s.driver.Get(ctx, id); gerr == nil && box.Phase == runtime.PhaseRunning {
		if img == "" && pending == "" {
			return "", nil // an interrupted resume got this far, and recorded it
		}
		// An interrupted resume restored it: make sure its init listens (no image is read).
		noImage := func(context.Context) (io.ReadCloser, error) {
			return nil, errors.New("the sandbox runs: no image to read")
		}
		if err := s.driver.Resume(ctx, id, noImage); err != nil {
			return s.imageError(id, name, err)
		}
		return "", nil
	}
	if img == "" && pending == "" {
		return "the sandbox has no memory image", nil
	}
	stored := func(ctx context.Context) (io.ReadCloser, error) {
		if img == "" {
			// The runtime's copy was the only one: the store had not got it yet.
			return nil, &imageStoreError{fmt.Errorf("the runtime's copy is gone and it was never stored: %w", checkpoint.ErrNotFound)}
		}
		r, _, err := s.mem.store.Open(ctx, scopeOf(rec), img)
		if err != nil {
			return nil, &imageStoreError{err}
		}
		return r, nil
	}
	if err := s.driver.Resume(ctx, id, stored); err != nil {
		return s.imageError(id, name, err)
	}
	return "", nil
}

// imageStoreError is an error of the checkpoint store opening a memory image.
type imageStoreError struct{ err error }

func (e *imageStoreError) Error() string { return e.err.Error() }
func (e *imageStoreError) Unwrap() error { return e.err }

// imageError sorts a driver's Resume error: an image it cannot restore is a why; anything else
// fails the resume.
func (s *Service) imageError(id, img string, err error) (string, error) {
	var ie *runtime.ImageError
	var se *imageStoreError
	switch {
	case errors.Is(err, runtime.ErrFenced):
		return "", err
	case errors.Is(err, checkpoint.ErrNotFound):
		return fmt.Sprintf("its memory image %s is gone", img), nil
	case errors.As(err, &se) && errors.Is(err, checkpoint.ErrCorrupt):
		s.log.Error("corrupt memory image", "sandbox", id, "image", img, "err", err)
		return fmt.Sprintf("%s: its memory image %s is corrupt (its data does not match its manifest)", apierror.CheckpointCorrupt, img), nil
	case se != nil:
		return "", apierror.Wrap(err, apierror.Unavailable, "could not read the sandbox's memory image; it stays PAUSED").WithRetryAfter(time.Second)
	case errors.Is(err, checkpoint.ErrCorrupt) || errors.As(err, &ie) && ie.Corrupt:
		s.log.Error("corrupt memory image", "sandbox", id, "image", img, "err", err)
		return fmt.Sprintf("%s: its memory image %s is corrupt (%s)", apierror.CheckpointCorrupt, img, imageReason(err)), nil
	case errors.As(err, &ie) && isReadFailure(ie):
		return "", apierror.Wrap(err, apierror.Unavailable, "could not read the sandbox's memory image; it stays PAUSED").WithRetryAfter(time.Second)
	case ie != nil:
		return ie.Reason, nil
	case errors.Is(err, runtime.ErrUnsupported):
		return fmt.Sprintf("the %s runtime cannot restore a sandbox's memory", s.driver.Name()), nil
	}
	return "", runtimeError(s.log, id, err, "could not resume the sandbox; it stays PAUSED")
}

// isReadFailure reports an image that could not be read because its reader failed (a store
// that stopped answering mid-stream), not because of what it held.
func isReadFailure(ie *runtime.ImageError) bool {
	return !ie.Corrupt && strings.HasPrefix(ie.Reason, "the image could not be read")
}

func imageReason(err error) string {
	var ie *runtime.ImageError
	if errors.As(err, &ie) {
		return ie.Reason
	}
	return oneLine(err)
}

// forgetStores forgets the failed stores of the image rec names as pending (the sandbox is done
// with it).
func (s *Service) forgetStores(rec runtime.Record) {
	if token := rec.Annotations[annMemoryPending]; token != "" {
		s.memStores.forget(rec.ID + "/" + token)
	}
}

// forgetMemory clears the record's image and deletes the stored ones: the sandbox runs.
func (s *Service) forgetMemory(ctx context.Context, rec runtime.Record) {
	s.forgetStores(rec)
	if _, err := s.driver.UpdateRecord(ctx, rec.ID, func(r *runtime.Record) error {
		delete(r.Annotations, annMemoryImage)
		delete(r.Annotations, annMemoryPending)
		return nil
	}); err != nil {
		s.log.Warn("clearing a resumed sandbox's memory image", "sandbox", rec.ID, "err", err)
		return
	}
	s.chore(func(ctx context.Context) { s.mem.discard(ctx, rec, "") })
}

// chore runs f in the background on the service's lifetime (Close waits for it): work that
// can follow an answer, such as deleting stored images nobody needs any more.
func (s *Service) chore(f func(ctx context.Context)) {
	s.chores.Add(1)
	go func() {
		defer s.chores.Done()
		ctx, cancel := context.WithTimeout(s.bg, time.Minute)
		defer cancel()
		f(ctx)
	}()
}

// oneLine is an error's text on one line, bounded.
func oneLine(err error) string {
	return apierror.Truncate(strings.Join(strings.Fields(err.Error()), " "), 400)
}

// pauseRefused reports a pause that cannot be done for this sandbox (its runtime cannot pause,
// or its guest refused: a socket bound in the workspace), as opposed to one that was in the
// way of another operation or hit an outage.
func pauseRefused(err error) bool {
	e := apierror.From(err)
	return e.Details["reason"] == "pause_unsupported" || e.Details["reason"] == "pause_refused"
}

// autoResumeWait bounds how long an exec or file call waits for its auto-resumed sandbox.
const autoResumeWait = time.Minute

// autoResumes reports whether a verb refused on rec resumes the sandbox first: an exec or file
// call on a sandbox created with auto_resume that is PAUSED (or on its way there or back).
func autoResumes(rec runtime.Record, verb Verb) bool {
	return (verb == VerbExec || verb == VerbFiles) && rec.Annotations[annAutoResume] == "true" &&
		State(rec.State).KeepsProcesses()
}

// autoResume resumes the caller's PAUSED sandbox for an exec or file call, waiting out a pause
// or resume in flight, and loads it again for verb. A project without a free slot is
// QUOTA_EXCEEDED, as for an explicit resume.
func (s *Service) autoResume(ctx context.Context, p auth.Principal, id string, verb Verb) (runtime.Record, error) {
	deadline := s.now().Add(autoResumeWait)
	wait := 50 * time.Millisecond
	for {
		rec, err := s.load(ctx, p, id, verb)
		if err == nil || !autoResumes(rec, verb) {
			return rec, err
		}
		if State(rec.State) == Paused {
			_, rerr := s.Resume(ctx, p, id)
			switch {
			case rerr == nil:
				continue
			case apierror.Is(rerr, apierror.InvalidState):
				// Another call resumes it, or its state moved: look again.
			default:
				return rec, rerr
			}
		}
		if s.now().After(deadline) {
			return rec, err
		}
		select {
		case <-ctx.Done():
			return rec, apierror.Wrap(ctx.Err(), apierror.Unavailable, "the request was cancelled")
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}
