package kube

import (
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

func TestConfig(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("the zero config: %v", err)
	}
	if err := (Config{ReadyTimeoutSec: -1}).Validate(); err == nil {
		t.Error("a negative ready_timeout_sec: got nil error")
	}
	rc := &rest.Config{Host: "https://example"}
	o := Config{Namespace: "ns", InitImage: "init:1", RuntimeClass: "rc", StorageClass: "sc", ReadyTimeoutSec: 3,
		UnschedulableTimeoutSec: 4}.Options(rc, nil)
	if o.Config != rc || o.Namespace != "ns" || o.InitImage != "init:1" || o.RuntimeClass != "rc" || o.StorageClass != "sc" ||
		o.ReadyTimeout != 3*time.Second || o.UnschedulableTimeout != 4*time.Second {
		t.Errorf("options: %+v", o)
	}
}
