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

// median of sorted samples: the middle one, or the mean of the two middle ones.
func median(sorted []time.Duration) time.Duration {
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
func percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(n)))
	return sorted[min(max(rank, 1), n)-1]
}

// ratio is ours/bare of two medians; 0 when either is missing.
func ratio(ours, bare Stats) float64 {
	if ours.N == 0 || bare.N == 0 || bare.Median <= 0 {
		return 0
	}
	return float64(ours.Median) / float64(bare.Median)
}

// Result is one measured path of a group: ours (through sandboxd) or the bare counterpart.
type Result struct {
	Label string
	// Bare marks the group's bare counterpart, the denominator of the ratios.
	Bare    bool
	Samples []time.Duration
	Stats   Stats
	// Ratio is this result's median over the bare result's (0: no bare result to compare).
	Ratio float64
	// Skipped says why the result was not measured ("" when it was).
	Skipped string
}

// add records one sample.
func (r *Result) add(d time.Duration) { r.Samples = append(r.Samples, d) }

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

// finish computes every result's statistics and the ratios to the bare result.
func (g *Group) finish() {
	var bare *Result
	for _, r := range g.Results {
		r.Stats = summarize(r.Samples)
		if r.Bare && bare == nil && r.Stats.N > 0 {
			bare = r
		}
	}
	for _, r := range g.Results {
		r.Ratio = 0
		if !r.Bare && bare != nil {
			r.Ratio = ratio(r.Stats, bare.Stats)
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

// markdownTable is the table of every group's results, the bare one last in each group.
func markdownTable(groups []*Group) string {
	var b strings.Builder
	b.WriteString("| benchmark | path | n | median | p99 | ours/bare |\n")
	b.WriteString("| --- | --- | ---: | ---: | ---: | ---: |\n")
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
			n, med, p99, rat := "—", "—", "—", "—"
			if r.Stats.N > 0 {
				n, med, p99 = fmt.Sprint(r.Stats.N), fmtDuration(r.Stats.Median), fmtDuration(r.Stats.P99)
			}
			switch {
			case r.Skipped != "":
				rat = "skipped: " + r.Skipped
			case r.Bare:
				rat = "(bare)"
			case r.Ratio > 0:
				rat = fmt.Sprintf("%.2f×", r.Ratio)
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", cell(g.Name), cell(r.Label), n, med, p99, cell(rat))
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
	N           int      `json:"n"`
	MedianMs    float64  `json:"median_ms"`
	P99Ms       float64  `json:"p99_ms"`
	MinMs       float64  `json:"min_ms"`
	MaxMs       float64  `json:"max_ms"`
	MeanMs      float64  `json:"mean_ms"`
	RatioToBare *float64 `json:"ratio_to_bare,omitempty"`
	Skipped     string   `json:"skipped,omitempty"`
}

func ms(d time.Duration) float64 {
	return math.Round(float64(d)/float64(time.Millisecond)*1000) / 1000
}

func writeJSON(w io.Writer, r *Report) error {
	out := jsonReport{Date: r.Date.UTC(), Machine: r.Machine, Target: r.Target, Errors: r.Errors, Groups: []jsonGroup{}}
	for _, g := range r.Groups {
		jg := jsonGroup{Name: g.Name, Note: g.Note, Results: []jsonResult{}}
		for _, res := range g.Results {
			s := res.Stats
			jr := jsonResult{Label: res.Label, Bare: res.Bare, N: s.N, MedianMs: ms(s.Median), P99Ms: ms(s.P99),
				MinMs: ms(s.Min), MaxMs: ms(s.Max), MeanMs: ms(s.Mean), Skipped: res.Skipped}
			if res.Ratio > 0 {
				v := math.Round(res.Ratio*1000) / 1000
				jr.RatioToBare = &v
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
