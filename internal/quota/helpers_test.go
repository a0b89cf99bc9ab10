package quota

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"sandboxd/internal/apierror"
)

// truth is the runtime's record of slot holders, as a test keeps it.
type truth struct {
	mu      sync.Mutex
	ids     map[string]bool
	max     int
	calls   atomic.Int64
	failErr error
}

func newTruth(ids ...string) *truth {
	tr := &truth{ids: map[string]bool{}}
	for _, id := range ids {
		tr.ids[id] = true
	}
	return tr
}

// add records id as a holder and returns the number of holders.
func (tr *truth) add(id string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.ids[id] = true
	tr.max = max(tr.max, len(tr.ids))
	return len(tr.ids)
}

func (tr *truth) remove(id string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	delete(tr.ids, id)
}

func (tr *truth) source(_ context.Context, _, _ string) ([]string, error) {
	tr.calls.Add(1)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.failErr != nil {
		return nil, tr.failErr
	}
	out := make([]string, 0, len(tr.ids))
	for id := range tr.ids {
		out = append(out, id)
	}
	return out, nil
}

func wantExceeded(t *testing.T, err error, limit, inUse int) {
	t.Helper()
	var ae *apierror.Error
	if !errors.As(err, &ae) || ae.Code != apierror.QuotaExceeded {
		t.Fatalf("got %v, want QUOTA_EXCEEDED", err)
	}
	if ae.RetryAfter <= 0 {
		t.Fatalf("RetryAfter: got %v, want > 0", ae.RetryAfter)
	}
	if ae.Details["limit"] != limit || ae.Details["in_use"] != inUse {
		t.Fatalf("details: got %v, want limit=%d in_use=%d", ae.Details, limit, inUse)
	}
}
