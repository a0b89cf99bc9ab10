package apierror_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"sandboxd/internal/apierror"
	"sandboxd/internal/redistest"
)

// TestFromRedisFull: a write a real redis-server refuses at its maxmemory (noeviction) is
// UNAVAILABLE with reason store_full and a Retry-After, also when wrapped; Redis's other
// refusals stay INTERNAL.
func TestFromRedisFull(t *testing.T) {
	rs := redistest.Start(t)
	ctx := context.Background()
	rdb := rs.Client
	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	err := rdb.Set(ctx, "k", "v", 0).Err()
	if err == nil {
		t.Fatal("a write past maxmemory succeeded")
	}
	for _, e := range []error{err, fmt.Errorf("append exec output: %w", err)} {
		ae := apierror.From(e)
		if ae.Code != apierror.Unavailable || ae.Details["reason"] != "store_full" || ae.RetryAfter <= 0 || ae.Code.HTTPStatus() != 503 {
			t.Errorf("From(%v): %+v, want UNAVAILABLE store_full with a Retry-After", e, ae)
		}
	}
	if ae := apierror.Wrap(err, apierror.Unavailable, "the sandbox store is unavailable"); ae.Details["reason"] != "store_full" ||
		ae.RetryAfter <= 0 || !strings.Contains(ae.Message, "maxmemory") {
		t.Errorf("Wrap as UNAVAILABLE: %+v, want it to say the store is full", ae)
	}
	if ae := apierror.Wrap(err, apierror.Internal, "x"); ae.Details["reason"] != nil {
		t.Errorf("Wrap as INTERNAL: %+v, want no reason added", ae)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("after maxmemory is lifted: %v", err)
	}
	other := rdb.Incr(ctx, "k").Err() // "ERR value is not an integer"
	if other == nil || apierror.CodeOf(other) != apierror.Internal {
		t.Errorf("another refusal (%v): %v, want INTERNAL", other, apierror.CodeOf(other))
	}
}
