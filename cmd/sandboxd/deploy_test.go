package main

import (
	"strings"
	"testing"
)

// deploy/'s config files load as the gateway's Deployment runs them: the images of the
// sandboxes' pods come from its environment (SANDBOXD_INIT_IMAGE, SANDBOXD_IMAGE, which
// kustomize's images: rewrites); without SANDBOXD_IMAGE the config is refused, naming it, and
// without SANDBOXD_INIT_IMAGE it loads (the default profile's image carries the init).
func TestDeployConfigImages(t *testing.T) {
	for _, f := range []string{"../../deploy/base/sandboxd.yaml", "../../deploy/overlays/dev/sandboxd.yaml"} {
		env := map[string]string{"SANDBOXD_CONFIG": f, "SANDBOX_API_KEY": "a-long-dev-key",
			"SANDBOXD_INIT_IMAGE": "reg.test/sandbox-init:1.2.3", "SANDBOXD_IMAGE": "reg.test/sandbox-default:1.2.3"}
		c, err := loadConfig(nil, func(k string) string { return env[k] })
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if c.Kube.InitImage != env["SANDBOXD_INIT_IMAGE"] {
			t.Errorf("%s: kube.init_image: got %q, want SANDBOXD_INIT_IMAGE's", f, c.Kube.InitImage)
		}
		if len(c.Profiles) == 0 || c.Profiles[0].Image != env["SANDBOXD_IMAGE"] {
			t.Errorf("%s: the default profile's image: got %+v, want SANDBOXD_IMAGE's", f, c.Profiles)
		}
		// sandbox-default carries the guest init: its pods need no init container.
		if len(c.Profiles) == 0 || !c.Profiles[0].ImageHasInit {
			t.Errorf("%s: the default profile does not say its image carries the init: %+v", f, c.Profiles)
		}
		// The init image serves only images without the init: the default profile needs none.
		delete(env, "SANDBOXD_INIT_IMAGE")
		if _, err := loadConfig(nil, func(k string) string { return env[k] }); err != nil {
			t.Errorf("%s without SANDBOXD_INIT_IMAGE: %v, want it loaded (its profile's image carries the init)", f, err)
		}
		delete(env, "SANDBOXD_IMAGE")
		_, err = loadConfig(nil, func(k string) string { return env[k] })
		if err == nil || !strings.Contains(err.Error(), "SANDBOXD_IMAGE") {
			t.Errorf("%s without the image variables: got %v, want SANDBOXD_IMAGE named", f, err)
		}
	}
}
