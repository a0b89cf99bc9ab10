package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestSummarizeValues(t *testing.T) {
	in := []float64{14, 12, 13, 20}
	got := summarizeValues(in)
	want := ValueStats{N: 4, Median: 13.5, P99: 20, Min: 12, Max: 20, Mean: 14.75}
	if got != want {
		t.Errorf("summarizeValues(%v) = %+v, want %+v", in, got, want)
	}
	if !slices.Equal(in, []float64{14, 12, 13, 20}) {
		t.Errorf("summarizeValues reordered its input: %v", in)
	}
	if got := summarizeValues(nil); got != (ValueStats{}) {
		t.Errorf("summarizeValues(nil) = %+v, want zero", got)
	}
}

func TestParseClients(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
		err  bool
	}{
		{"1,8,32", []int{1, 8, 32}, false},
		{" 4 , 4,2,", []int{4, 2}, false},
		{"", nil, true},
		{"0", nil, true},
		{"1,x", nil, true},
		{"-3", nil, true},
	} {
		got, err := parseClients(tc.in)
		if (err != nil) != tc.err || !slices.Equal(got, tc.want) {
			t.Errorf("parseClients(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestFmtValueAndRate(t *testing.T) {
	for _, tc := range []struct {
		v    float64
		unit string
		want string
	}{
		{13.456, "MiB", "13.5 MiB"},
		{2.345, "goroutines", "2.35 goroutines"},
		{2, "goroutines", "2 goroutines"},
		{0, "goroutines", "0 goroutines"},
		{-0.5, "MiB", "-0.50 MiB"},
		{123.4, "", "123"},
	} {
		if got := fmtValue(tc.v, tc.unit); got != tc.want {
			t.Errorf("fmtValue(%v, %q) = %q, want %q", tc.v, tc.unit, got, tc.want)
		}
	}
	for _, tc := range []struct {
		v    float64
		want string
	}{
		{0, "0 req/s"},
		{999.6, "1,000 req/s"},
		{1234567, "1,234,567 req/s"},
		{-1234, "-1,234 req/s"},
		{123, "123 req/s"},
	} {
		if got := fmtRate(tc.v, "req/s"); got != tc.want {
			t.Errorf("fmtRate(%v) = %q, want %q", tc.v, got, tc.want)
		}
	}
}

func TestFinishUnitsAndRates(t *testing.T) {
	g := &Group{Name: "mixed"}
	lat := g.result("GET", false)
	lat.Rate, lat.RateUnit = 500, "req/s"
	for _, d := range msd(4, 6) {
		lat.add(d)
	}
	floor := g.result("healthz", true)
	floor.Rate = 2000
	for _, d := range msd(1, 1) {
		floor.add(d)
	}
	sub := g.valueResult("subscription", "MiB", false)
	sub.addValue(30)
	conn := g.valueResult("connection", "MiB", true)
	conn.addValue(20)
	gor := g.valueResult("goroutines", "goroutines", false)
	gor.addValue(3)
	g.finish()
	if lat.Ratio != 5 || lat.RateRatio != 0.25 {
		t.Errorf("GET ratio %v, rate ratio %v; want 5 (5 ms / 1 ms) and 0.25 (500 / 2000)", lat.Ratio, lat.RateRatio)
	}
	if sub.Ratio != 1.5 {
		t.Errorf("MiB ratio = %v, want 1.5 (to the bare MiB result, not the duration one)", sub.Ratio)
	}
	if gor.Ratio != 0 {
		t.Errorf("goroutines ratio = %v, want 0: no bare result in goroutines", gor.Ratio)
	}
	if floor.Ratio != 0 || conn.Ratio != 0 {
		t.Errorf("bare ratios = %v, %v; want 0", floor.Ratio, conn.Ratio)
	}
}

func valueReport() *Report {
	g := &Group{Name: "reads, 8 clients"}
	get := g.result("REST GET …/{id}", false)
	get.Rate, get.RateUnit = 1500, "req/s"
	for _, d := range msd(4, 5, 6) {
		get.add(d)
	}
	h := g.result("GET /healthz", true)
	h.Rate, h.RateUnit = 6000, "req/s"
	for _, d := range msd(1, 1.2, 1.1) {
		h.add(d)
	}
	g2 := &Group{Name: "memory per idle sandbox"}
	pss := g2.valueResult("PSS", "MiB", false)
	for _, v := range []float64{13.2, 13.6, 14.1} {
		pss.addValue(v)
	}
	g3 := &Group{Name: "stdout throughput"}
	g3.result("subscription", false).NotMeasured = "needs execOutput (issue 3)"
	for _, g := range []*Group{g, g2, g3} {
		g.finish()
	}
	r := sampleReport()
	r.Groups = []*Group{g, g2, g3}
	return r
}

func TestMarkdownValuesAndRates(t *testing.T) {
	var buf bytes.Buffer
	if err := writeMarkdown(&buf, valueReport()); err != nil {
		t.Fatal(err)
	}
	want := "| benchmark | path | n | median | p99 | throughput | ours/bare |\n" +
		"| --- | --- | ---: | ---: | ---: | ---: | ---: |\n" +
		"| reads, 8 clients | REST GET …/{id} | 3 | 5.00 ms | 6.00 ms | 1,500 req/s (0.25×) | 4.55× |\n" +
		"| reads, 8 clients | GET /healthz | 3 | 1.10 ms | 1.20 ms | 6,000 req/s | (bare) |\n" +
		"| memory per idle sandbox | PSS | 3 | 13.6 MiB | 14.1 MiB | — | — |\n" +
		"| stdout throughput | subscription | — | — | — | — | not measured: needs execOutput (issue 3) |\n"
	if got := buf.String(); !strings.Contains(got, want) {
		t.Errorf("got Markdown:\n%s\nwant it to hold:\n%s", got, want)
	}
}

func TestJSONValuesAndRates(t *testing.T) {
	var buf bytes.Buffer
	if err := writeJSON(&buf, valueReport()); err != nil {
		t.Fatal(err)
	}
	var got jsonReport
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("decoding %s: %v", buf.String(), err)
	}
	get := got.Groups[0].Results[0]
	if get.RatePerSec != 1500 || get.RateUnit != "req/s" || get.RateRatioToBare == nil || *get.RateRatioToBare != 0.25 || get.Values != nil {
		t.Errorf("got GET result %+v, want rate 1500 req/s, rate ratio 0.25, no values", get)
	}
	pss := got.Groups[1].Results[0]
	if pss.Values == nil || pss.Values.Unit != "MiB" || pss.Values.Median != 13.6 || pss.Values.N != 3 || pss.N != 3 || pss.MedianMs != 0 {
		t.Errorf("got PSS result %+v (values %+v), want MiB values, median 13.6, n 3, no median_ms", pss, pss.Values)
	}
	if nm := got.Groups[2].Results[0].NotMeasured; nm != "needs execOutput (issue 3)" {
		t.Errorf("got not_measured %q, want the reason", nm)
	}
}

func TestLoad(t *testing.T) {
	var calls atomic.Int64
	res, err := load(context.Background(), 4, 50*time.Millisecond, func(ctx context.Context) error {
		calls.Add(1)
		time.Sleep(time.Millisecond)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := int64(len(res.Latencies)); n == 0 || n != calls.Load() {
		t.Errorf("got %d latencies for %d calls, want one per call and some", n, calls.Load())
	}
	if res.Elapsed < 50*time.Millisecond {
		t.Errorf("elapsed %v, want at least the 50ms duration", res.Elapsed)
	}
	boom := errors.New("boom")
	var n atomic.Int64
	_, err = load(context.Background(), 3, time.Minute, func(ctx context.Context) error {
		if n.Add(1) == 5 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Errorf("load error = %v, want %v (and stop before the minute)", err, boom)
	}
}

func TestInterleaveLoad(t *testing.T) {
	var order []string
	var mu sync.Mutex
	step := func(label string, pause time.Duration) *rateStep {
		return &rateStep{res: &Result{Label: label}, op: func(ctx context.Context) error {
			mu.Lock()
			if len(order) == 0 || order[len(order)-1] != label {
				order = append(order, label)
			}
			mu.Unlock()
			time.Sleep(pause)
			return nil
		}}
	}
	fast, slow := step("fast", time.Millisecond), step("slow", 5*time.Millisecond)
	if err := interleaveLoad(context.Background(), "test", 2, 2, 30*time.Millisecond, 0, []*rateStep{fast, slow}); err != nil {
		t.Fatal(err)
	}
	// Round 1 runs fast then slow, round 2 slow then fast (consecutive runs of one path merged).
	if want := []string{"fast", "slow", "fast"}; !slices.Equal(order, want) {
		t.Errorf("slices ran in order %v, want %v (the first path rotating)", order, want)
	}
	if fast.res.Rate <= slow.res.Rate || slow.res.Rate <= 0 {
		t.Errorf("rates fast %v, slow %v; want both > 0 and fast > slow", fast.res.Rate, slow.res.Rate)
	}
	if len(fast.res.Samples) != fast.calls {
		t.Errorf("%d samples for %d calls", len(fast.res.Samples), fast.calls)
	}
}
