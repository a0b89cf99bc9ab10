package kube_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"sandboxd/runtime"
	"sandboxd/runtime/kube"
)

// TestPauseUnsupported: the Kubernetes driver cannot keep a box's memory; pause and resume
// say so with ErrUnsupported (the API's UNSUPPORTED) and touch nothing (no cluster needed).
func TestPauseUnsupported(t *testing.T) {
	d := new(kube.Driver)
	ctx := context.Background()
	for name, err := range map[string]error{
		"Pause": d.Pause(ctx, "sbx_x"),
		"Resume": d.Resume(ctx, "sbx_x", func(context.Context) (io.ReadCloser, error) {
			t.Error("Resume opened the stored image")
			return nil, errors.New("no")
		}),
	} {
		if !errors.Is(err, runtime.ErrUnsupported) || !strings.Contains(err.Error(), "stop it instead") {
			t.Errorf("%s: got %v, want ErrUnsupported saying what to do", name, err)
		}
	}
	if _, err := d.MemoryImage(ctx, "sbx_x"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("MemoryImage: got %v, want ErrNotFound", err)
	}
	if err := d.DropMemoryImage(ctx, "sbx_x"); err != nil {
		t.Errorf("DropMemoryImage: %v", err)
	}
}
