package resolvers

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"sync"

	"github.com/99designs/gqlgen/graphql"
)

// Large responses on a WebSocket skip a second encoding. gqlgen's WebSocket transport encodes
// each response with json.Marshal, which validates and compacts the response's data (already
// encoded JSON) byte by byte: with exec output streaming (base64 chunks of up to 64 KiB) that
// pass was a third of sandboxd's CPU. So on a WebSocket, stashData (the outermost response
// middleware) puts a large response's data into the connection's rawData under a token no
// client can guess, and hands gqlgen the token as the data (a JSON string, cheap to encode);
// the connection's WriteJSON (coderConn) writes the data in the token's place. The data is
// gqlgen's own encoding, written as it is. Other transports never see a token.

// stashMinBytes is the smallest response data worth stashing.
const stashMinBytes = 1024

// maxStashed bounds what one connection holds between a response and its write (a response
// gqlgen drops, on a connection closing, stays until the connection ends): past it, data goes
// the plain way.
const maxStashed = 64

// rawKey is the request context key of a WebSocket's rawData (set by gate.wrap).
type rawKey struct{}

// rawData is one WebSocket's stashed response data.
type rawData struct {
	prefix string // random per connection: tokens cannot be guessed or forged by a client
	// quoted is prefix as it appears in an encoded message: a JSON string's opening quote and
	// prefix, \u0000 for its NUL, without a closing quote.
	quoted []byte
	mu     sync.Mutex
	seq    uint64
	m      map[string]json.RawMessage
}

func newRawData() *rawData {
	var b [16]byte
	_, _ = rand.Read(b[:])
	prefix := "\x00sbx-raw-" + hex.EncodeToString(b[:]) + "-"
	quoted, _ := json.Marshal(prefix)
	return &rawData{prefix: prefix, quoted: quoted[:len(quoted)-1], m: map[string]json.RawMessage{}}
}

func withRawData(ctx context.Context) context.Context {
	return context.WithValue(ctx, rawKey{}, newRawData())
}

func rawDataFrom(ctx context.Context) *rawData {
	d, _ := ctx.Value(rawKey{}).(*rawData)
	return d
}

// put stashes data and returns the JSON string that stands for it; false when the connection
// holds maxStashed already.
func (d *rawData) put(data json.RawMessage) (json.RawMessage, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.m) >= maxStashed {
		return nil, false
	}
	d.seq++
	token := d.prefix + strconv.FormatUint(d.seq, 10)
	d.m[token] = data
	quoted, _ := json.Marshal(token) // the NUL becomes \u0000
	return quoted, true
}

// splice writes msg with each stashed token's JSON string replaced by its data, and forgets
// them. msg is returned as it is when it holds none.
func (d *rawData) splice(msg []byte) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.m) == 0 {
		return msg
	}
	for {
		i := bytes.Index(msg, d.quoted)
		if i < 0 {
			return msg
		}
		end := bytes.IndexByte(msg[i+len(d.quoted):], '"')
		if end < 0 {
			return msg
		}
		end += i + len(d.quoted) + 1
		var token string
		if json.Unmarshal(msg[i:end], &token) != nil {
			return msg
		}
		data, ok := d.m[token]
		if !ok {
			return msg
		}
		delete(d.m, token)
		out := make([]byte, 0, len(msg)-(end-i)+len(data))
		out = append(out, msg[:i]...)
		out = append(out, data...)
		msg = append(out, msg[end:]...)
	}
}

// stashData is the response middleware of rawData: on a WebSocket, a response whose data is
// stashMinBytes or more carries a token in its place.
func stashData(ctx context.Context, next graphql.ResponseHandler) *graphql.Response {
	resp := next(ctx)
	if resp == nil || len(resp.Data) < stashMinBytes {
		return resp
	}
	d := rawDataFrom(ctx)
	if d == nil {
		return resp
	}
	if token, ok := d.put(resp.Data); ok {
		resp.Data = token
	}
	return resp
}
