package kubeenv_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
)

// freePort returns a TCP port that is free on 127.0.0.1 right now.
func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// processesUsing lists the processes whose command line mentions path.
func processesUsing(path string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, ent := range entries {
		if ent.Name()[0] < '0' || ent.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "cmdline"))
		if err != nil || !bytes.Contains(b, []byte(path)) {
			continue
		}
		out = append(out, ent.Name()+": "+strings.ReplaceAll(string(bytes.TrimRight(b, "\x00")), "\x00", " "))
	}
	return out
}

// dumpLogs prints the tails of the supervisor's and the programs' logs.
func dumpLogs(t *testing.T, supervisorLog, logDir string) {
	files, _ := filepath.Glob(filepath.Join(logDir, "*.log"))
	for _, f := range append([]string{supervisorLog}, files...) {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if len(b) > 6000 {
			b = b[len(b)-6000:]
		}
		t.Logf("==== %s (tail)\n%s", f, b)
	}
}

// getWatcher is the part of a typed client waitFor uses.
type getWatcher[T any] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// waitFor watches the named object until cond holds (or fails), within 2 minutes.
func waitFor[T metav1.Object](ctx context.Context, t *testing.T, c getWatcher[T], name, what string, cond func(T) (bool, error)) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var last T
	for {
		obj, err := c.Get(ctx, name, metav1.GetOptions{})
		rv := ""
		if err == nil {
			last = obj
			ok, cerr := cond(obj)
			if cerr != nil {
				t.Fatalf("waiting for %s: %v", what, cerr)
			}
			if ok {
				return obj
			}
			rv = obj.GetResourceVersion()
		} else if !apierrors.IsNotFound(err) {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		w, err := c.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(), ResourceVersion: rv})
		if err != nil {
			t.Fatalf("waiting for %s: watch: %v", what, err)
		}
		for ev := range w.ResultChan() {
			obj, ok := ev.Object.(T)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			last = obj
			ok, cerr := cond(obj)
			if cerr != nil {
				w.Stop()
				t.Fatalf("waiting for %s: %v", what, cerr)
			}
			if ok {
				w.Stop()
				return obj
			}
		}
		w.Stop()
		if ctx.Err() != nil {
			b, _ := json.MarshalIndent(last, "", "  ")
			t.Fatalf("waiting for %s: %v; last seen:\n%s", what, ctx.Err(), b)
		}
	}
}

// waitGone watches the named object until it is deleted, within 2 minutes.
func waitGone[T metav1.Object](ctx context.Context, t *testing.T, c getWatcher[T], name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		obj, err := c.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		if err != nil {
			t.Fatalf("waiting for %s to go: %v", name, err)
		}
		w, err := c.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(), ResourceVersion: obj.GetResourceVersion()})
		if err != nil {
			t.Fatalf("waiting for %s to go: watch: %v", name, err)
		}
		for ev := range w.ResultChan() {
			if ev.Type == watch.Deleted {
				w.Stop()
				return
			}
		}
		w.Stop()
		if ctx.Err() != nil {
			t.Fatalf("waiting for %s to go: %v", name, ctx.Err())
		}
	}
}
