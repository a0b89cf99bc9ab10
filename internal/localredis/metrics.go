package localredis

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	upDesc = prometheus.NewDesc("sandboxd_redis_up",
		"1 while the embedded redis-server runs and answers, else 0.", nil, nil)
	restartsDesc = prometheus.NewDesc("sandboxd_redis_restarts_total",
		"Times the embedded redis-server exited (or failed to start) and was started again.", nil, nil)
	usedDesc = prometheus.NewDesc("sandboxd_redis_used_memory_bytes",
		"The embedded redis-server's used_memory (INFO memory).", nil, nil)
	maxDesc = prometheus.NewDesc("sandboxd_redis_maxmemory_bytes",
		"The embedded redis-server's maxmemory: writes beyond it fail (noeviction).", nil, nil)
)

// Collector returns the embedded Redis's metrics: sandboxd_redis_up, _restarts_total,
// _used_memory_bytes and _maxmemory_bytes (the last two read with INFO memory at each scrape,
// omitted when it does not answer within a second).
func (s *Server) Collector() prometheus.Collector { return collector{s} }

type collector struct{ s *Server }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- upDesc
	ch <- restartsDesc
	ch <- usedDesc
	ch <- maxDesc
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	up := 0.0
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := c.s.client.Info(ctx, "memory").Result()
	if err == nil && c.s.Up() {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, up)
	ch <- prometheus.MustNewConstMetric(restartsDesc, prometheus.CounterValue, float64(c.s.Restarts()))
	if err != nil {
		return
	}
	fields := infoFields(info)
	if v, ok := fields["used_memory"]; ok {
		ch <- prometheus.MustNewConstMetric(usedDesc, prometheus.GaugeValue, v)
	}
	if v, ok := fields["maxmemory"]; ok {
		ch <- prometheus.MustNewConstMetric(maxDesc, prometheus.GaugeValue, v)
	}
}

// infoFields reads the numeric "name:value" lines of an INFO answer.
func infoFields(info string) map[string]float64 {
	out := map[string]float64{}
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			out[k] = f
		}
	}
	return out
}
