package runtime

import (
	"context"
	"errors"
	"testing"
)

func TestAdmitFence(t *testing.T) {
	for _, tc := range []struct {
		name       string
		ctx        context.Context
		seen       uint64
		wantNext   uint64
		wantRaised bool
		wantFenced bool
	}{
		{"NoFenceNoneSeen", context.Background(), 0, 0, false, false},
		{"NoFenceSomeSeen", context.Background(), 7, 7, false, false},
		{"ZeroFenceIsNone", WithFence(context.Background(), 0), 7, 7, false, false},
		{"FirstFence", WithFence(context.Background(), 5), 0, 5, true, false},
		{"Higher", WithFence(context.Background(), 9), 7, 9, true, false},
		{"Same", WithFence(context.Background(), 7), 7, 7, false, false},
		{"Lower", WithFence(context.Background(), 6), 7, 7, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next, raised, err := AdmitFence(tc.ctx, tc.seen)
			if next != tc.wantNext || raised != tc.wantRaised || errors.Is(err, ErrFenced) != tc.wantFenced ||
				(err != nil) != tc.wantFenced {
				t.Errorf("got (%d, %v, %v), want (%d, %v, fenced %v)", next, raised, err, tc.wantNext, tc.wantRaised, tc.wantFenced)
			}
		})
	}
	if n, ok := FenceFrom(WithFence(context.Background(), 42)); n != 42 || !ok {
		t.Errorf("FenceFrom: got (%d, %v), want (42, true)", n, ok)
	}
	if _, ok := FenceFrom(context.Background()); ok {
		t.Errorf("FenceFrom of a context without one: got ok, want none")
	}
}
