package source

import "testing"

func TestRedactURL(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"https://u:p@files.example.com:8443/a/b.tar.zst?X-Goog-Signature=abc#frag", "https://files.example.com:8443/…"},
		{"https://files.example.com", "https://files.example.com/…"},
		{"%zz", "(an archive URL)"},
		// sandboxd's Redis URL in its startup log: the password never shows.
		{"redis://:hunter2@10.0.0.5:6379/0", "redis://10.0.0.5:6379/…"},
		{"", ""},
	} {
		if got := RedactURL(tt.in); got != tt.want {
			t.Errorf("RedactURL(%q): got %q, want %q", tt.in, got, tt.want)
		}
	}
}
