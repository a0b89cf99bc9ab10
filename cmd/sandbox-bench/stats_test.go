package main

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
)

func msd(v ...float64) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x * float64(time.Millisecond))
	}
	return out
}

func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		name    string
		samples []time.Duration
		want    Stats
	}{
		{"empty", nil, Stats{}},
		{"one", msd(7), Stats{N: 1, Median: 7 * time.Millisecond, P99: 7 * time.Millisecond, Min: 7 * time.Millisecond, Max: 7 * time.Millisecond, Mean: 7 * time.Millisecond}},
		{"odd, unsorted", msd(5, 1, 3), Stats{N: 3, Median: 3 * time.Millisecond, P99: 5 * time.Millisecond, Min: time.Millisecond, Max: 5 * time.Millisecond, Mean: 3 * time.Millisecond}},
		{"even: mean of the middle two", msd(4, 1, 2, 10), Stats{N: 4, Median: 3 * time.Millisecond, P99: 10 * time.Millisecond, Min: time.Millisecond, Max: 10 * time.Millisecond, Mean: 4250 * time.Microsecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]time.Duration(nil), tc.samples...)
			if got := summarize(tc.samples); got != tc.want {
				t.Errorf("summarize(%v) = %+v, want %+v", tc.samples, got, tc.want)
			}
			for i := range in {
				if in[i] != tc.samples[i] {
					t.Fatalf("summarize reordered its input: %v, was %v", tc.samples, in)
				}
			}
		})
	}
}

func TestPercentileNearestRank(t *testing.T) {
	// 1..200 ms: the 99th percentile by nearest rank is the 198th value.
	var s []time.Duration
	for i := 1; i <= 200; i++ {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	if got := percentile(s, 99); got != 198*time.Millisecond {
		t.Errorf("p99 of 1..200 ms = %v, want 198ms", got)
	}
	if got := percentile(s, 50); got != 100*time.Millisecond {
		t.Errorf("p50 of 1..200 ms = %v, want 100ms", got)
	}
	// Below 100 samples the p99 is the maximum.
	if got := summarize(msd(1, 2, 3, 50)).P99; got != 50*time.Millisecond {
		t.Errorf("p99 of 4 samples = %v, want the maximum 50ms", got)
	}
}

func TestRatio(t *testing.T) {
	ours := summarize(msd(30, 31, 32))
	bare := summarize(msd(20, 21, 22))
	if got, want := ratio(ours, bare), 31.0/21.0; math.Abs(got-want) > 1e-9 {
		t.Errorf("ratio = %v, want %v", got, want)
	}
	if got := ratio(ours, Stats{}); got != 0 {
		t.Errorf("ratio without a bare sample = %v, want 0", got)
	}
	if got := ratio(Stats{}, bare); got != 0 {
		t.Errorf("ratio without our sample = %v, want 0", got)
	}
}

func TestGroupFinish(t *testing.T) {
	g := &Group{Name: "exec `true`"}
	bare := g.result("bare runsc exec", true)
	rest := g.result("REST", false)
	for _, d := range msd(10, 12, 11) {
		bare.add(d)
	}
	for _, d := range msd(30, 33, 36) {
		rest.add(d)
	}
	g.finish()
	if rest.Ratio != 3 {
		t.Errorf("REST ratio = %v, want 3 (33 ms / 11 ms)", rest.Ratio)
	}
	if bare.Ratio != 0 {
		t.Errorf("bare ratio = %v, want 0", bare.Ratio)
	}
}

func TestFmtDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		450 * time.Microsecond:     "450 µs",
		2345 * time.Microsecond:    "2.35 ms",
		23456 * time.Microsecond:   "23.5 ms",
		1234567 * time.Microsecond: "1.23 s",
	} {
		if got := fmtDuration(d); got != want {
			t.Errorf("fmtDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

func sampleReport() *Report {
	g := &Group{Name: "exec `true`", Note: "one sandbox"}
	bare := g.result("bare runsc exec", true)
	for _, d := range msd(20, 24, 22) {
		bare.add(d)
	}
	rest := g.result("REST POST …/exec", false)
	for _, d := range msd(30, 40, 33) {
		rest.add(d)
	}
	g.finish()
	g2 := &Group{Name: "stop | start"}
	ours := g2.result("REST stop", false)
	ours.add(2 * time.Second)
	g2.result("bare tar", true).Skipped = "no --state-dir"
	g2.finish()
	return &Report{
		Date:    time.Date(2026, 3, 1, 12, 30, 0, 0, time.UTC),
		Machine: Machine{CPUs: 2, MemoryBytes: 24 << 30, Kernel: "6.1.0", Runsc: "release-1", Go: "go1.26.8", LoadAvg: "1.50 → 2.00"},
		Groups:  []*Group{g, g2},
	}
}

func TestMarkdown(t *testing.T) {
	var buf bytes.Buffer
	if err := writeMarkdown(&buf, sampleReport()); err != nil {
		t.Fatal(err)
	}
	want := "Measured 2026-03-01 12:30 UTC on 2 CPUs, 24.0 GiB memory, kernel 6.1.0; runsc release-1; go1.26.8; 1-min load average 1.50 → 2.00 (start → end).\n" +
		"\n" +
		"| benchmark | path | n | median | p99 | ours/bare |\n" +
		"| --- | --- | ---: | ---: | ---: | ---: |\n" +
		"| exec `true` | REST POST …/exec | 3 | 33.0 ms | 40.0 ms | 1.50× |\n" +
		"| exec `true` | bare runsc exec | 3 | 22.0 ms | 24.0 ms | (bare) |\n" +
		"| stop \\| start | REST stop | 1 | 2.00 s | 2.00 s | — |\n" +
		"| stop \\| start | bare tar | — | — | — | skipped: no --state-dir |\n" +
		"\n" +
		"- **exec `true`**: one sandbox\n"
	if got := buf.String(); got != want {
		t.Errorf("got Markdown:\n%s\nwant:\n%s", got, want)
	}
}

func TestJSON(t *testing.T) {
	var buf bytes.Buffer
	if err := writeJSON(&buf, sampleReport()); err != nil {
		t.Fatal(err)
	}
	var got jsonReport
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("decoding %s: %v", buf.String(), err)
	}
	if len(got.Groups) != 2 || len(got.Groups[0].Results) != 2 {
		t.Fatalf("got %s, want 2 groups, the first with 2 results", buf.String())
	}
	bare, rest := got.Groups[0].Results[0], got.Groups[0].Results[1]
	if !bare.Bare || bare.RatioToBare != nil || bare.MedianMs != 22 {
		t.Errorf("got bare result %+v, want bare, median 22 ms, no ratio", bare)
	}
	if rest.Bare || rest.RatioToBare == nil || *rest.RatioToBare != 1.5 || rest.P99Ms != 40 || rest.N != 3 {
		t.Errorf("got REST result %+v, want n 3, p99 40 ms, ratio 1.5", rest)
	}
	if s := got.Groups[1].Results[1].Skipped; s != "no --state-dir" {
		t.Errorf("got skipped %q, want the reason", s)
	}
	if !strings.Contains(buf.String(), `"median_ms"`) {
		t.Errorf("JSON lacks median_ms: %s", buf.String())
	}
}

func TestReferenceRow(t *testing.T) {
	g := &Group{Name: "restore"}
	ours := g.result("REST create from the snapshot", false)
	ref := g.reference("REST create (empty)")
	bare := g.result("bare untar", true)
	for i, d := range msd(30, 33, 36) {
		ours.add(d)
		ref.add(d / 3)
		bare.add(msd(10, 11, 12)[i])
	}
	g.finish()
	if ours.Ratio != 3 {
		t.Errorf("ours ratio = %v, want 3 (33 ms / 11 ms)", ours.Ratio)
	}
	if ref.Ratio != 0 || !ref.Reference || ref.Stats.N != 3 {
		t.Errorf("got reference ratio %v, reference %v, n %d; want 0, true, 3", ref.Ratio, ref.Reference, ref.Stats.N)
	}
	table := markdownTable([]*Group{g})
	for _, want := range []string{
		"| restore | REST create from the snapshot | 3 | 33.0 ms | 36.0 ms | 3.00× |\n",
		"| restore | REST create (empty) | 3 | 11.0 ms | 12.0 ms | (reference) |\n",
		"| restore | bare untar | 3 | 11.0 ms | 12.0 ms | (bare) |\n",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("got table:\n%s\nwant a row %q", table, want)
		}
	}
	var buf bytes.Buffer
	if err := writeJSON(&buf, &Report{Groups: []*Group{g}}); err != nil {
		t.Fatal(err)
	}
	var got jsonReport
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("decoding %s: %v", buf.String(), err)
	}
	if r := got.Groups[0].Results[1]; !r.Reference || r.RatioToBare != nil {
		t.Errorf("got JSON reference result %+v, want reference true and no ratio", r)
	}
	if r := got.Groups[0].Results[0]; r.Reference {
		t.Errorf("got JSON result %+v, want reference false", r)
	}
}

func TestRestoreNote(t *testing.T) {
	ours, empty, bare := &Result{}, &Result{}, &Result{}
	for _, d := range msd(1500, 1600, 1700) {
		ours.add(d)
	}
	for _, d := range msd(500, 600, 700) {
		empty.add(d)
	}
	for _, d := range msd(900, 1000, 1100) {
		bare.add(d)
	}
	note := restoreNote(ours, empty, bare, wsCount{files: 6000, bytes: 100_200_000})
	for _, want := range []string{
		"includes a box create",
		"(median 600.0 ms)",
		"the difference of the medians, 1.00 s (1.00× the bare extraction)",
		"the source's 6000 files, 100.2 MB",
		"no warm-up",
	} {
		if !strings.Contains(note, want) {
			t.Errorf("got note %q, want it to contain %q", note, want)
		}
	}
	if note := restoreNote(&Result{}, &Result{}, &Result{}, wsCount{}); strings.Contains(note, "difference") {
		t.Errorf("got note %q without samples, want no difference", note)
	}
}
