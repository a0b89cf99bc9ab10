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
	// The reconciler's passes: how long each took, and when one last completed (its lag).
	reconcileSeconds *prometheus.HistogramVec
	reconcileLast    prometheus.Gauge
	// Quota: creates and starts refused for a full tenant:project, and how full the fullest
	// one and how many are at their limit, by runtime truth as of the last pass.
	quotaRejections prometheus.Counter
	quotaMaxRatio   prometheus.Gauge
	quotaSaturated  prometheus.Gauge
	// Warm pools (pool.go), by profile.
	poolBoxes     *prometheus.GaugeVec
	poolTarget    *prometheus.GaugeVec
	poolClaims    *prometheus.CounterVec
	poolFillTimes *prometheus.HistogramVec
	poolClaimTime *prometheus.HistogramVec
}

// NewMetrics registers the domain metrics on reg (nil: not registered, for tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		lifecycleSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sandboxd_lifecycle_duration_seconds",
			Help:    "Duration of sandbox lifecycle operations (create, stop, start, destroy, snapshot, checkpoint, restore).",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
		}, []string{"operation", "outcome"}),
		reconcileSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sandboxd_reconcile_duration_seconds",
			Help:    "Duration of reconcile passes over every sandbox, by outcome (ok or error).",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"outcome"}),
		reconcileLast: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sandboxd_reconcile_last_success_timestamp_seconds",
			Help: "Unix time at which this replica's last reconcile pass completed without error.",
		}),
		quotaRejections: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandboxd_quota_rejections_total",
			Help: "Creates and starts refused because their tenant:project had no free concurrency slot (429).",
		}),
		quotaMaxRatio: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sandboxd_quota_max_utilization_ratio",
			Help: "Slots held over the limit of the fullest limited tenant:project, at the last reconcile pass (1 = full).",
		}),
		quotaSaturated: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sandboxd_quota_saturated_projects",
			Help: "Limited tenant:projects holding all their concurrency slots, at the last reconcile pass.",
		}),
		poolBoxes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sandboxd_warm_pool_boxes",
			Help: "Boxes of a profile's warm pool on this replica's runtime state, by state (ready: claimable; filling: booting).",
		}, []string{"profile", "state"}),
		poolTarget: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sandboxd_warm_pool_target",
			Help: "A profile's warm_pool: the ready boxes this replica keeps.",
		}, []string{"profile"}),
		poolClaims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandboxd_warm_pool_claims_total",
			Help: "Creates of a profile with a warm pool, by result: hit (a warm box), miss (none ready: created cold), cold_source or cold_network (the create asked for what a pool box cannot take).",
		}, []string{"profile", "result"}),
		poolFillTimes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sandboxd_warm_pool_fill_duration_seconds",
			Help:    "Duration of booting one box of a warm pool, by outcome.",
			Buckets: []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"profile", "outcome"}),
		poolClaimTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sandboxd_warm_pool_claim_duration_seconds",
			Help:    "Duration of a create served by a warm pool box (a hit), from the request's checks to RUNNING.",
			Buckets: []float64{.001, .0025, .005, .01, .015, .02, .03, .05, .1, .25, .5, 1},
		}, []string{"profile"}),
	}
	if reg != nil {
		reg.MustRegister(m.poolBoxes, m.poolTarget, m.poolClaims, m.poolFillTimes, m.poolClaimTime)
		reg.MustRegister(m.lifecycleSeconds, m.reconcileSeconds, m.reconcileLast, m.quotaRejections, m.quotaMaxRatio, m.quotaSaturated)
	}
	return m
}

// reconciled records a pass that ended at end after d, with err.
func (m *Metrics) reconciled(end time.Time, d time.Duration, err error) {
	m.reconcileSeconds.WithLabelValues(outcome(err)).Observe(d.Seconds())
	if err == nil {
		m.reconcileLast.Set(float64(end.UnixNano()) / 1e9)
	}
}

// quotaUse records how full the limited tenant:projects are: each one's slots held and limit.
func (m *Metrics) quotaUse(use []quotaUse) {
	ratio, saturated := 0.0, 0
	for _, u := range use {
		if u.limit <= 0 {
			continue
		}
		ratio = max(ratio, float64(u.held)/float64(u.limit))
		if u.held >= u.limit {
			saturated++
		}
	}
	m.quotaMaxRatio.Set(ratio)
	m.quotaSaturated.Set(float64(saturated))
}

// quotaUse is one tenant:project's slots held and limit (0: unlimited).
type quotaUse struct{ held, limit int }

// poolSize records a warm pool's target and its ready and filling boxes.
func (m *Metrics) poolSize(profile string, target, ready, filling int) {
	m.poolTarget.WithLabelValues(profile).Set(float64(target))
	m.poolBoxes.WithLabelValues(profile, "ready").Set(float64(ready))
	m.poolBoxes.WithLabelValues(profile, "filling").Set(float64(filling))
}

// poolClaim counts a create of a pooled profile by result.
func (m *Metrics) poolClaim(profile, result string) {
	m.poolClaims.WithLabelValues(profile, result).Inc()
}

// poolClaimed records the duration of a create served by a warm box.
func (m *Metrics) poolClaimed(profile string, d time.Duration) {
	m.poolClaimTime.WithLabelValues(profile).Observe(d.Seconds())
}

// poolFilled records one fill of a warm pool.
func (m *Metrics) poolFilled(profile, outcome string, d time.Duration) {
	m.poolFillTimes.WithLabelValues(profile, outcome).Observe(d.Seconds())
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
