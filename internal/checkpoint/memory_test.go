package checkpoint_test

import (
	"io"
	"runtime"
	"sync"
	"testing"
	"time"
)

// heapPeak samples the heap in use until stop is called, and returns the peak above the
// heap in use at the start.
func heapPeak() (stop func() uint64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base, peak := ms.HeapInuse, ms.HeapInuse
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				peak = max(peak, ms.HeapInuse)
			}
		}
	})
	return func() uint64 {
		close(done)
		wg.Wait()
		return peak - base
	}
}

// TestMemoryFlat saves and reads back a workspace streamed from a generator, larger than
// the memory it may use.
func TestMemoryFlat(t *testing.T) {
	size, limit := int64(256<<20), uint64(48<<20)
	if raceEnabled {
		size = 96 << 20 // the race detector makes zstd slow
	}
	for _, bm := range benchModes {
		t.Run(bm.name, func(t *testing.T) {
			st, _ := newStore(t, bm.opts)
			sc := newScope()
			pr, pw := io.Pipe()
			var wg sync.WaitGroup
			wg.Go(func() {
				_, err := writeTar(pw, 7, 0, size, 4<<20)
				pw.CloseWithError(err)
			})
			stop := heapPeak()
			m, err := st.Save(t.Context(), sc, pr, "")
			pr.Close() // ends the generator if Save failed
			wg.Wait()
			if err != nil {
				t.Fatalf("Save: %v", err)
			}
			saved := stop()
			stop = heapPeak()
			rc, _, err := st.Open(t.Context(), sc, m.ID)
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			if _, err := io.Copy(io.Discard, rc); err != nil {
				t.Fatal(err)
			}
			opened := stop()
			t.Logf("%d MiB tar: heap peak %d MiB in Save, %d MiB in Open", m.RawSize>>20, saved>>20, opened>>20)
			if m.RawSize < size || saved > limit || opened > limit {
				t.Errorf("%d MiB tar: heap peak %d MiB in Save, %d MiB in Open; want at most %d MiB",
					m.RawSize>>20, saved>>20, opened>>20, limit>>20)
			}
		})
	}
}
