package checkpoint_test

import (
	"archive/tar"
	"crypto/sha256"
	"io"
	"runtime"
	"sync"
	"testing"
	"time"

	"sandboxd/internal/checkpoint"
)

// TestLargeWorkspaceStreamsWithFlatMemory: a 1 GiB workspace is saved and read back as
// streams: the heap stays within a fixed bound however large the workspace is.
func TestLargeWorkspaceStreamsWithFlatMemory(t *testing.T) {
	const size = 1 << 30
	const bound = 160 << 20 // zstd windows and buffers both ways, not the workspace
	st, _ := newStore(t, checkpoint.Options{})
	sc := newScope()

	var mu sync.Mutex
	var base, peak uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base = ms.HeapInuse
	go func() {
		defer close(sampled)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			mu.Lock()
			peak = max(peak, ms.HeapInuse)
			mu.Unlock()
		}
	}()

	pr, pw := io.Pipe()
	want := sha256.New()
	go func() {
		tw := tar.NewWriter(io.MultiWriter(pw, want))
		err := tw.WriteHeader(&tar.Header{Name: "big.bin", Mode: 0o644, Size: size, Typeflag: tar.TypeReg})
		if err == nil {
			_, err = io.CopyN(tw, &patterned{}, size)
		}
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	m, err := st.Save(t.Context(), sc, pr, "")
	if err != nil {
		t.Fatal(err)
	}
	got, err := readBack(t, st, sc, m.ID)
	close(stop)
	<-sampled
	if err != nil {
		t.Fatal(err)
	}
	if got != [32]byte(want.Sum(nil)) {
		t.Fatal("the 1 GiB workspace read back differs from what was saved")
	}
	if grew := peak - min(base, peak); grew > bound {
		t.Fatalf("the heap grew by %d MiB while saving and reading 1 GiB, want at most %d MiB", grew>>20, bound>>20)
	}
	t.Logf("1 GiB saved (%d MiB stored) and read back; heap grew at most %d MiB", m.Size>>20, (peak-min(base, peak))>>20)
}

// patterned yields compressible text quickly: runs of letters that change every 4 KiB, with a
// counter every 64 bytes so no two blocks are the same.
type patterned struct{ n uint64 }

func (p *patterned) Read(b []byte) (int, error) {
	n := len(b) &^ 63
	for i := 0; i < n; i += 64 {
		p.n++
		c := byte('a' + (p.n>>6)%26)
		for j := range 56 {
			b[i+j] = c
		}
		for j := range 8 {
			b[i+56+j] = byte('0' + (p.n>>(3*j))%8)
		}
	}
	return n, nil
}
