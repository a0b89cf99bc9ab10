package sandbox

import (
	"context"
	"errors"
	"maps"
	"strings"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/events"
	"sandboxd/internal/store"
	"sandboxd/runtime"
)

// errUnchanged ends a record update whose request changes nothing: nothing is written.
var errUnchanged = errors.New("sandbox: the update changes nothing")

// Update changes one of the caller's sandboxes: its labels (a merge patch), autostop_sec and
// ttl_sec, within the bounds of a create. It holds the sandbox's operation lock and writes the
// record with the lock's fence, so it never interleaves with a stop, start or destroy (those
// in flight answer INVALID_STATE with Retry-After). The record is the truth; the lookup's
// labels (a hint for List) follow it, and the project's event stream gets SANDBOX_UPDATED
// naming what changed. It answers the sandbox as updated, with its new deadlines (expiry, and
// auto-stop counted from this call, which is activity).
func (s *Service) Update(ctx context.Context, p auth.Principal, id string, req UpdateRequest) (Sandbox, error) {
	start := s.now()
	if err := s.checkUpdate(req); err != nil {
		return Sandbox{}, err
	}
	if _, err := s.Load(ctx, p, id, VerbUpdate); err != nil {
		return Sandbox{}, err
	}
	lock, err := s.lock(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	defer lock.Unlock(ctx)
	ctx = runtime.WithFence(ctx, lock.Fence())
	// Load again under the lock: the state may have moved while we waited.
	rec, err := s.Load(ctx, p, id, VerbUpdate)
	if err != nil {
		return Sandbox{}, err
	}
	var changed []string
	updated, err := s.driver.UpdateRecord(context.WithoutCancel(ctx), id, func(r *runtime.Record) error {
		if err := Check(State(r.State), VerbUpdate, id); err != nil {
			return err
		}
		var err error
		changed, err = s.applyUpdate(r, req)
		if err != nil {
			return err
		}
		if len(changed) == 0 {
			return errUnchanged
		}
		return nil
	})
	switch {
	case errors.Is(err, errUnchanged):
		updated, err = rec, nil
	case err != nil && apierror.From(err).Code != apierror.Internal:
		// The request's own error (a bound, the state): as it is.
	case errors.Is(err, runtime.ErrNotFound):
		err = notFound(id) // gone behind the lock's back (deleted outside the service)
	case err != nil:
		err = runtimeError(s.log, id, err, "could not update the sandbox's record")
	}
	s.metrics.lifecycle(string(VerbUpdate), outcome(err), s.now().Sub(start))
	if err != nil {
		return Sandbox{}, err
	}
	if len(changed) > 0 {
		if err := s.store.SetLabels(ctx, id, updated.Labels); errors.Is(err, store.ErrNotFound) {
			_ = s.store.Put(ctx, entryOf(updated))
		} else if err != nil {
			s.log.Warn("lookup labels update failed; they are rebuilt from the runtime", "sandbox", id, "err", err)
		}
		s.publishUpdate(ctx, updated, changed)
		s.log.Info("sandbox updated", "sandbox", id, "changed", strings.Join(changed, ","))
	}
	return s.withActivity(ctx, toSandbox(updated)), nil
}

// checkUpdate checks what an update asks before any sandbox is looked at.
func (s *Service) checkUpdate(req UpdateRequest) error {
	if req.Labels == nil && !req.ClearLabels && req.AutostopSec == nil && req.TTLSec == nil {
		return apierror.New(apierror.InvalidArgument, "nothing to update: set labels, autostop_sec or ttl_sec")
	}
	l := s.cfg.Limits
	if _, err := Bound("autostop_sec", req.AutostopSec, 0, l.AutostopMinSec, l.AutostopMaxSec); err != nil {
		return err
	}
	if _, err := Bound("ttl_sec", req.TTLSec, 0, l.TTLMinSec, l.TTLMaxSec); err != nil {
		return err
	}
	return l.checkLabelPatch(req.Labels)
}

// applyUpdate applies req to a record and names the fields it changed. The new label set is
// bounded like a create's; a ttl_sec must leave the sandbox's expiry after now.
func (s *Service) applyUpdate(r *runtime.Record, req UpdateRequest) ([]string, error) {
	var changed []string
	if req.Labels != nil || req.ClearLabels {
		base := r.Labels
		if req.ClearLabels {
			base = nil
		}
		labels := applyLabelPatch(base, req.Labels)
		if err := s.cfg.Limits.CheckLabels(labels); err != nil {
			return nil, err
		}
		if !maps.Equal(labels, r.Labels) {
			r.Labels = labels
			changed = append(changed, "labels")
		}
	}
	if v := req.AutostopSec; v != nil && *v != r.AutostopSec {
		r.AutostopSec = *v
		changed = append(changed, "autostop_sec")
	}
	if v := req.TTLSec; v != nil && *v != r.TTLSec {
		if at := ExpiresAt(r.CreatedAt, *v); !at.After(s.now()) {
			return nil, apierror.New(apierror.InvalidArgument,
				"ttl_sec %d counts from the creation at %s and would end the sandbox's life before now; destroy it instead, or ask for more than %d",
				*v, r.CreatedAt.UTC().Format("2006-01-02T15:04:05Z"), int64(s.now().Sub(r.CreatedAt).Seconds())).WithDetail("field", "ttl_sec")
		}
		r.TTLSec = *v
		changed = append(changed, "ttl_sec")
	}
	return changed, nil
}

// publishUpdate puts SANDBOX_UPDATED on the project's event stream.
func (s *Service) publishUpdate(ctx context.Context, rec runtime.Record, changed []string) {
	ev := events.Event{Type: EventUpdated, SandboxID: rec.ID, At: s.now().UTC(),
		Fields: map[string]string{"state": rec.State, "reason": strings.Join(changed, ",")}}
	if _, err := s.events.Publish(context.WithoutCancel(ctx), rec.Tenant, rec.Project, ev); err != nil {
		s.log.Warn("publishing a sandbox event failed", "sandbox", rec.ID, "err", err)
	}
}
