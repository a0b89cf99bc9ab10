package sandbox

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The quota gauges: the fullest limited project's ratio and how many are full; unlimited
// projects count for neither.
func TestQuotaUseMetrics(t *testing.T) {
	tests := []struct {
		name      string
		use       []quotaUse
		ratio     float64
		saturated float64
	}{
		{"none", nil, 0, 0},
		{"unlimited", []quotaUse{{held: 50, limit: 0}}, 0, 0},
		{"half", []quotaUse{{held: 2, limit: 4}, {held: 1, limit: 10}}, 0.5, 0},
		{"full", []quotaUse{{held: 4, limit: 4}, {held: 3, limit: 3}, {held: 1, limit: 2}}, 1, 2},
		// a project holding more than its limit (a limit lowered under it) is saturated
		{"over", []quotaUse{{held: 6, limit: 4}}, 1.5, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := NewMetrics(prometheus.NewRegistry())
			m.quotaUse(tt.use)
			if got := testutil.ToFloat64(m.quotaMaxRatio); got != tt.ratio {
				t.Errorf("max ratio: got %v, want %v", got, tt.ratio)
			}
			if got := testutil.ToFloat64(m.quotaSaturated); got != tt.saturated {
				t.Errorf("saturated: got %v, want %v", got, tt.saturated)
			}
		})
	}
}

// A failed pass is counted but does not move the last success.
func TestReconcileMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	t0 := time.Unix(1700000000, 500e6)
	m.reconciled(t0, 30*time.Millisecond, nil)
	m.reconciled(t0.Add(time.Minute), time.Second, errors.New("listing the runtime: boom"))
	if got := testutil.ToFloat64(m.reconcileLast); got != 1700000000.5 {
		t.Errorf("last success: got %v, want 1700000000.5 (the failed pass after it does not count)", got)
	}
	n, err := testutil.GatherAndCount(reg, "sandboxd_reconcile_duration_seconds")
	if err != nil || n != 2 {
		t.Errorf("reconcile duration series: got %d, %v; want 2 (ok and error)", n, err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`# HELP sandboxd_quota_rejections_total Creates and starts refused because their tenant:project had no free concurrency slot (429).
# TYPE sandboxd_quota_rejections_total counter
sandboxd_quota_rejections_total 0
`), "sandboxd_quota_rejections_total"); err != nil {
		t.Error(err)
	}
}
