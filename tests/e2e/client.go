package e2e

import (
	"fmt"

	"sandboxd/client"
)

// Client returns the public Go client on this server, acting with KeyDev unless an option says
// otherwise (client.WithAPIKey(KeyTenant1) acts as tenant t1). It is for tests about behaviour;
// tests of the documented wire format stay on Curl and GQL, which stand for curl users.
// Sandboxes it creates are not tracked: pass them to Track with the matching header. It panics
// when the options make no client (an empty key), a mistake in the test itself. Its REST
// exchanges are checked against the server's OpenAPI document, unless an option replaces its
// HTTP client.
func (s *Server) Client(opts ...client.Option) *client.Client {
	c, err := client.New(append([]client.Option{client.WithBaseURL(s.URL), client.WithAPIKey(KeyDev),
		client.WithHTTPClient(s.HTTPClient())}, opts...)...)
	if err != nil {
		panic(fmt.Sprintf("e2e: client of %s: %v", s.URL, err))
	}
	return c
}
