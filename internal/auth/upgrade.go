package auth

import (
	"net/http"
	"strings"
)

// IsWebSocketUpgrade reports whether r is a WebSocket opening handshake: a GET whose Upgrade is
// websocket and whose Connection lists upgrade (RFC 6455 section 4.1). Both gates use it to
// decide the only requests that may arrive without a key (the GraphQL WebSocket and the
// terminal WebSocket, which authenticate in their first message), so it is one rule in one
// place.
func IsWebSocketUpgrade(r *http.Request) bool {
	if r.Method != http.MethodGet || !strings.EqualFold(strings.TrimSpace(r.Header.Get("Upgrade")), "websocket") {
		return false
	}
	for _, v := range r.Header.Values("Connection") {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "upgrade") {
				return true
			}
		}
	}
	return false
}
