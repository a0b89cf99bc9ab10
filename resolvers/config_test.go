package resolvers

import (
	"strings"
	"testing"
)

func TestConfig(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatalf("the defaults: %v", err)
	}
	o := c.HandlerOptions()
	if o.KeepAlivePingInterval != DefaultKeepAlivePingInterval || o.ComplexityLimit != DefaultCostLimit ||
		o.MaxReadBytes != DefaultMaxReadBytes || o.MaxMutationFields != DefaultMaxMutationFields ||
		o.MaxOperationsPerConnection != DefaultMaxOperationsPerConnection || o.DisableIntrospection {
		t.Errorf("default options: %+v", o)
	}
	off := false
	c.Introspection = &off
	if !c.HandlerOptions().DisableIntrospection {
		t.Error("introspection: false did not disable it")
	}
	c.MaxMutationFields = 0
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "max_mutation_fields") {
		t.Errorf("got %v, want an error naming max_mutation_fields", err)
	}
}
