package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
)

// writeJSON writes v as indented JSON and a newline.
func writeJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// writeLine writes v as one line of JSON (the events of a stream).
func writeLine(w io.Writer, v any) {
	_ = json.NewEncoder(w).Encode(v)
}

// table writes rows under a header, columns aligned.
func table(w io.Writer, header []string, rows [][]string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	_ = tw.Flush()
}

// fields writes "name  value" lines, aligned, skipping empty values.
func fields(w io.Writer, kv ...string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			fmt.Fprintf(tw, "%s:\t%s\n", kv[i], kv[i+1])
		}
	}
	_ = tw.Flush()
}

// when formats a time in UTC to the second; "" for none.
func when(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

func whenPtr(t *time.Time) string {
	if t == nil {
		return ""
	}
	return when(*t)
}

// size formats a byte count with a binary unit.
func size(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// printable quotes s when it holds control characters: names a sandbox chose (files, link
// targets) never reach the user's terminal as escape sequences.
func printable(s string) string {
	if strings.IndexFunc(s, unicode.IsControl) >= 0 {
		return strconv.Quote(s)
	}
	return s
}
