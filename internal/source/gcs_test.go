package source_test

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"iter"
	"slices"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"github.com/fsouza/fake-gcs-server/fakestorage"

	"sandboxd/internal/apierror"
	"sandboxd/internal/source"
	"sandboxd/internal/source/sourcetest"
)

// fakeGCS starts fake-gcs-server with objs in bucket src-bucket.
func fakeGCS(t *testing.T, objs map[string]string) (*fakestorage.Server, *storage.Client) {
	return sourcetest.FakeGCS(t, "src-bucket", objs)
}

var gcsObjects = map[string]string{
	"tasks/t1/a.txt":           "A",
	"tasks/t1/dir/":            "",
	"tasks/t1/dir/b.txt":       "BB",
	"tasks/t1/deep/x/y.txt":    "Y",
	"tasks/t1/empty":           "",
	"tasks/t1-evil/x":          "not under the prefix",
	"tasks/t1":                 "not under the prefix either",
	"other/z":                  "elsewhere",
	"tasks/bad/ok":             "fine",
	"tasks/bad/x/../../../etc": "escapes",
	"tasks/clash/f":            "a file",
	"tasks/clash/f/g":          "below a file",
}

func readGCS(t *testing.T, f *source.Fetcher, prefix string, allowed []string, l source.ObjectLister) ([]out, error) {
	t.Helper()
	rc, err := f.GCSPrefix(ctxT(t, time.Minute), prefix, allowed, l)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return readTar(rc)
}

func TestGCSPrefix(t *testing.T) {
	_, client := fakeGCS(t, gcsObjects)
	l, err := source.NewGCSLister(t.Context(), client)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	f, err := source.New(source.Options{})
	if err != nil {
		t.Fatal(err)
	}
	allowed := []string{"gs://src-bucket/tasks/"}

	t.Run("Objects", func(t *testing.T) {
		got, err := readGCS(t, f, "gs://src-bucket/tasks/t1", allowed, l)
		if err != nil {
			t.Fatal(err)
		}
		want := []out{
			{name: "a.txt", typ: tar.TypeReg, mode: 0o644, body: "A"},
			{name: "deep/", typ: tar.TypeDir, mode: 0o755},
			{name: "deep/x/", typ: tar.TypeDir, mode: 0o755},
			{name: "deep/x/y.txt", typ: tar.TypeReg, mode: 0o644, body: "Y"},
			{name: "dir/", typ: tar.TypeDir, mode: 0o755},
			{name: "dir/b.txt", typ: tar.TypeReg, mode: 0o644, body: "BB"},
			{name: "empty", typ: tar.TypeReg, mode: 0o644},
		}
		if !slices.Equal(got, want) {
			t.Errorf("got\n%v\nwant\n%v", got, want)
		}
	})
	t.Run("EscapingName", func(t *testing.T) {
		_, err := readGCS(t, f, "gs://src-bucket/tasks/bad/", allowed, l)
		wantErr(t, err, apierror.InvalidArgument, `"tasks/bad/x/../../../etc"`, "escapes")
	})
	t.Run("FileAndFolder", func(t *testing.T) {
		_, err := readGCS(t, f, "gs://src-bucket/tasks/clash/", allowed, l)
		wantErr(t, err, apierror.InvalidArgument, `"tasks/clash/f/g"`, `below the file "f"`)
	})
	t.Run("TooManyFiles", func(t *testing.T) {
		f, _ := source.New(source.Options{MaxFiles: 3})
		_, err := readGCS(t, f, "gs://src-bucket/tasks/t1/", allowed, l)
		wantErr(t, err, apierror.PayloadTooLarge, `"tasks/t1/deep/x/y.txt"`, "implies", "limit of 3")
	})
	t.Run("TotalOver", func(t *testing.T) {
		f, _ := source.New(source.Options{MaxTotalBytes: 3})
		_, err := readGCS(t, f, "gs://src-bucket/tasks/t1/", allowed, l)
		wantErr(t, err, apierror.PayloadTooLarge, `"tasks/t1/dir/b.txt"`, "limit of 3 bytes")
	})
	t.Run("NoObjects", func(t *testing.T) {
		_, err := readGCS(t, f, "gs://src-bucket/tasks/none/", allowed, l)
		wantErr(t, err, apierror.InvalidArgument, "no objects", "gs://src-bucket/tasks/none/")
	})
	t.Run("NoBucket", func(t *testing.T) {
		_, err := readGCS(t, f, "gs://no-such-bucket/x/", []string{"gs://no-such-bucket/"}, l)
		wantErr(t, err, apierror.InvalidArgument, "bucket does not exist")
	})
	t.Run("NotPermitted", func(t *testing.T) {
		_, err := readGCS(t, f, "gs://src-bucket/tasks-evil/", allowed, failLister{t})
		wantErr(t, err, apierror.InvalidArgument, "gs://src-bucket/tasks-evil/", "not a source")
	})
}

// The lister honours STORAGE_EMULATOR_HOST when it makes its own client.
func TestGCSListerEmulatorHost(t *testing.T) {
	srv, _ := fakeGCS(t, gcsObjects)
	t.Setenv("STORAGE_EMULATOR_HOST", strings.TrimPrefix(srv.URL(), "http://"))
	l, err := source.NewGCSLister(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	f, _ := source.New(source.Options{})
	got, err := readGCS(t, f, "gs://src-bucket/tasks/t1/dir/", []string{"gs://src-bucket/tasks/t1/"}, l)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].name != "b.txt" || got[0].body != "BB" {
		t.Errorf("got %v, want b.txt", got)
	}
}

// A stream that fails while reading an object is UNAVAILABLE and names the object.
func TestGCSPrefixReadFails(t *testing.T) {
	f, _ := source.New(source.Options{})
	l := &memLister{objs: []source.Object{{Name: "p/a", Size: 3}, {Name: "p/b", Size: 3}},
		fail: map[string]error{"p/b": errors.New("connection reset")}}
	rc, err := f.GCSPrefix(ctxT(t, time.Minute), "gs://bkt/p/", []string{"gs://bkt/"}, l)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got, err := readTar(rc)
	wantErr(t, err, apierror.Unavailable, `"p/b"`)
	if len(got) != 1 || got[0].name != "a" {
		t.Errorf("got %v before the error, want a", got)
	}
	t.Run("Changed", func(t *testing.T) {
		l := &memLister{objs: []source.Object{{Name: "p/a", Size: 5}}} // it holds 3 bytes
		_, err := readGCS(t, f, "gs://bkt/p/", []string{"gs://bkt/"}, l)
		wantErr(t, err, apierror.Unavailable, `"p/a"`)
	})
}

func TestPrefixPermitted(t *testing.T) {
	allowed := []string{"gs://bkt/tasks/", "gs://whole", "gs://ccc/deep/er", "not a prefix", "gs://bkt/x/../y/"}
	cases := []struct {
		prefix string
		want   bool
	}{
		{"gs://bkt/tasks/", true},
		{"gs://bkt/tasks", true},
		{"gs://bkt/tasks/x/", true},
		{"gs://bkt/tasks/x/y", true},
		{"gs://bkt/tasks-evil/", false},
		{"gs://bkt/tasksx", false},
		{"gs://bkt/", false},
		{"gs://bkt", false},
		{"gs://bkt/other/tasks/", false},
		{"gs://bkt/tasks/../secret/", false},
		{"gs://bkt/tasks//x/", false},
		{"gs://bkt/tasks/./x/", false},
		{"gs://other/tasks/", false},
		{"gs://whole/", true},
		{"gs://whole/any/thing/", true},
		{"gs://wholesale/", false},
		{"gs://ccc/deep/er/x", true},
		{"gs://ccc/deep/e", false},
		{"gs://ccc/deep/err/", false},
		{"gs://bkt/y/", false},
		{"s3://bkt/tasks/", false},
		{"bkt/tasks/", false},
		{"gs://BKT/tasks/", false},
		{"gs://bkt/tasks/\n/", false},
	}
	for _, c := range cases {
		if got := source.PrefixPermitted(allowed, c.prefix); got != c.want {
			t.Errorf("PrefixPermitted(%q): got %v, want %v", c.prefix, got, c.want)
		}
	}
	f, _ := source.New(source.Options{})
	for _, c := range cases {
		if c.want {
			continue
		}
		_, err := f.GCSPrefix(t.Context(), c.prefix, allowed, failLister{t})
		wantErr(t, err, apierror.InvalidArgument)
	}
}

// failLister fails the test when it is used.
type failLister struct{ t *testing.T }

func (l failLister) Objects(context.Context, string, string) iter.Seq2[source.Object, error] {
	l.t.Error("listed objects of a prefix that is not permitted")
	return func(func(source.Object, error) bool) {}
}

func (l failLister) Open(context.Context, string, string, int64) (io.ReadCloser, error) {
	l.t.Error("opened an object of a prefix that is not permitted")
	return nil, errors.New("no")
}

// memLister holds objects of three bytes each ("abc"), some of which fail to open.
type memLister struct {
	objs []source.Object
	fail map[string]error
}

func (l *memLister) Objects(_ context.Context, _, prefix string) iter.Seq2[source.Object, error] {
	return func(yield func(source.Object, error) bool) {
		for _, o := range l.objs {
			if strings.HasPrefix(o.Name, prefix) && !yield(o, nil) {
				return
			}
		}
	}
}

func (l *memLister) Open(_ context.Context, _, name string, _ int64) (io.ReadCloser, error) {
	if err := l.fail[name]; err != nil {
		return nil, err
	}
	return io.NopCloser(strings.NewReader("abc")), nil
}
