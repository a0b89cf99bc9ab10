package sandbox

import (
	"context"
	"errors"
	"maps"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/store"
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
	if len(opts.Labels) > 0 {
		if err := s.checkSelector(opts.Labels); err != nil {
			return Page{}, err
		}
	}
	// hinted reports whether the lookup's cached state and labels may match the filters; the
	// record (read only for those) decides.
	hinted := func(e store.Entry) bool {
		return State(e.State) != Destroyed && (opts.State == "" || State(e.State) == opts.State) && matchLabels(e.Labels, opts.Labels)
	}
	var page Page
	after := opts.After
	// acts are the listed sandboxes' last activity, read with the index (one round trip less
	// than reading it for the page's running sandboxes afterwards).
	acts := map[string]time.Time{}
	// Read the index in batches until the page is full and one more entry may match (then
	// another page follows), or the index ends (then none does). With filters this may take
	// several batches, bounded so one call never scans a whole huge project: a call that stops
	// early answers what it found and a cursor after the last entry it scanned, which may be
	// short of a full page (even empty), never the last page by mistake.
	for scanned, budget := 0, 20*limit+1000; ; {
		batch := limit + 1
		entries, last, err := s.store.ListActive(ctx, p.Tenant, p.Project, after, batch)
		if err != nil {
			return Page{}, apierror.Wrap(err, apierror.Unavailable, "the sandbox store is unavailable")
		}
		scanned += len(entries)
		maps.Copy(acts, last)
		for _, e := range entries {
			if !hinted(e) {
				after = e.ID
				continue
			}
			if len(page.Sandboxes) == limit {
				// The page is full and this entry may be on the next one.
				page.NextCursor = after
				setAutostops(page.Sandboxes, acts)
				return page, nil
			}
			after = e.ID
			box, err := s.driver.Get(ctx, e.ID)
			if errors.Is(err, runtime.ErrNotFound) {
				continue
			}
			if err != nil {
				return Page{}, apierror.Wrap(err, apierror.Unavailable, "the runtime is unavailable")
			}
			if box.Record.Tenant != p.Tenant || box.Record.Project != p.Project {
				continue // the record decides whose it is, not the lookup (nor a cached copy of it)
			}
			sb := toSandbox(s.Observe(ctx, box))
			if sb.State == Destroyed || (opts.State != "" && sb.State != opts.State) || !matchLabels(sb.Labels, opts.Labels) {
				continue
			}
			page.Sandboxes = append(page.Sandboxes, sb)
		}
		if len(entries) < batch {
			break // the index ends here: this is the last page
		}
		if scanned >= budget {
			page.NextCursor = after
			break
		}
	}
	setAutostops(page.Sandboxes, acts)
	return page, nil
}

// checkSelector checks a label filter that did not come through Limits.Selector.
func (s *Service) checkSelector(sel map[string]string) error {
	terms := make([]Label, 0, len(sel))
	for k, v := range sel {
		terms = append(terms, Label{Key: k, Value: v})
	}
	_, err := s.cfg.Limits.Selector(terms)
	return err
}
