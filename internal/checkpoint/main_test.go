package checkpoint_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// Started by an init function of go.opencensus.io, which fake-gcs-server (gcs_test.go)
		// imports through its Pub/Sub notifications; it never ends.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"))
}
