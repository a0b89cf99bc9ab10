package offstack

import (
	"runtime"
	"strings"
	"sync"
	"testing"
)

func TestRunReturns(t *testing.T) {
	if got := Run(func() int { return 42 }); got != 42 {
		t.Fatalf("got %d, want 42", got)
	}
}

// f runs on another goroutine than the caller's.
func TestRunElsewhere(t *testing.T) {
	caller := goid()
	if got := Run(goid); got == caller {
		t.Fatalf("f ran on the caller's goroutine %s", got)
	}
}

// A panic in f reaches the caller's recover with its value, a nil panic included.
func TestRunPanics(t *testing.T) {
	for name, v := range map[string]any{"value": "boom", "error": errBoom{}} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if got := recover(); got != v {
					t.Fatalf("recovered %v, want %v", got, v)
				}
			}()
			Run(func() int { panic(v) })
			t.Fatal("Run returned")
		})
	}
	t.Run("nil", func(t *testing.T) {
		defer func() {
			if _, ok := recover().(*runtime.PanicNilError); !ok {
				t.Fatal("want a *runtime.PanicNilError")
			}
		}()
		Run(func() int { panic(nil) })
		t.Fatal("Run returned")
	})
}

// The caller's stack does not grow with f's: 100 goroutines that made a deep call and then
// wait hold far more stack than 100 that made it through Run.
func TestRunKeepsCallerStackSmall(t *testing.T) {
	const n = 100
	grown := stacksOf(n, func() { deep(2000) })
	kept := stacksOf(n, func() { Run(func() int { return deep(2000) }) })
	t.Logf("stacks of %d waiting goroutines: %d KiB after the deep call, %d KiB after Run", n, grown>>10, kept>>10)
	if kept*4 > grown {
		t.Fatalf("stacks after Run %d bytes, after the deep call itself %d: want under a quarter", kept, grown)
	}
}

// stacksOf is how much stack n goroutines hold while they wait, each after calling f (after a
// collection: stacks of goroutines that ended are freed, waiting ones halved once at most).
func stacksOf(n int, f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	release := make(chan struct{})
	var ready sync.WaitGroup
	for range n {
		ready.Add(1)
		go func() {
			f()
			ready.Done()
			<-release
		}()
	}
	ready.Wait()
	runtime.GC()
	runtime.ReadMemStats(&after)
	close(release)
	return after.StackInuse - min(after.StackInuse, before.StackInuse)
}

type errBoom struct{}

func (errBoom) Error() string { return "boom" }

func goid() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	id, _, _ := strings.Cut(strings.TrimPrefix(string(buf), "goroutine "), " ")
	return id
}

//go:noinline
func deep(n int) int {
	var pad [64]byte
	pad[n%64] = byte(n)
	if n == 0 {
		return int(pad[0])
	}
	return deep(n-1) + int(pad[n%64]&0)
}
