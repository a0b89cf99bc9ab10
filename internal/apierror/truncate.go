package apierror

import "unicode/utf8"

// Truncate cuts s to at most n bytes on a rune boundary, marking a cut with "…". It bounds what
// a caller sent (or a command wrote) wherever it is echoed back: in a public message, or in a
// record that clients read.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
