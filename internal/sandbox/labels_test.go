package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/domain/domaintest"
	. "sandboxd/internal/sandbox"
	"sandboxd/internal/store"
	"sandboxd/runtime"
)

func TestCheckLabels(t *testing.T) {
	l := DefaultLimits()
	long := strings.Repeat("a", 64)
	for _, tt := range []struct {
		name   string
		labels map[string]string
		ok     bool
	}{
		{"none", nil, true},
		{"plain", map[string]string{"team": "ml", "env": "prod-1", "empty": ""}, true},
		{"prefixed", map[string]string{"example.com/tier": "gold", "a.b.c/x_y.z-1": "V.1_2-3"}, true},
		{"max-name", map[string]string{long[:63]: long[:63]}, true},
		{"long-name", map[string]string{long: "v"}, false},
		{"long-value", map[string]string{"k": long}, false},
		{"empty-key", map[string]string{"": "v"}, false},
		{"bad-key-char", map[string]string{"a b": "v"}, false},
		{"key-dash-start", map[string]string{"-a": "v"}, false},
		{"bad-value-char", map[string]string{"k": "a/b"}, false},
		{"value-dash-end", map[string]string{"k": "a-"}, false},
		{"upper-prefix", map[string]string{"Example.com/x": "v"}, false},
		{"two-slashes", map[string]string{"a/b/c": "v"}, false},
		{"nul", map[string]string{"k\x00": "v"}, false},
		{"reserved", map[string]string{"sandboxd.io/sandbox-id": "sbx_x"}, false},
		{"reserved-sub", map[string]string{"x.sandboxd.io/a": "v"}, false},
		{"reserved-k8s", map[string]string{"app.kubernetes.io/managed-by": "me"}, false},
		{"reserved-k8s-io", map[string]string{"k8s.io/a": "v"}, false},
		{"lookalike-ok", map[string]string{"notsandboxd.io/a": "v"}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := l.CheckLabels(tt.labels)
			if tt.ok && err != nil {
				t.Fatalf("got %v, want accepted", err)
			}
			if !tt.ok {
				e := apierror.From(err)
				if e.Code != apierror.InvalidArgument || e.Details["field"] != "labels" {
					t.Fatalf("got %v (details %v), want INVALID_ARGUMENT on field labels", err, e.Details)
				}
				if len(e.Message) > 600 {
					t.Fatalf("got a %d-byte message, want a bounded one", len(e.Message))
				}
			}
		})
	}
	many := map[string]string{}
	for i := range l.MaxLabels + 1 {
		many["k"+strings.Repeat("x", i%50)+string(rune('a'+i%26))+"-"+string(rune('a'+i/26))] = "v"
	}
	if err := l.CheckLabels(many); apierror.CodeOf(err) != apierror.InvalidArgument {
		t.Fatalf("%d labels: got %v, want INVALID_ARGUMENT", len(many), err)
	}
}

func TestSelector(t *testing.T) {
	l := DefaultLimits()
	for _, tt := range []struct {
		name  string
		terms []string
		want  map[string]string
		ok    bool
	}{
		{"one", []string{"team=ml"}, map[string]string{"team": "ml"}, true},
		{"and", []string{"team=ml", "example.com/tier=gold"}, map[string]string{"team": "ml", "example.com/tier": "gold"}, true},
		{"empty-value", []string{"team="}, map[string]string{"team": ""}, true},
		{"same-twice", []string{"team=ml", "team=ml"}, map[string]string{"team": "ml"}, true},
		{"no-equals", []string{"team"}, nil, false},
		{"conflict", []string{"team=ml", "team=web"}, nil, false},
		{"bad-value", []string{"team=a=b"}, nil, false},
		{"bad-key", []string{"=ml"}, nil, false},
		{"reserved", []string{"sandboxd.io/tenant=t1"}, nil, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var labels []Label
			var err error
			for _, term := range tt.terms {
				var lb Label
				if lb, err = ParseLabelTerm(term); err != nil {
					break
				}
				labels = append(labels, lb)
			}
			var sel map[string]string
			if err == nil {
				sel, err = l.Selector(labels)
			}
			if tt.ok != (err == nil) || (err != nil && apierror.CodeOf(err) != apierror.InvalidArgument) {
				t.Fatalf("got %v, want ok=%v (else INVALID_ARGUMENT)", err, tt.ok)
			}
			if tt.ok && !maps.Equal(sel, tt.want) {
				t.Fatalf("got %v, want %v", sel, tt.want)
			}
		})
	}
	if _, err := l.Selector(make([]Label, l.MaxLabels+1)); apierror.CodeOf(err) != apierror.InvalidArgument {
		t.Fatalf("%d terms: got %v, want INVALID_ARGUMENT", l.MaxLabels+1, err)
	}
}

func TestCreateWithLabels(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	labels := map[string]string{"team": "ml", "example.com/tier": "gold"}
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{Labels: labels})
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(sb.Labels, labels) {
		t.Fatalf("create: got labels %v, want %v", sb.Labels, labels)
	}
	box, err := e.Fake.Get(ctx, sb.ID)
	if err != nil || !maps.Equal(box.Record.Labels, labels) {
		t.Fatalf("the record: got labels %v (%v), want %v", box.Record.Labels, err, labels)
	}
	got, err := e.Svc.Get(ctx, alice, sb.ID)
	if err != nil || !maps.Equal(got.Labels, labels) {
		t.Fatalf("get: got %v (%v), want %v", got.Labels, err, labels)
	}
	// Refused before a slot is taken or a box made.
	for _, bad := range []map[string]string{{"sandboxd.io/sandbox-id": "x"}, {"team": strings.Repeat("v", 64)}} {
		if _, err := e.Svc.Create(ctx, alice, CreateRequest{Labels: bad}); apierror.CodeOf(err) != apierror.InvalidArgument {
			t.Fatalf("create with %v: got %v, want INVALID_ARGUMENT", bad, err)
		}
	}
	if boxes, _ := e.Fake.List(ctx); len(boxes) != 1 {
		t.Fatalf("got %d boxes, want only the first (refused creates make none)", len(boxes))
	}
}

// listAll pages through List with opts and answers every id seen, and the pages' sizes.
func listAll(t *testing.T, e *domaintest.Env, opts ListOptions) (ids []string, pages []int) {
	t.Helper()
	for range 100 {
		page, err := e.Svc.List(context.Background(), alice, opts)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range page.Sandboxes {
			ids = append(ids, s.ID)
		}
		pages = append(pages, len(page.Sandboxes))
		if page.NextCursor == "" {
			return ids, pages
		}
		opts.After = page.NextCursor
	}
	t.Fatal("List never ended")
	return nil, nil
}

// TestListFiltersAcrossPages: label and state filters page correctly: every match once, newest
// first, ANDed; a page that fills exactly at the end of a batch of the index still says that
// another follows (the bug issue 21 found for state filters).
func TestListFiltersAcrossPages(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	// Oldest first: m m m x (newest). With a page of 2, the index is read in batches of 3:
	// the first batch is x m m, which fills the page on its last entry.
	var all, matching []string
	for i := range 4 {
		labels := map[string]string{"team": "ml", "n": string(rune('a' + i))}
		if i == 3 {
			labels["team"] = "web"
		}
		sb, err := e.Svc.Create(ctx, alice, CreateRequest{Labels: labels})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, sb.ID)
		if i < 3 {
			matching = append(matching, sb.ID)
		}
		time.Sleep(2 * time.Millisecond) // distinct ULID times
	}
	slices.Reverse(matching)
	slices.Reverse(all)
	if _, err := e.Svc.Create(ctx, bob, CreateRequest{Labels: map[string]string{"team": "ml"}}); err != nil {
		t.Fatal(err)
	}

	ids, pages := listAll(t, e, ListOptions{Limit: 2, Labels: map[string]string{"team": "ml"}})
	if !slices.Equal(ids, matching) {
		t.Fatalf("team=ml: got %v (pages %v), want %v", ids, pages, matching)
	}
	ids, _ = listAll(t, e, ListOptions{Limit: 1, Labels: map[string]string{"team": "ml", "n": "b"}})
	if !slices.Equal(ids, matching[1:2]) {
		t.Fatalf("team=ml AND n=b: got %v, want %v", ids, matching[1:2])
	}
	if ids, _ = listAll(t, e, ListOptions{Labels: map[string]string{"team": "nobody"}}); len(ids) != 0 {
		t.Fatalf("team=nobody: got %v, want none", ids)
	}
	ids, _ = listAll(t, e, ListOptions{Limit: 3})
	if !slices.Equal(ids, all) {
		t.Fatalf("unfiltered: got %v, want %v", ids, all)
	}

	// The same shape for a state filter: stop the three oldest.
	for _, id := range matching {
		if _, err := e.Svc.Stop(ctx, alice, id); err != nil {
			t.Fatal(err)
		}
	}
	ids, pages = listAll(t, e, ListOptions{Limit: 2, State: Stopped})
	if !slices.Equal(ids, matching) {
		t.Fatalf("state STOPPED: got %v (pages %v), want %v", ids, pages, matching)
	}
	ids, _ = listAll(t, e, ListOptions{Limit: 2, State: Stopped, Labels: map[string]string{"n": "c"}})
	if !slices.Equal(ids, matching[:1]) {
		t.Fatalf("STOPPED AND n=c: got %v, want %v", ids, matching[:1])
	}
	if _, err := e.Svc.List(ctx, alice, ListOptions{Labels: map[string]string{"sandboxd.io/tenant": "t1"}}); apierror.CodeOf(err) != apierror.InvalidArgument {
		t.Fatalf("a reserved filter: got %v, want INVALID_ARGUMENT", err)
	}
}

// TestListScanBound: a filter over more index entries than one call scans (20*limit+1000)
// answers a short page with a cursor, never a false last page; the next call goes on and
// finds the match behind them.
func TestListScanBound(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	target, err := e.Svc.Create(ctx, alice, CreateRequest{Labels: map[string]string{"find": "me"}})
	if err != nil {
		t.Fatal(err)
	}
	// Newer entries that the hint rules out (no box behind them: they are never read).
	for range 1100 {
		if err := e.Store.Put(ctx, store.Entry{ID: NewID("sbx_"), Tenant: alice.Tenant, Project: alice.Project,
			State: string(Running), Labels: map[string]string{"find": "not-me"}}); err != nil {
			t.Fatal(err)
		}
	}
	got, pages := listAll(t, e, ListOptions{Limit: 1, Labels: map[string]string{"find": "me"}})
	if !slices.Equal(got, []string{target.ID}) || len(pages) < 2 || pages[0] != 0 {
		t.Fatalf("got %v in pages %v, want %s after an empty first page", got, pages, target.ID)
	}
}

func TestUpdate(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{Labels: map[string]string{"team": "ml", "old": "x"}})
	if err != nil {
		t.Fatal(err)
	}
	evs, err := domaintest.Events(ctx, e.Svc, alice, sb.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	web := "web"
	got, err := e.Svc.Update(ctx, alice, sb.ID, UpdateRequest{
		Labels:      map[string]*string{"team": &web, "old": nil, "gone": nil},
		AutostopSec: domaintest.Ptr[int64](60), TTLSec: domaintest.Ptr[int64](7200)})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"team": "web"}; !maps.Equal(got.Labels, want) {
		t.Fatalf("labels: got %v, want %v", got.Labels, want)
	}
	if got.AutostopSec != 60 || got.TTLSec != 7200 || !got.ExpiresAt().Equal(sb.CreatedAt.Add(2*time.Hour)) {
		t.Fatalf("got autostop %d ttl %d expires %v, want 60, 7200, created+2h", got.AutostopSec, got.TTLSec, got.ExpiresAt())
	}
	if d := time.Until(got.AutostopAt); d < 55*time.Second || d > 61*time.Second {
		t.Fatalf("got autostop_at in %v, want about 60 s from now (the update is activity)", d)
	}
	box, _ := e.Fake.Get(ctx, sb.ID)
	if !maps.Equal(box.Record.Labels, got.Labels) || box.Record.AutostopSec != 60 || box.Record.TTLSec != 7200 {
		t.Fatalf("the record: got %+v", box.Record)
	}
	select {
	case ev := <-evs:
		if ev.Type != EventUpdated || ev.Reason != "labels,autostop_sec,ttl_sec" || ev.State != Running {
			t.Fatalf("got event %+v, want SANDBOX_UPDATED naming labels,autostop_sec,ttl_sec", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no SANDBOX_UPDATED event")
	}
	// The lookup's hint follows: the old label no longer finds it, the new one does.
	if page, _ := e.Svc.List(ctx, alice, ListOptions{Labels: map[string]string{"team": "ml"}}); len(page.Sandboxes) != 0 {
		t.Fatalf("team=ml after the update: got %d sandboxes, want none", len(page.Sandboxes))
	}
	if page, _ := e.Svc.List(ctx, alice, ListOptions{Labels: map[string]string{"team": "web"}}); len(page.Sandboxes) != 1 {
		t.Fatalf("team=web after the update: got %d sandboxes, want 1", len(page.Sandboxes))
	}
	// Nothing changes: no write, no event; clear removes every label.
	if _, err := e.Svc.Update(ctx, alice, sb.ID, UpdateRequest{Labels: map[string]*string{"team": &web}}); err != nil {
		t.Fatal(err)
	}
	cleared, err := e.Svc.Update(ctx, alice, sb.ID, UpdateRequest{ClearLabels: true})
	if err != nil || len(cleared.Labels) != 0 {
		t.Fatalf("clear: got %v, %v, want no labels", cleared.Labels, err)
	}
	select {
	case ev := <-evs:
		if ev.Reason != "labels" {
			t.Fatalf("got event %+v, want one for the clear only (the no-op update publishes nothing)", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no event for the clear")
	}

	// Refusals (ten seconds after the create, so that a ttl_sec of 5 ended its life).
	e.Clock.Advance(10 * time.Second)
	long := strings.Repeat("x", 64)
	many := map[string]*string{}
	for i := range DefaultLimits().MaxLabels + 1 {
		many["k"+string(rune('a'+i%26))+string(rune('a'+i/26))] = &web
	}
	for name, req := range map[string]UpdateRequest{
		"nothing":       {},
		"reserved":      {Labels: map[string]*string{"sandboxd.io/tenant": &web}},
		"reserved-del":  {Labels: map[string]*string{"kubernetes.io/x": nil}},
		"bad-value":     {Labels: map[string]*string{"team": &long}},
		"too-many":      {Labels: many},
		"autostop-low":  {AutostopSec: domaintest.Ptr[int64](0)},
		"autostop-high": {AutostopSec: domaintest.Ptr[int64](DefaultLimits().AutostopMaxSec + 1)},
		"ttl-high":      {TTLSec: domaintest.Ptr[int64](DefaultLimits().TTLMaxSec + 1)},
		"ttl-past":      {TTLSec: domaintest.Ptr[int64](5)},
	} {
		if _, err := e.Svc.Update(ctx, alice, sb.ID, req); apierror.CodeOf(err) != apierror.InvalidArgument {
			t.Errorf("%s: got %v, want INVALID_ARGUMENT", name, err)
		}
	}
	if box, _ := e.Fake.Get(ctx, sb.ID); box.Record.TTLSec != 7200 || len(box.Record.Labels) != 0 {
		t.Fatalf("a refused update changed the record: %+v", box.Record)
	}
	// Another tenant's sandbox, a malformed id, a destroyed sandbox: NOT_FOUND.
	if _, err := e.Svc.Update(ctx, bob, sb.ID, UpdateRequest{TTLSec: domaintest.Ptr[int64](9000)}); apierror.CodeOf(err) != apierror.NotFound {
		t.Fatalf("bob: got %v, want NOT_FOUND", err)
	}
	if _, err := e.Svc.Update(ctx, alice, "sbx_nope", UpdateRequest{TTLSec: domaintest.Ptr[int64](9000)}); apierror.CodeOf(err) != apierror.NotFound {
		t.Fatalf("malformed id: got %v, want NOT_FOUND", err)
	}
	// A stopped sandbox is updated too.
	if _, err := e.Svc.Stop(ctx, alice, sb.ID); err != nil {
		t.Fatal(err)
	}
	if got, err := e.Svc.Update(ctx, alice, sb.ID, UpdateRequest{AutostopSec: domaintest.Ptr[int64](120)}); err != nil || got.AutostopSec != 120 || got.State != Stopped {
		t.Fatalf("stopped: got %+v, %v", got, err)
	}
	if _, err := e.Svc.Destroy(ctx, alice, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Svc.Update(ctx, alice, sb.ID, UpdateRequest{AutostopSec: domaintest.Ptr[int64](120)}); apierror.CodeOf(err) != apierror.NotFound {
		t.Fatalf("destroyed: got %v, want NOT_FOUND", err)
	}
}

// TestUpdatedAutostopIsHonoured: the reconciler stops a sandbox by its updated autostop_sec.
func TestUpdatedAutostopIsHonoured(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb := e.CreateRunning(t, alice)
	if _, err := e.Svc.Update(ctx, alice, sb.ID, UpdateRequest{AutostopSec: domaintest.Ptr[int64](5)}); err != nil {
		t.Fatal(err)
	}
	e.Clock.Advance(6 * time.Second)
	if err := e.Svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := e.Svc.Get(ctx, alice, sb.ID)
	if err != nil || got.State != Stopped || !strings.Contains(got.StateReason, "after 5 s") {
		t.Fatalf("got %s (%q), %v, want STOPPED after 5 s", got.State, got.StateReason, err)
	}
}

// TestLabelsSurviveAFlush: the labels are the record's; a Redis flush loses only the hint,
// which the rebuild brings back, and the filter finds the sandbox again.
func TestLabelsSurviveAFlush(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{Labels: map[string]string{"team": "ml"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Redis.Client.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	page, err := e.Svc.List(ctx, alice, ListOptions{Labels: map[string]string{"team": "ml"}})
	if err != nil || len(page.Sandboxes) != 1 || page.Sandboxes[0].ID != sb.ID || page.Sandboxes[0].Labels["team"] != "ml" {
		t.Fatalf("after a flush: got %+v, %v, want the sandbox with its labels", page.Sandboxes, err)
	}
}

// TestUpdateDriverErrors: what a failed record write means to the caller: fenced off (another
// replica holds the sandbox now) is INVALID_STATE with Retry-After, a box gone is NOT_FOUND,
// anything else UNAVAILABLE; none of them changes the lookup's labels.
func TestUpdateDriverErrors(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{Labels: map[string]string{"team": "ml"}})
	if err != nil {
		t.Fatal(err)
	}
	web := "web"
	for _, tt := range []struct {
		err   error
		code  apierror.Code
		retry bool
	}{
		{fmt.Errorf("fake: %w", runtime.ErrFenced), apierror.InvalidState, true},
		{fmt.Errorf("fake: %w", runtime.ErrNotFound), apierror.NotFound, false},
		{errors.New("disk on fire"), apierror.Unavailable, false},
	} {
		e.Fake.FailNext("UpdateRecord", tt.err)
		_, err := e.Svc.Update(ctx, alice, sb.ID, UpdateRequest{Labels: map[string]*string{"team": &web}})
		if ae := apierror.From(err); ae.Code != tt.code || (ae.RetryAfter > 0) != tt.retry {
			t.Errorf("%v: got %v (retry after %v), want %s", tt.err, err, ae.RetryAfter, tt.code)
		}
	}
	page, err := e.Svc.List(ctx, alice, ListOptions{Labels: map[string]string{"team": "ml"}})
	if err != nil || len(page.Sandboxes) != 1 {
		t.Fatalf("after failed updates: got %+v, %v, want the sandbox still team=ml", page.Sandboxes, err)
	}
}
