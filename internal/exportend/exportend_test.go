package exportend

import (
	"bytes"
	"crypto/sha256"
	"testing"
)

func TestLineParses(t *testing.T) {
	sum := sha256.Sum256([]byte("tar"))
	stderr := "3 entries\n" + Line(12345, sum[:])
	n, got, ok := Parse(stderr)
	if !ok || n != 12345 || !bytes.Equal(got, sum[:]) {
		t.Fatalf("got %d %x %v, want 12345 %x", n, got, ok, sum)
	}
}

// The last mark counts; anything else, or a mark cut short, is no mark.
func TestParseRefuses(t *testing.T) {
	sum := sha256.Sum256(nil)
	good := Line(7, sum[:])
	if n, _, ok := Parse(Line(1, sum[:]) + "noise\n" + good); !ok || n != 7 {
		t.Errorf("two marks: got %d %v, want the last (7)", n, ok)
	}
	for name, stderr := range map[string]string{
		"none":        "3 entries\n",
		"empty":       "",
		"cut":         good[:len(good)-1],
		"cut sum":     good[:len(good)-10] + "\n",
		"negative":    prefix + "-1 " + good[len(prefix)+2:],
		"no sum":      prefix + "7\n",
		"not a sum":   prefix + "7 zz\n",
		"not a count": prefix + "seven " + good[len(prefix)+2:],
	} {
		if _, _, ok := Parse(stderr); ok {
			t.Errorf("%s: %q parsed as a mark", name, stderr)
		}
	}
}
