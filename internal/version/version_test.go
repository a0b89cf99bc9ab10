package version

import (
	"os"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// The version is the VERSION file, a semantic version without a "v".
func TestVersionIsTheFile(t *testing.T) {
	data, err := os.ReadFile("VERSION")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := Version, strings.TrimSpace(string(data)); got != want {
		t.Errorf("Version: got %q, want %q (the VERSION file)", got, want)
	}
	if !regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`).MatchString(Version) {
		t.Errorf("Version: got %q, want MAJOR.MINOR.PATCH[-PRERELEASE]", Version)
	}
}

func TestRevision(t *testing.T) {
	defer func(old string) { revision = old }(revision)
	revision = "0123456789abcdef0123456789abcdef01234567"
	if got := Revision(); got != revision {
		t.Errorf("Revision with a link-time revision: got %q, want %q", got, revision)
	}
	revision = ""
	// A test binary carries no version control stamp: the fallback must say so, not be empty.
	if got := Revision(); got == "" {
		t.Errorf("Revision without a link-time revision: got an empty string, want a revision or \"unknown\"")
	}
}

func TestString(t *testing.T) {
	defer func(old string) { revision = old }(revision)
	revision = "abc123"
	got := String("sandboxd")
	want := "sandboxd " + Version + " (revision abc123, " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + ")"
	if got != want {
		t.Errorf("String: got %q, want %q", got, want)
	}
}
