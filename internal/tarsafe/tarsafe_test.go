package tarsafe_test

import (
	"archive/tar"
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

func TestCheckType(t *testing.T) {
	tests := []struct {
		flag byte
		want error // nil: admitted
		msg  string
	}{
		{tar.TypeReg, nil, ""},
		{tar.TypeDir, nil, ""},
		{tar.TypeSymlink, nil, ""},
		{tar.TypeLink, nil, ""},
		{tar.TypeChar, tarsafe.ErrCharDevice, "is a character device"},
		{tar.TypeBlock, tarsafe.ErrBlockDevice, "is a block device"},
		{tar.TypeFifo, tarsafe.ErrFIFO, "is a FIFO"},
		{tarsafe.TypeSocket, tarsafe.ErrSocket, "is a socket"},
		{tar.TypeGNUSparse, nil, `has the unsupported type "S"`},
		{tar.TypeCont, nil, `has the unsupported type "7"`},
	}
	for _, tt := range tests {
		err := tarsafe.CheckType(tt.flag)
		switch {
		case tt.msg == "" && err != nil:
			t.Errorf("CheckType(%q): got %v, want nil", tt.flag, err)
		case tt.msg != "" && (err == nil || err.Error() != tt.msg):
			t.Errorf("CheckType(%q): got %v, want %q", tt.flag, err, tt.msg)
		case tt.want != nil && !errors.Is(err, tt.want):
			t.Errorf("CheckType(%q): got %v, want %v", tt.flag, err, tt.want)
		case tt.want == nil && tt.msg != "":
			var ut *tarsafe.UnsupportedTypeError
			if !errors.As(err, &ut) || ut.Type != tt.flag {
				t.Errorf("CheckType(%q): got %#v, want an *UnsupportedTypeError for it", tt.flag, err)
			}
		}
	}
}
