package sandbox

import (
	"context"
	"errors"
	"maps"
	"strings"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/runtime"
)

// Create creates a sandbox and returns it RUNNING.
func (s *Service) Create(ctx context.Context, p auth.Principal, req CreateRequest) (Sandbox, error) {
	start := s.now()
	prof, autostop, ttl, err := s.validateCreate(req)
	if err != nil {
		return Sandbox{}, err
	}
	// The source is checked before a slot is taken: a missing snapshot, a refused URL or a
	// prefix the project may not use costs nothing.
	src, err := s.boot.check(ctx, p, req.Source, prof.DiskMB<<20)
	if err != nil {
		return Sandbox{}, err
	}
	mode, policy, err := s.networkFor(ctx, prof, req.Network)
	if err != nil {
		return Sandbox{}, err
	}
	env := map[string]string{}
	for k, v := range prof.Env {
		env[k] = v
	}
	for k, v := range req.Env {
		env[k] = v
	}
	// A profile with a warm pool hands out one of its boxes (pool.go); else the box is made now.
	if sb, ok, err := s.claimWarm(ctx, p, req, prof, s.newRecord(p, req, prof, mode, policy, env, autostop, ttl, src), start); ok || err != nil {
		return sb, err
	}
	id := NewID(idPrefix)
	if err := s.slots.acquire(ctx, p.Tenant, p.Project, id); err != nil {
		return Sandbox{}, err
	}
	// The create holds the sandbox's lock: a reconciler that can take it knows a CREATING
	// record's creator is gone and finishes (or fails) the create.
	lock, err := s.store.Lock(ctx, id, s.cfg.LockTTL)
	if err != nil {
		s.slots.release(ctx, p.Tenant, p.Project, id)
		return Sandbox{}, apierror.Wrap(err, apierror.Unavailable, "the sandbox store is unavailable")
	}
	defer lock.Unlock(ctx)
	ctx = runtime.WithFence(ctx, lock.Fence())
	rec := s.newRecord(p, req, prof, mode, policy, env, autostop, ttl, src)
	rec.ID = id
	// The lookup first: a replica that dies after this leaves an entry whose box may not
	// exist, which Get cleans up; the reverse order could leave a box nobody can find.
	if err := s.store.Put(ctx, entryOf(rec)); err != nil {
		s.slots.release(ctx, p.Tenant, p.Project, id)
		return Sandbox{}, apierror.Wrap(err, apierror.Unavailable, "the sandbox store is unavailable")
	}
	s.Touch(ctx, id)
	s.publish(ctx, rec, "")
	seeded, err := s.createBox(ctx, rec)
	if err != nil {
		s.abortCreate(ctx, rec, start)
		return Sandbox{}, err
	}
	if src.key != "" && !seeded {
		// Fetched once, streamed into the workspace before the sandbox is RUNNING.
		if err := s.boot.restore(ctx, rec); err != nil {
			s.abortCreate(ctx, rec, start)
			return Sandbox{}, err
		}
	}
	rec, err = s.setState(ctx, rec.ID, Creating, Running, "")
	if err != nil {
		return Sandbox{}, err
	}
	s.metrics.lifecycle("create", "ok", s.now().Sub(start))
	s.log.Info("sandbox created", "sandbox", rec.ID, "tenant", p.Tenant, "project", p.Project, "profile", prof.Name,
		"ms", s.now().Sub(start).Milliseconds())
	return toSandbox(rec), nil
}

// newRecord is the record of a new sandbox (without its id): CREATING, the caller's owner,
// spec, timers, labels and options.
func (s *Service) newRecord(p auth.Principal, req CreateRequest, prof ProfileConfig, mode string, policy *runtime.NetworkPolicy,
	env map[string]string, autostop, ttl int64, src sourceSpec) runtime.Record {
	now := s.now().UTC()
	rec := runtime.Record{
		Tenant: p.Tenant, Project: p.Project, Spec: specOf(prof, mode, policy, env),
		State: string(Creating), DesiredState: string(Running), AutostopSec: autostop, TTLSec: ttl,
		CreatedAt: now, StateChangedAt: now, Labels: maps.Clone(req.Labels),
	}
	if len(rec.Labels) == 0 {
		rec.Labels = nil
	}
	if src.key != "" {
		// Recorded before the box exists, so that a reconciler finishing this create fills
		// the workspace from it too (and a snapshot is the first checkpoint's parent).
		rec.Annotations = map[string]string{src.key: src.value}
	}
	if req.AutostopAction == AutostopPause {
		rec.Annotations = withAnnotation(rec.Annotations, annAutostopAction, AutostopPause)
	}
	if req.AutoResume {
		rec.Annotations = withAnnotation(rec.Annotations, annAutoResume, "true")
	}
	return rec
}

// createBox makes the box. A sandbox created from a snapshot on a runtime that can extract a
// workspace before the box starts (runtime.WorkspaceSeeder) gets it so, at disk speed, and
// seeded is true; otherwise the caller restores its source through the guest.
func (s *Service) createBox(ctx context.Context, rec runtime.Record) (seeded bool, err error) {
	seeder, ok := s.driver.(runtime.WorkspaceSeeder)
	snap := sourceOf(rec)
	if !ok || snap == "" || rec.Annotations[annSourceArchive] != "" || rec.Annotations[annSourceGCS] != "" {
		if err := s.driver.Create(ctx, rec); err != nil {
			return false, runtimeFailed(s.log, rec.ID, err, "could not create the sandbox: the runtime failed to start it")
		}
		return false, nil
	}
	seed, sc, err := s.boot.snapshotSeed(ctx, rec, snap)
	if err != nil {
		return false, err
	}
	t0 := s.now()
	if err := seeder.CreateSeeded(ctx, rec, seed); err != nil {
		if serr := s.ckpts.seeded(ctx, sc, snap, err); serr != nil {
			return false, s.boot.snapshotError(rec, snap, serr)
		}
		return false, runtimeFailed(s.log, rec.ID, err, "could not create the sandbox: the runtime failed to start it")
	}
	s.metrics.lifecycle("restore", "ok", s.now().Sub(t0))
	return true, nil
}

// abortCreate removes what a failed create made: the box, the lookup and the slot. A box
// whose delete was fenced off is another replica's now (it finished the create after this
// one's lock ran out): its lookup and slot stay.
func (s *Service) abortCreate(ctx context.Context, rec runtime.Record, start time.Time) {
	cleanup := context.WithoutCancel(ctx)
	s.attachs.drop(rec.ID)
	if err := s.driver.Delete(cleanup, rec.ID); errors.Is(err, runtime.ErrFenced) {
		s.log.Warn("a failed create's cleanup was fenced off: another replica took over the sandbox", "sandbox", rec.ID, "err", err)
		s.metrics.lifecycle("create", "error", s.now().Sub(start))
		return
	} else if err != nil {
		s.log.Error("cleaning up a failed create", "sandbox", rec.ID, "err", err)
	}
	_ = s.store.Delete(cleanup, entryOf(rec))
	_ = s.store.ForgetActivity(cleanup, rec.ID)
	s.slots.release(cleanup, rec.Tenant, rec.Project, rec.ID)
	s.metrics.lifecycle("create", "error", s.now().Sub(start))
}

func (s *Service) validateCreate(req CreateRequest) (ProfileConfig, int64, int64, error) {
	name := req.Profile
	if name == "" {
		name = s.cfg.DefaultProfile
	}
	prof, ok := s.profiles[name]
	if !ok {
		names := make([]string, 0, len(s.cfg.Profiles))
		for _, p := range s.cfg.Profiles {
			names = append(names, p.Name)
		}
		return prof, 0, 0, apierror.New(apierror.InvalidArgument, "unknown profile %q: one of %s", name, strings.Join(names, ", "))
	}
	l := s.cfg.Limits
	autostop, err := Bound("autostop_sec", req.AutostopSec, l.AutostopDefaultSec, l.AutostopMinSec, l.AutostopMaxSec)
	if err != nil {
		return prof, 0, 0, err
	}
	ttl, err := Bound("ttl_sec", req.TTLSec, l.TTLDefaultSec, l.TTLMinSec, l.TTLMaxSec)
	if err != nil {
		return prof, 0, 0, err
	}
	if err := s.cfg.Limits.CheckEnv(req.Env); err != nil {
		return prof, 0, 0, err
	}
	if err := s.cfg.Limits.CheckLabels(req.Labels); err != nil {
		return prof, 0, 0, err
	}
	switch req.AutostopAction {
	case "", AutostopStop, AutostopPause:
	default:
		return prof, 0, 0, apierror.New(apierror.InvalidArgument, "autostop_action must be %q or %q, got %q",
			AutostopStop, AutostopPause, apierror.Truncate(req.AutostopAction, 32)).WithDetail("field", "autostop_action")
	}
	return prof, autostop, ttl, nil
}

// withAnnotation sets key in annotations, making the map when there is none.
func withAnnotation(annotations map[string]string, key, value string) map[string]string {
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[key] = value
	return annotations
}

// Bound is a caller's optional value of field name: def when not given, INVALID_ARGUMENT
// naming the field when outside min..max.
func Bound(name string, v *int64, def, min, max int64) (int64, error) {
	if v == nil {
		return def, nil
	}
	if *v < min || *v > max {
		return 0, apierror.New(apierror.InvalidArgument, "%s must be between %d and %d, got %d", name, min, max, *v).
			WithDetail("field", name)
	}
	return *v, nil
}

// CheckEnv checks the environment variables of a create or an exec: at most ExecMaxEnv of
// them, well-formed, none of the guest init's own (SBX_*).
func (l Limits) CheckEnv(env map[string]string) error {
	if len(env) > l.ExecMaxEnv {
		return apierror.New(apierror.InvalidArgument, "at most %d environment variables, got %d", l.ExecMaxEnv, len(env))
	}
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) || len(k)+len(v) > 32<<10 {
			return apierror.New(apierror.InvalidArgument, "invalid environment variable %q: names must be non-empty without '=' or NUL, values without NUL, each at most 32 KiB", apierror.Truncate(k, 64))
		}
		if strings.HasPrefix(k, "SBX_") {
			return apierror.New(apierror.InvalidArgument, "environment variable %s is reserved: names starting with SBX_ belong to the guest init", apierror.Truncate(k, 64))
		}
	}
	return nil
}
