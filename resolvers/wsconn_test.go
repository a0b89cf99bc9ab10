package resolvers

import (
	"encoding/json"
	"reflect"
	"testing"
)

type textType string

func (t textType) MarshalText() ([]byte, error) { return []byte("t:" + string(t)), nil }

// wireMessage has the shape of gqlgen's outgoing messages (an unexported field included).
type wireMessage struct {
	Payload json.RawMessage `json:"payload,omitempty"`
	ID      string          `json:"id,omitempty"`
	Type    textType        `json:"type"`
	noOp    bool
}

// TestEncodeWSMessage: the fast encoding means the same JSON as json.Marshal, for gqlgen's
// message shapes and for anything else.
func TestEncodeWSMessage(t *testing.T) {
	for name, v := range map[string]any{
		"next":          &wireMessage{ID: "1", Type: "next", Payload: json.RawMessage(`{"data":{"x":"a\u0000b"}}`)},
		"no id":         &wireMessage{Type: "connection_ack"},
		"hostile id":    &wireMessage{ID: "\x1f\"</script>é\u2028", Type: "complete"},
		"value not ptr": wireMessage{ID: "2", Type: "ping", Payload: json.RawMessage(`[1, 2]`)},
		"other struct":  struct{ A int }{A: 1},
		"map":           map[string]string{"type": "ka"},
		"string type": &struct {
			Payload  json.RawMessage
			ID, Type string
		}{ID: "3", Type: "data", Payload: json.RawMessage(`null`)},
	} {
		t.Run(name, func(t *testing.T) {
			got, _, _, err := encodeWSMessage(v)
			if err != nil {
				t.Fatal(err)
			}
			want, err := json.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			var g, w any
			if err := json.Unmarshal(got, &g); err != nil {
				t.Fatalf("not JSON: %s (%v)", got, err)
			}
			_ = json.Unmarshal(want, &w)
			if !reflect.DeepEqual(g, w) {
				t.Fatalf("got %s, want %s", got, want)
			}
		})
	}
}
