package client_test

import (
	"net/http/httptest"
	"testing"

	"go.uber.org/goleak"

	"sandboxd/client"
	"sandboxd/internal/api/apitest"
	"sandboxd/internal/api/apitest/skintest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is the real REST and GraphQL handlers over the shared fake, in-process, behind a cutter
// that can drop a stream's connection mid-way (skintest).
type env struct {
	fake *apitest.Fake
	srv  *httptest.Server
	cut  *skintest.Cutter
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{fake: apitest.New()}
	e.srv, e.cut = skintest.Start(t, e.fake)
	return e
}

func (e *env) client(t *testing.T, opts ...client.Option) *client.Client {
	t.Helper()
	opts = append([]client.Option{client.WithBaseURL(e.srv.URL), client.WithAPIKey(apitest.UserKey),
		client.WithHTTPClient(e.srv.Client()), client.WithReconnect(10e6, 100e6, 5)}, opts...)
	c, err := client.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
