package quota

import (
	"context"
	"fmt"
	"testing"
	"time"

	"sandboxd/internal/redistest"
)

// BenchmarkAcquireRelease takes and gives back one slot per iteration on a real redis-server
// (and, for comparison, the embedded one), reporting each half separately.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, backend := range []struct {
		name  string
		start func(testing.TB) *redistest.Server
	}{
		{"redis-server", redistest.Start},
		{"embedded", redistest.Embedded},
	} {
		b.Run(backend.name, func(b *testing.B) {
			srv := backend.start(b)
			ctx := context.Background()
			q := New(srv.Client, newTruth().source, Options{Limits: Limits{Default: 10}, Settle: -1})
			if _, err := q.Usage(ctx, "t", "p"); err != nil {
				b.Fatal(err)
			}
			var acq, rel time.Duration
			i := 0
			for b.Loop() {
				id := fmt.Sprint("sbx_", i)
				i++
				t0 := time.Now()
				if _, err := q.Acquire(ctx, "t", "p", id); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := q.Release(ctx, "t", "p", id); err != nil {
					b.Fatal(err)
				}
				acq += t1.Sub(t0)
				rel += time.Since(t1)
			}
			b.ReportMetric(float64(acq.Microseconds())/float64(b.N), "acquire-µs/op")
			b.ReportMetric(float64(rel.Microseconds())/float64(b.N), "release-µs/op")
		})
	}
}
