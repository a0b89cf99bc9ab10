package sandbox_test

import (
	"context"
	"testing"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/domain"
	"sandboxd/internal/domain/domaintest"
	. "sandboxd/internal/sandbox"
	"sandboxd/internal/store"
)

// The read cache against the whole domain: reads after writes on the same replica and on
// another, tenancy on cached boxes, a destroy on another replica.
func TestReadCache(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	a, b := e.Svc, e.Replica(t)
	sb, err := a.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// Both replicas have read it: it is in both caches.
	if _, err := a.Get(ctx, alice, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Get(ctx, alice, sb.ID); err != nil {
		t.Fatal(err)
	}

	t.Run("another-tenant-is-not-found-while-cached", func(t *testing.T) {
		for name, svc := range map[string]*domain.Service{"a": a, "b": b} {
			if _, err := svc.Get(ctx, bob, sb.ID); apierror.CodeOf(err) != apierror.NotFound {
				t.Fatalf("replica %s: bob's get of alice's cached sandbox: got %v, want NOT_FOUND", name, err)
			}
			page, err := svc.List(ctx, bob, ListOptions{})
			if err != nil || len(page.Sandboxes) != 0 {
				t.Fatalf("replica %s: bob's list: got %d sandboxes %v, want none", name, len(page.Sandboxes), err)
			}
		}
	})

	t.Run("read-after-write-same-replica", func(t *testing.T) {
		v := "one"
		if _, err := a.Update(ctx, alice, sb.ID, UpdateRequest{Labels: map[string]*string{"k": &v}}); err != nil {
			t.Fatal(err)
		}
		got, err := a.Get(ctx, alice, sb.ID)
		if err != nil || got.Labels["k"] != "one" {
			t.Fatalf("get on the writing replica: got labels %v %v, want k=one at once", got.Labels, err)
		}
		page, err := a.List(ctx, alice, ListOptions{})
		if err != nil || len(page.Sandboxes) != 1 || page.Sandboxes[0].Labels["k"] != "one" {
			t.Fatalf("list on the writing replica: got %+v %v, want k=one at once", page.Sandboxes, err)
		}
	})

	t.Run("another-replica-sees-the-write", func(t *testing.T) {
		v := "two"
		if _, err := a.Update(ctx, alice, sb.ID, UpdateRequest{Labels: map[string]*string{"k": &v}}); err != nil {
			t.Fatal(err)
		}
		// The change notice reaches b well within the cache's age bound.
		start := time.Now()
		for {
			got, err := b.Get(ctx, alice, sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.Labels["k"] == "two" {
				break
			}
			if time.Since(start) > DefaultReadCacheTTL+500*time.Millisecond {
				t.Fatalf("replica b still sees k=%q %v after the write", got.Labels["k"], time.Since(start))
			}
			time.Sleep(5 * time.Millisecond)
		}
	})

	t.Run("stop-on-another-replica", func(t *testing.T) {
		if _, err := a.Stop(ctx, alice, sb.ID); err != nil {
			t.Fatal(err)
		}
		waitState(t, b, sb.ID, Stopped)
	})

	t.Run("destroy-on-another-replica", func(t *testing.T) {
		if _, err := a.Destroy(ctx, alice, sb.ID); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		for {
			_, err := b.Get(ctx, alice, sb.ID)
			if apierror.CodeOf(err) == apierror.NotFound {
				break
			}
			if time.Since(start) > DefaultReadCacheTTL+500*time.Millisecond {
				t.Fatalf("replica b still finds the destroyed sandbox after %v: %v", time.Since(start), err)
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
}

func waitState(t *testing.T, svc *domain.Service, id string, want State) {
	t.Helper()
	start := time.Now()
	for {
		got, err := svc.Get(context.Background(), alice, id)
		if err == nil && got.State == want {
			return
		}
		if time.Since(start) > DefaultReadCacheTTL+500*time.Millisecond {
			t.Fatalf("still %s %v after %v, want %s", got.State, err, time.Since(start), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Lists never show another tenant's sandbox, on either replica, while every record is cached,
// and not even when the lookup names the wrong owner: the record decides.
func TestListTenancyWhileCached(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{Limit: 8})
	ctx := context.Background()
	a, b := e.Svc, e.Replica(t)
	mine := map[string]map[string]bool{alice.Tenant: {}, bob.Tenant: {}}
	for i := range 5 {
		who := alice
		if i%2 == 1 {
			who = bob
		}
		sb, err := a.Create(ctx, who, CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		mine[who.Tenant][sb.ID] = true
	}
	check := func(step string) {
		t.Helper()
		for name, svc := range map[string]*domain.Service{"a": a, "b": b} {
			for _, who := range []auth.Principal{alice, bob} {
				for _, limit := range []int{1, 50} {
					seen := 0
					for cursor := ""; ; {
						page, err := svc.List(ctx, who, ListOptions{Limit: limit, After: cursor})
						if err != nil {
							t.Fatalf("%s: replica %s: %s's list: %v", step, name, who.Tenant, err)
						}
						for _, sb := range page.Sandboxes {
							if !mine[who.Tenant][sb.ID] {
								t.Fatalf("%s: replica %s: %s's list (pages of %d) holds %s, which is not theirs", step, name, who.Tenant, limit, sb.ID)
							}
							seen++
						}
						if cursor = page.NextCursor; cursor == "" {
							break
						}
					}
					if seen != len(mine[who.Tenant]) {
						t.Fatalf("%s: replica %s: %s's list (pages of %d): got %d sandboxes, want %d", step, name, who.Tenant, limit, seen, len(mine[who.Tenant]))
					}
				}
			}
		}
	}
	check("first-lists") // every record is now in both replicas' caches
	check("cached")
	// A lookup that names the wrong owner (a stale or damaged entry): bob's lists and gets of
	// alice's sandbox still find nothing, cached or not.
	var victim string
	for id := range mine[alice.Tenant] {
		victim = id
	}
	if err := e.Store.Put(ctx, store.Entry{ID: victim, Tenant: bob.Tenant, Project: bob.Project, State: string(Running), CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	for name, svc := range map[string]*domain.Service{"a": a, "b": b} {
		page, err := svc.List(ctx, bob, ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range page.Sandboxes {
			if sb.ID == victim {
				t.Fatalf("replica %s: bob's list holds alice's %s through a lookup that names bob", name, victim)
			}
		}
		if _, err := svc.Get(ctx, bob, victim); apierror.CodeOf(err) != apierror.NotFound {
			t.Fatalf("replica %s: bob's get of alice's %s with a lookup naming bob: got %v, want NOT_FOUND", name, victim, err)
		}
	}
}

// TestLoadRefusalDoesNotWaitForTheRuntime: on a cache miss the lookup and the runtime's record
// are read at once, and a lookup that refuses the caller answers without waiting for the
// runtime's read: another tenant's NOT_FOUND comes as fast for a sandbox that exists as for
// one that does not (here: while the runtime's reads are held), and the owner's read waits
// for the runtime as before.
func TestLoadRefusalDoesNotWaitForTheRuntime(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	ctx := context.Background()
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	b := e.Replica(t) // nothing in its cache
	release := e.Fake.HoldGets()
	defer release()
	done := make(chan error, 1)
	go func() {
		_, err := b.Get(ctx, bob, sb.ID)
		done <- err
	}()
	select {
	case err := <-done:
		if apierror.CodeOf(err) != apierror.NotFound {
			t.Fatalf("bob's get of alice's sandbox: got %v, want NOT_FOUND", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("bob's get of alice's sandbox waited for the runtime's read of it")
	}
	owner := make(chan error, 1)
	go func() {
		_, err := b.Get(ctx, alice, sb.ID)
		owner <- err
	}()
	select {
	case err := <-owner:
		t.Fatalf("alice's get answered (%v) while the runtime's reads were held", err)
	case <-time.After(100 * time.Millisecond):
	}
	release()
	if err := <-owner; err != nil {
		t.Fatalf("alice's get once the runtime answered: %v", err)
	}
}
