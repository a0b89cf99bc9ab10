package execs

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are exec's Prometheus metrics. Labels are bounded: never a sandbox or exec id.
type Metrics struct {
	execSeconds *prometheus.HistogramVec
	// outputLive and outputRedis count the output events subscribers got from this replica's
	// live window and from Redis.
	outputLive, outputRedis prometheus.Counter
	// logReopens counts the guest logs this replica's followers opened again (after a break, or
	// to take an exec over).
	logReopens prometheus.Counter
}

// NewMetrics registers exec's metrics on reg (nil: not registered, for tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		execSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sandboxd_exec_duration_seconds",
			Help:    "Duration of synchronous execs, from request to collected result.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5, 30, 120, 600},
		}, []string{"outcome"}),
	}
	events := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sandboxd_exec_output_events_total",
		Help: "Exec output events sent to subscribers, by where they were read: live (this replica follows the exec and fed them from memory) or redis.",
	}, []string{"source"})
	m.outputLive, m.outputRedis = events.WithLabelValues("live"), events.WithLabelValues("redis")
	m.logReopens = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sandboxd_exec_log_reopens_total",
		Help: "Guest exec logs this replica's followers opened again: after they broke (the sandbox's attach went away, the log read back corrupt) or to take over another replica's exec.",
	})
	if reg != nil {
		reg.MustRegister(m.execSeconds, events, m.logReopens)
	}
	return m
}

func (m *Metrics) observe(outcome string, d time.Duration) {
	m.execSeconds.WithLabelValues(outcome).Observe(d.Seconds())
}
