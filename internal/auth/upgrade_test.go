package auth

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestIsWebSocketUpgrade: only a GET with Upgrade: websocket and upgrade among the Connection
// tokens (any case, any position, over several header lines) is an opening handshake.
func TestIsWebSocketUpgrade(t *testing.T) {
	for _, tt := range []struct {
		name       string
		method     string
		upgrade    string
		connection []string
		want       bool
	}{
		{"plain", http.MethodGet, "websocket", []string{"Upgrade"}, true},
		{"case and spaces", http.MethodGet, " WebSocket ", []string{"keep-alive,  UPGRADE "}, true},
		{"second line", http.MethodGet, "websocket", []string{"keep-alive", "upgrade"}, true},
		{"post", http.MethodPost, "websocket", []string{"upgrade"}, false},
		{"head", http.MethodHead, "websocket", []string{"upgrade"}, false},
		{"other protocol", http.MethodGet, "h2c", []string{"upgrade"}, false},
		{"no connection", http.MethodGet, "websocket", nil, false},
		{"connection without upgrade", http.MethodGet, "websocket", []string{"keep-alive, upgraded"}, false},
		{"no upgrade", http.MethodGet, "", []string{"upgrade"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(tt.method, "/graphql", nil)
			if tt.upgrade != "" {
				r.Header.Set("Upgrade", tt.upgrade)
			}
			for _, c := range tt.connection {
				r.Header.Add("Connection", c)
			}
			if got := IsWebSocketUpgrade(r); got != tt.want {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}
