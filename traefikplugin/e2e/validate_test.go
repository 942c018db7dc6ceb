package e2e

import (
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/validitysuite"
)

// TestValidate is the answer-validation acceptance (validitysuite.Run)
// through real Traefik, the plugin interpreted by Yaegi; 20 requests a
// route, 200 with LLMHEDGE_BENCH=1.
func TestValidate(t *testing.T) {
	validitysuite.Run(t, 20, 200, 5, func(t *testing.T, aURL, bURL string) validitysuite.Routes {
		ab := [][2]string{{"A", aURL}, {"B", bURL}}
		onlyB := [][2]string{{"B", bURL}}
		d := newDynamic("g1").
			hedge("hedge-val", pluginConfig(ab, "delay: 500ms", "validate: [json_schema]", "log: off")).
			route("val", "noop@internal", "hedge-val").
			hedge("hedge-plain", pluginConfig(ab, "delay: 500ms", "log: off")).
			route("plain", "noop@internal", "hedge-plain").
			hedge("hedge-direct", pluginConfig(onlyB, "delay: 500ms", "log: off")).
			route("direct", "noop@internal", "hedge-direct").
			hedge("hedge-directval", pluginConfig(onlyB, "delay: 500ms", "validate: [json_schema]", "log: off")).
			route("directval", "noop@internal", "hedge-directval")
		tr := startTraefik(t, "INFO", d)
		return validitysuite.Routes{Validated: tr.URL + "/val", Plain: tr.URL + "/plain", Direct: tr.URL + "/direct", DirectValidated: tr.URL + "/directval"}
	})
}
