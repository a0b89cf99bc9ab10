package execstream

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"sandboxd/internal/redistest"
)

// BenchmarkAppend copies 64 KiB chunks (the guest's largest record) into one exec's stream on a
// real redis-server, one Append per chunk and four per Append, with the default bounds (so the
// stream is trimmed as it grows), and for comparison on the embedded Redis. MB/s is output
// bytes per second.
func BenchmarkAppend(b *testing.B) {
	data := make([]byte, 64<<10)
	for i := range data {
		data[i] = byte(rand.IntN(256))
	}
	for _, bc := range []struct {
		name  string
		start func(testing.TB) *redistest.Server
		batch int
	}{
		{"redis-server/1x64KiB", redistest.Start, 1},
		{"redis-server/4x64KiB", redistest.Start, 4},
		{"embedded/1x64KiB", redistest.Embedded, 1},
	} {
		b.Run(bc.name, func(b *testing.B) {
			srv := bc.start(b)
			s := New(srv.Client, Options{})
			ctx := context.Background()
			id := fmt.Sprint("exec_bench_", bc.batch)
			if err := s.Create(ctx, Meta{ID: id}, "A", time.Now(), time.Hour); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(bc.batch * len(data)))
			var off int64
			chunks := make([]Chunk, bc.batch)
			for b.Loop() {
				for i := range chunks {
					chunks[i] = Chunk{Stream: Stdout, Data: data, Start: off, Offset: off + 5 + int64(len(data))}
					off = chunks[i].Offset
				}
				if err := s.Append(ctx, id, "A", chunks, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
