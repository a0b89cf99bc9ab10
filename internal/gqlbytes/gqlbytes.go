// Package gqlbytes is the Go type of the GraphQL String fields that carry bytes as base64
// (the dataBase64 of exec and agent output events). gqlgen marshals a Go string field by
// escaping it byte by byte; base64 never needs escaping, so Base64 writes its encoding between
// quotes as it is: on a stream of exec output that escaping pass was an eighth of sandboxd's
// CPU. It imports nothing of the project (the generated graph package imports it).
package gqlbytes

import (
	"encoding/base64"
	"errors"
	"io"
	"sync"
)

// Base64 is bytes that a String field carries in standard, padded base64. The bytes are not
// copied: they must not change after the value is made (exec output's never do).
type Base64 []byte

// bufPool holds the buffers encodings are written from (a 64 KiB chunk encodes to 86 KiB).
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 96<<10); return &b }}

// MarshalGQL writes the bytes' base64 as a JSON string.
func (b Base64) MarshalGQL(w io.Writer) {
	bp := bufPool.Get().(*[]byte)
	buf := b.appendJSON((*bp)[:0])
	_, _ = w.Write(buf)
	if cap(buf) <= 1<<20 { // an unusually large one is not kept
		*bp = buf[:0]
		bufPool.Put(bp)
	}
}

// MarshalJSON is MarshalGQL's encoding for encoding/json (a nil Base64 is "", as in GraphQL;
// encoding/json's own []byte encoding would give null).
func (b Base64) MarshalJSON() ([]byte, error) {
	return b.appendJSON(make([]byte, 0, base64.StdEncoding.EncodedLen(len(b))+2)), nil
}

// appendJSON appends the bytes' base64 between quotes: a JSON string that needs no escape.
func (b Base64) appendJSON(dst []byte) []byte {
	dst = append(dst, '"')
	dst = base64.StdEncoding.AppendEncode(dst, b)
	return append(dst, '"')
}

// UnmarshalGQL reads a base64 string (the type is output only in the schema; this makes it a
// complete scalar for gqlgen).
func (b *Base64) UnmarshalGQL(v any) error {
	s, ok := v.(string)
	if !ok {
		return errors.New("base64 data must be a string")
	}
	d, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return err
	}
	*b = d
	return nil
}
