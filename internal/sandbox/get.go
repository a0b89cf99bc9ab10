package sandbox

import (
	"context"
	"errors"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/runtime"
)

// Get returns one of the caller's sandboxes.
func (s *Service) Get(ctx context.Context, p auth.Principal, id string) (Sandbox, error) {
	rec, err := s.Load(ctx, p, id, VerbGet)
	if err != nil {
		return Sandbox{}, err
	}
	return s.withActivity(ctx, toSandbox(rec)), nil
}

// List returns a page of the caller's sandboxes, newest first.
func (s *Service) List(ctx context.Context, p auth.Principal, opts ListOptions) (Page, error) {
	limit := opts.Limit
	if limit <= 0 {
		limit = 50
	}
	if limit > s.cfg.Limits.MaxPageSize {
		return Page{}, apierror.New(apierror.InvalidArgument, "page size must be at most %d, got %d", s.cfg.Limits.MaxPageSize, limit)
	}
	if opts.After != "" && !ValidID(opts.After, idPrefix) {
		return Page{}, apierror.New(apierror.InvalidArgument, "malformed cursor %q", apierror.Truncate(opts.After, 64))
	}
	if opts.State != "" {
		if _, err := ParseState(string(opts.State)); err != nil {
			return Page{}, err
		}
	}
	var page Page
	after := opts.After
	// Read the index in batches until the page is full; with a state filter this may take
	// several batches, bounded so one call never scans a whole huge project.
	for scanned := 0; len(page.Sandboxes) < limit && scanned < 20*limit+1000; {
		batch := limit + 1
		entries, err := s.store.List(ctx, p.Tenant, p.Project, after, batch)
		if err != nil {
			return Page{}, apierror.Wrap(err, apierror.Unavailable, "the sandbox store is unavailable")
		}
		scanned += len(entries)
		for _, e := range entries {
			after = e.ID
			if State(e.State) == Destroyed || (opts.State != "" && State(e.State) != opts.State) {
				continue
			}
			if len(page.Sandboxes) == limit {
				page.NextCursor = page.Sandboxes[limit-1].ID
				s.withActivities(ctx, page.Sandboxes)
				return page, nil
			}
			rec, err := s.driver.Get(ctx, e.ID)
			if errors.Is(err, runtime.ErrNotFound) {
				continue
			}
			if err != nil {
				return Page{}, apierror.Wrap(err, apierror.Unavailable, "the runtime is unavailable")
			}
			sb := toSandbox(s.Observe(ctx, rec))
			if opts.State != "" && sb.State != opts.State {
				continue
			}
			page.Sandboxes = append(page.Sandboxes, sb)
		}
		if len(entries) < batch {
			break
		}
	}
	if len(page.Sandboxes) == limit && after != page.Sandboxes[limit-1].ID {
		page.NextCursor = page.Sandboxes[limit-1].ID
	}
	s.withActivities(ctx, page.Sandboxes)
	return page, nil
}
