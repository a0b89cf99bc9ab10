package tarsafe_test

import (
	"errors"
	"strings"
	"testing"

	"sandboxd/internal/tarsafe"
)

func TestCleanName(t *testing.T) {
	deep := strings.Repeat("a/", 2049) + "f" // 4099 bytes, every component short
	tests := []struct {
		in   string
		want string
		ok   bool
		// deepOK, when set, is CleanDeepName's answer where it differs from CleanName's.
		deepOK bool
	}{
		{in: "a/b", want: "a/b", ok: true},
		{in: "./a/b/", want: "a/b", ok: true},
		{in: "./", want: ".", ok: true},
		{in: "a/../b", want: "b", ok: true},
		{in: "/a", want: "", ok: false},
		{in: "../a", want: "", ok: false},
		{in: "a/../../b", want: "", ok: false},
		{in: "", want: "", ok: false},
		{in: "a\x00b", want: "", ok: false},
		{in: "a/" + strings.Repeat("n", 256), want: "", ok: false},
		{in: deep, want: "", ok: false, deepOK: true},
	}
	for _, tt := range tests {
		got, err := tarsafe.CleanName(tt.in)
		if got != tt.want || (err == nil) != tt.ok {
			t.Errorf("CleanName(%.40q): got %q %v, want %q %v", tt.in, got, err, tt.want, tt.ok)
		}
		want, ok := tt.want, tt.ok
		if tt.deepOK {
			want, ok = tt.in, true
		}
		got, err = tarsafe.CleanDeepName(tt.in)
		if got != want || (err == nil) != ok {
			t.Errorf("CleanDeepName(%.40q): got %.40q %v, want %.40q %v", tt.in, got, err, want, ok)
		}
	}
	if _, err := tarsafe.CleanName(deep); !errors.Is(err, tarsafe.ErrNameTooLong) {
		t.Errorf("CleanName of a %d-byte name: got %v, want %v", len(deep), err, tarsafe.ErrNameTooLong)
	}
}
