package sandbox

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the lifecycle's Prometheus metrics (exec's are internal/execs'). Labels are
// bounded: never a sandbox id.
type Metrics struct {
	lifecycleSeconds *prometheus.HistogramVec
}

// NewMetrics registers the domain metrics on reg (nil: not registered, for tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		lifecycleSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sandboxd_lifecycle_duration_seconds",
			Help:    "Duration of sandbox lifecycle operations (create, stop, start, destroy, snapshot, checkpoint, restore).",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
		}, []string{"operation", "outcome"}),
	}
	if reg != nil {
		reg.MustRegister(m.lifecycleSeconds)
	}
	return m
}

func (m *Metrics) lifecycle(op, outcome string, d time.Duration) {
	m.lifecycleSeconds.WithLabelValues(op, outcome).Observe(d.Seconds())
}

// StateCollector reports sandboxes by state from the lookup, at scrape time.
type StateCollector struct {
	desc  *prometheus.Desc
	count func(ctx context.Context) (map[string]int, error)
}

// NewStateCollector returns a collector of sandboxes by state; count is called per scrape.
func NewStateCollector(count func(ctx context.Context) (map[string]int, error)) *StateCollector {
	return &StateCollector{
		desc:  prometheus.NewDesc("sandboxd_sandboxes", "Sandboxes known to the runtime, by state.", []string{"state"}, nil),
		count: count,
	}
}

// Describe implements prometheus.Collector.
func (c *StateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *StateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	counts, err := c.count(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	for _, st := range States {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[string(st)]), string(st))
	}
}

// CountByState counts the runtime's boxes by state (for the state collector).
func (s *Service) CountByState(ctx context.Context) (map[string]int, error) {
	boxes, err := s.driver.List(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, b := range boxes {
		st := b.Record.State
		if diedRunning(b) {
			st = string(Failed)
		}
		out[st]++
	}
	return out, nil
}
