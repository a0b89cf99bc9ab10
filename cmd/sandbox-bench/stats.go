package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Stats summarizes the samples of one measurement.
type Stats struct {
	N      int
	Median time.Duration
	// P99 is the nearest-rank 99th percentile: the smallest sample that at least 99 % of the
	// samples do not exceed. Below 100 samples it is the maximum.
	P99  time.Duration
	Min  time.Duration
	Max  time.Duration
	Mean time.Duration
}

// summarize computes the statistics of samples (which it does not modify).
func summarize(samples []time.Duration) Stats {
	if len(samples) == 0 {
		return Stats{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return Stats{
		N:      len(s),
		Median: median(s),
		P99:    percentile(s, 99),
		Min:    s[0],
		Max:    s[len(s)-1],
		Mean:   sum / time.Duration(len(s)),
	}
}

// number is what the statistics are computed over: durations, or values in some unit.
type number interface{ ~int64 | ~float64 }

// median of sorted samples: the middle one, or the mean of the two middle ones.
func median[T number](sorted []T) T {
	n := len(sorted)
	switch {
	case n == 0:
		return 0
	case n%2 == 1:
		return sorted[n/2]
	default:
		return (sorted[n/2-1] + sorted[n/2]) / 2
	}
}

// percentile is the nearest-rank p-th percentile of sorted samples (0 < p <= 100).
func percentile[T number](sorted []T, p float64) T {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(n)))
	return sorted[min(max(rank, 1), n)-1]
}

// ValueStats summarizes samples that are not durations (MiB, goroutines), like Stats.
type ValueStats struct {
	N                           int
	Median, P99, Min, Max, Mean float64
}

// summarizeValues computes the statistics of values (which it does not modify).
func summarizeValues(values []float64) ValueStats {
	if len(values) == 0 {
		return ValueStats{}
	}
	s := slices.Clone(values)
	slices.Sort(s)
	var sum float64
	for _, v := range s {
		sum += v
	}
	return ValueStats{N: len(s), Median: median(s), P99: percentile(s, 99), Min: s[0], Max: s[len(s)-1], Mean: sum / float64(len(s))}
}

// ratio is ours/bare of two medians; 0 when either is missing.
func ratio(ours, bare Stats) float64 {
	if ours.N == 0 || bare.N == 0 || bare.Median <= 0 {
		return 0
	}
	return float64(ours.Median) / float64(bare.Median)
}

// valueRatio is ours/bare of two medians of values; 0 when either is missing.
func valueRatio(ours, bare ValueStats) float64 {
	if ours.N == 0 || bare.N == 0 || bare.Median <= 0 {
		return 0
	}
	return ours.Median / bare.Median
}

// Result is one measured path of a group: ours (through sandboxd) or the bare counterpart.
type Result struct {
	Label string
	// Bare marks the group's bare counterpart, the denominator of the ratios.
	Bare bool
	// Reference marks a row measured in the same loop for the reader to set against the
	// others (a plain create next to a create that also restores), not compared with the bare
	// result: it has no ratio.
	Reference bool
	Samples   []time.Duration
	Stats     Stats
	// Unit, when set, says the result measures values in that unit (MiB, goroutines) kept in
	// Values and summarized in VStats, instead of durations in Samples.
	Unit   string
	Values []float64
	VStats ValueStats
	// Ratio is this result's median over the bare result's (0: no bare result to compare).
	Ratio float64
	// Rate is a throughput measured along with the samples (per second; 0: none), RateUnit
	// what it counts ("req/s"), RateRatio its ratio to the bare result's Rate.
	Rate      float64
	RateUnit  string
	RateRatio float64
	// Skipped says why the result was not measured ("" when it was).
	Skipped string
	// NotMeasured says what the result waits for when it cannot be measured yet.
	NotMeasured string
}

// add records one sample.
func (r *Result) add(d time.Duration) { r.Samples = append(r.Samples, d) }

// addValue records one value sample of a result with a Unit.
func (r *Result) addValue(v float64) { r.Values = append(r.Values, v) }

// measured reports whether the result has samples.
func (r *Result) measured() bool { return r.Stats.N > 0 || r.VStats.N > 0 }

// Group is one benchmark: its results measured side by side in one interleaved loop, and at
// most one bare result they are compared with.
type Group struct {
	Name    string
	Note    string
	Results []*Result
}

// result adds a result to the group and returns it.
func (g *Group) result(label string, bare bool) *Result {
	r := &Result{Label: label, Bare: bare}
	g.Results = append(g.Results, r)
	return r
}

// reference adds a reference result (no ratio) to the group and returns it.
func (g *Group) reference(label string) *Result {
	r := g.result(label, false)
	r.Reference = true
	return r
}

// valueResult adds a result of values in unit to the group and returns it.
func (g *Group) valueResult(label, unit string, bare bool) *Result {
	r := g.result(label, bare)
	r.Unit = unit
	return r
}

// finish computes every result's statistics and the ratios to the group's bare result of the
// same unit (a duration is not compared with a value, nor MiB with goroutines).
func (g *Group) finish() {
	bares := map[string]*Result{}
	for _, r := range g.Results {
		r.Stats = summarize(r.Samples)
		r.VStats = summarizeValues(r.Values)
		if r.Bare && bares[r.Unit] == nil && r.measured() {
			bares[r.Unit] = r
		}
	}
	for _, r := range g.Results {
		r.Ratio, r.RateRatio = 0, 0
		bare := bares[r.Unit]
		if r.Bare || r.Reference || bare == nil {
			continue
		}
		if r.Unit == "" {
			r.Ratio = ratio(r.Stats, bare.Stats)
		} else {
			r.Ratio = valueRatio(r.VStats, bare.VStats)
		}
		if r.Rate > 0 && bare.Rate > 0 {
			r.RateRatio = r.Rate / bare.Rate
		}
	}
}

// Report is everything one run prints.
type Report struct {
	Date    time.Time
	Machine Machine
	Target  string
	Groups  []*Group
	Errors  []string
}

// Machine describes where the run happened.
type Machine struct {
	CPUs        int    `json:"cpus"`
	MemoryBytes uint64 `json:"memory_bytes"`
	Kernel      string `json:"kernel"`
	Runsc       string `json:"runsc"`
	RunscFlags  string `json:"runsc_flags,omitempty"`
	TempFS      string `json:"temp_fs,omitempty"`
	// LoadAvg is the 1-minute load average at the start and at the end of the run.
	LoadAvg string `json:"load_avg,omitempty"`
	Go      string `json:"go"`
}

// fmtDuration prints a duration with three significant-ish digits.
func fmtDuration(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	case d < time.Second:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
}

// fmtValue prints a value with its unit, to about three significant digits.
func fmtValue(v float64, unit string) string {
	var s string
	switch a := math.Abs(v); {
	case a >= 100 || v == math.Trunc(v) && a < 1e15:
		s = fmt.Sprintf("%.0f", v)
	case a >= 10:
		s = fmt.Sprintf("%.1f", v)
	default:
		s = fmt.Sprintf("%.2f", v)
	}
	if unit == "" {
		return s
	}
	return s + " " + unit
}

// fmtRate prints a throughput with thousands separators ("12,345 req/s").
func fmtRate(v float64, unit string) string {
	n := int64(math.Round(v))
	digits := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range digits {
		if i > 0 && (len(digits)-i)%3 == 0 && digits[i-1] != '-' {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if unit != "" {
		b.WriteString(" " + unit)
	}
	return b.String()
}

func fmtBytes(n uint64) string {
	const gib = 1 << 30
	if n >= gib {
		return fmt.Sprintf("%.1f GiB", float64(n)/gib)
	}
	return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20))
}

// cell escapes a table cell.
func cell(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "|", `\|`), "\n", " ")
}

// writeMarkdown prints the report: a header with the machine, one table of every result, the
// groups' notes and the errors.
func writeMarkdown(w io.Writer, r *Report) error {
	var b strings.Builder
	m := r.Machine
	fmt.Fprintf(&b, "Measured %s on %d CPUs, %s memory, kernel %s; runsc %s",
		r.Date.UTC().Format("2006-01-02 15:04 MST"), m.CPUs, fmtBytes(m.MemoryBytes), m.Kernel, m.Runsc)
	if m.RunscFlags != "" {
		fmt.Fprintf(&b, " (`%s`)", m.RunscFlags)
	}
	fmt.Fprintf(&b, "; %s", m.Go)
	if m.TempFS != "" {
		fmt.Fprintf(&b, "; state and temp files on %s", m.TempFS)
	}
	if m.LoadAvg != "" {
		fmt.Fprintf(&b, "; 1-min load average %s (start → end)", m.LoadAvg)
	}
	if r.Target != "" {
		fmt.Fprintf(&b, "; sandboxd: %s", r.Target)
	}
	b.WriteString(".\n\n")
	b.WriteString(markdownTable(r.Groups))
	var notes []string
	for _, g := range r.Groups {
		if g.Note != "" {
			notes = append(notes, fmt.Sprintf("- **%s**: %s", cell(g.Name), g.Note))
		}
	}
	if len(notes) > 0 {
		b.WriteString("\n" + strings.Join(notes, "\n") + "\n")
	}
	if len(r.Errors) > 0 {
		b.WriteString("\nErrors:\n")
		for _, e := range r.Errors {
			fmt.Fprintf(&b, "- %s\n", e)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// markdownTable is the table of every group's results, the bare one last in each group. A
// throughput column is added when some result has a rate.
func markdownTable(groups []*Group) string {
	withRate := false
	for _, g := range groups {
		for _, r := range g.Results {
			withRate = withRate || r.Rate > 0
		}
	}
	var b strings.Builder
	if withRate {
		b.WriteString("| benchmark | path | n | median | p99 | throughput | ours/bare |\n")
		b.WriteString("| --- | --- | ---: | ---: | ---: | ---: | ---: |\n")
	} else {
		b.WriteString("| benchmark | path | n | median | p99 | ours/bare |\n")
		b.WriteString("| --- | --- | ---: | ---: | ---: | ---: |\n")
	}
	for _, g := range groups {
		rows := slices.Clone(g.Results)
		slices.SortStableFunc(rows, func(a, b *Result) int {
			switch {
			case a.Bare == b.Bare:
				return 0
			case b.Bare:
				return -1
			default:
				return 1
			}
		})
		for _, r := range rows {
			n, med, p99, rat, rate := "—", "—", "—", "—", "—"
			switch {
			case r.Unit != "" && r.VStats.N > 0:
				n, med, p99 = fmt.Sprint(r.VStats.N), fmtValue(r.VStats.Median, r.Unit), fmtValue(r.VStats.P99, r.Unit)
			case r.Stats.N > 0:
				n, med, p99 = fmt.Sprint(r.Stats.N), fmtDuration(r.Stats.Median), fmtDuration(r.Stats.P99)
			}
			if r.Rate > 0 {
				rate = fmtRate(r.Rate, r.RateUnit)
				if r.RateRatio > 0 {
					rate += fmt.Sprintf(" (%.2f×)", r.RateRatio)
				}
			}
			switch {
			case r.NotMeasured != "":
				rat = "not measured: " + r.NotMeasured
			case r.Skipped != "":
				rat = "skipped: " + r.Skipped
			case r.Bare:
				rat = "(bare)"
			case r.Reference:
				rat = "(reference)"
			case r.Ratio > 0:
				rat = fmt.Sprintf("%.2f×", r.Ratio)
			}
			if withRate {
				fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", cell(g.Name), cell(r.Label), n, med, p99, cell(rate), cell(rat))
			} else {
				fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", cell(g.Name), cell(r.Label), n, med, p99, cell(rat))
			}
		}
	}
	return b.String()
}

// The JSON shapes: durations in milliseconds.
type jsonReport struct {
	Date    time.Time   `json:"date"`
	Machine Machine     `json:"machine"`
	Target  string      `json:"target,omitempty"`
	Groups  []jsonGroup `json:"groups"`
	Errors  []string    `json:"errors,omitempty"`
}

type jsonGroup struct {
	Name    string       `json:"name"`
	Note    string       `json:"note,omitempty"`
	Results []jsonResult `json:"results"`
}

type jsonResult struct {
	Label       string   `json:"label"`
	Bare        bool     `json:"bare"`
	Reference   bool     `json:"reference,omitempty"`
	N           int      `json:"n"`
	MedianMs    float64  `json:"median_ms"`
	P99Ms       float64  `json:"p99_ms"`
	MinMs       float64  `json:"min_ms"`
	MaxMs       float64  `json:"max_ms"`
	MeanMs      float64  `json:"mean_ms"`
	RatioToBare *float64 `json:"ratio_to_bare,omitempty"`
	// Values are the statistics of a result measured in a unit other than time (its *_ms
	// fields are then 0).
	Values *jsonValues `json:"values,omitempty"`
	// RatePerSec is the throughput measured with the samples, in RateUnit.
	RatePerSec      float64  `json:"rate_per_sec,omitempty"`
	RateUnit        string   `json:"rate_unit,omitempty"`
	RateRatioToBare *float64 `json:"rate_ratio_to_bare,omitempty"`
	Skipped         string   `json:"skipped,omitempty"`
	NotMeasured     string   `json:"not_measured,omitempty"`
}

type jsonValues struct {
	Unit   string  `json:"unit"`
	N      int     `json:"n"`
	Median float64 `json:"median"`
	P99    float64 `json:"p99"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	Mean   float64 `json:"mean"`
}

// round3 rounds to three decimals.
func round3(v float64) float64 { return math.Round(v*1000) / 1000 }

func ms(d time.Duration) float64 {
	return math.Round(float64(d)/float64(time.Millisecond)*1000) / 1000
}

func writeJSON(w io.Writer, r *Report) error {
	out := jsonReport{Date: r.Date.UTC(), Machine: r.Machine, Target: r.Target, Errors: r.Errors, Groups: []jsonGroup{}}
	for _, g := range r.Groups {
		jg := jsonGroup{Name: g.Name, Note: g.Note, Results: []jsonResult{}}
		for _, res := range g.Results {
			s := res.Stats
			jr := jsonResult{Label: res.Label, Bare: res.Bare, Reference: res.Reference, N: s.N, MedianMs: ms(s.Median), P99Ms: ms(s.P99),
				MinMs: ms(s.Min), MaxMs: ms(s.Max), MeanMs: ms(s.Mean), Skipped: res.Skipped, NotMeasured: res.NotMeasured}
			if res.Unit != "" {
				v := res.VStats
				jr.N = v.N
				jr.Values = &jsonValues{Unit: res.Unit, N: v.N, Median: round3(v.Median), P99: round3(v.P99),
					Min: round3(v.Min), Max: round3(v.Max), Mean: round3(v.Mean)}
			}
			if res.Ratio > 0 {
				v := round3(res.Ratio)
				jr.RatioToBare = &v
			}
			if res.Rate > 0 {
				jr.RatePerSec, jr.RateUnit = round3(res.Rate), res.RateUnit
				if res.RateRatio > 0 {
					v := round3(res.RateRatio)
					jr.RateRatioToBare = &v
				}
			}
			jg.Results = append(jg.Results, jr)
		}
		out.Groups = append(out.Groups, jg)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(out)
}
