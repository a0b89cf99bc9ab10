package source

import "net/url"

// RedactURL is how a URL is shown in messages, state_reason, events and logs: its scheme and
// host only, "https://host:port/…". User info, path and query may hold secrets (a signed
// URL's token, a password) and are never shown. An empty URL stays empty. One that does not
// parse shows as "(an archive URL)": archive URLs are the only ones shown before anything
// parsed them.
func RedactURL(raw string) string {
	if raw == "" {
		return ""
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "(an archive URL)"
	}
	return u.Scheme + "://" + u.Host + "/…"
}
