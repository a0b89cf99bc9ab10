package gqlbytes

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"math/rand/v2"
	"testing"
)

// The marshaled value is the JSON string encoding/json makes of the standard base64, for any
// bytes and size (a pooled buffer reused by a smaller value leaves nothing behind).
func TestMarshalGQL(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, 3, 64 << 10, 100, 200 << 10, 5} {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		var got bytes.Buffer
		Base64(b).MarshalGQL(&got)
		want, _ := json.Marshal(base64.StdEncoding.EncodeToString(b))
		if !bytes.Equal(got.Bytes(), want) {
			t.Fatalf("%d bytes: got %.40q…, want %.40q…", n, got.Bytes(), want)
		}
		if j, err := json.Marshal(Base64(b)); err != nil || !bytes.Equal(j, want) {
			t.Fatalf("%d bytes: MarshalJSON = %.40q…, %v", n, j, err)
		}
		var back Base64
		var s string
		_ = json.Unmarshal(want, &s)
		if err := back.UnmarshalGQL(s); err != nil || !bytes.Equal(back, b) {
			t.Fatalf("%d bytes: UnmarshalGQL: %v", n, err)
		}
	}
	if j, _ := json.Marshal(Base64(nil)); string(j) != `""` {
		t.Fatalf("a nil Base64 is %s in JSON, want \"\" as in GraphQL", j)
	}
	var b Base64
	if b.UnmarshalGQL(42) == nil || b.UnmarshalGQL("not base64!") == nil {
		t.Fatal("UnmarshalGQL accepted a non-string or bad base64")
	}
}
