package caddymodule

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func parse(t *testing.T, input string) (*Handler, error) {
	t.Helper()
	h := new(Handler)
	err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input))
	return h, err
}

func TestCaddyfileMinimal(t *testing.T) {
	h, err := parse(t, `llm_hedge {
		upstream http://127.0.0.1:9001
		upstream http://127.0.0.1:9002
		delay 50ms
	}`)
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Upstreams) != 2 {
		t.Fatalf("len(h.Upstreams) = %v, want 2", len(h.Upstreams))
	} else if h.Upstreams[0].URL != "http://127.0.0.1:9001" {
		t.Fatalf("h.Upstreams[0].URL = %q, want \"http://127.0.0.1:9001\"", h.Upstreams[0].URL)
	} else if h.Upstreams[1].URL != "http://127.0.0.1:9002" {
		t.Fatalf("h.Upstreams[1].URL = %q, want \"http://127.0.0.1:9002\"", h.Upstreams[1].URL)
	}
	if h.Delay.Mode != "fixed" {
		t.Fatalf("h.Delay.Mode = %q, want \"fixed\"", h.Delay.Mode)
	} else if time.Duration(h.Delay.Fixed) != 50*time.Millisecond {
		t.Fatalf("time.Duration(h.Delay.Fixed) = %v, want %v", time.Duration(h.Delay.Fixed), 50*time.Millisecond)
	}
}

func TestCaddyfileEveryOption(t *testing.T) {
	h, err := parse(t, `llm_hedge http://a.test {
		route chat
		upstream https://api.example.com/v1 {
			name backup
			header_up Authorization "Bearer sk-2"
			header_up -X-Debug
			model small-model
		}
		delay adaptive 800ms {
			quantile 0.9
			min 100ms
			max 5s
			window 500
			min_samples 20
		}
		max_attempts 3
		timeout 2m
		min_time_left 1s
		max_body 8MiB
		max_prefix 512KiB
		max_line 64KiB
		methods post put
		paths /v1/chat/ /v1/responses
		first_event openai-chat
		idempotency {
			header X-Request-Key
			ttl off
			max_entries 500
			max_bytes 16MiB
			max_response_bytes 256KiB
			scope_headers Authorization X-User
		}
		budget {
			ratio 0.05
			burst 4
			max_concurrent_hedges off
			cool_down 2s
			max_cool_down 30s
			overload_rate 0.3
			overload_window 50
			breaker_failures 3
			breaker_open 20s
			tenant_header X-Tenant
			tenant_tokens_per_minute 100000
		}
		report_header
		stream_error_event
		transport {
			dial_timeout 3s
			tls_handshake_timeout 2s
			response_header_timeout 1m
			keepalive_idle_timeout 30s
			max_idle_conns_per_host 16
			versions h2c 2
			proxy_from_environment
			tls_insecure_skip_verify
			tls_server_name api.internal
			tls_trusted_ca_certs /a.pem /b.pem
		}
		log_level info
	}`)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(h)
	want := `{"route":"chat",` +
		`"upstreams":[{"url":"http://a.test"},{"name":"backup","url":"https://api.example.com/v1",` +
		`"set_headers":{"Authorization":"Bearer sk-2"},"delete_headers":["X-Debug"],"model":"small-model"}],` +
		`"delay":{"mode":"adaptive","fixed":800000000,"quantile":0.9,"min":100000000,"max":5000000000,"window":500,"min_samples":20},` +
		`"max_attempts":3,"timeout":120000000000,"min_time_left":1000000000,` +
		`"max_body":8388608,"max_prefix":524288,"max_line":65536,` +
		`"methods":["POST","PUT"],"path_prefixes":["/v1/chat/","/v1/responses"],"first_event":"openai-chat",` +
		`"idempotency":{"header":"X-Request-Key","ttl":-1,"max_entries":500,"max_bytes":16777216,"max_response_bytes":262144,"scope_headers":["Authorization","X-User"]},` +
		`"budget":{"ratio":0.05,"burst":4,"max_concurrent_hedges":-1,"cool_down":2000000000,"max_cool_down":30000000000,` +
		`"overload_rate":0.3,"overload_window":50,"breaker_failures":3,"breaker_open":20000000000,` +
		`"tenant_header":"X-Tenant","tenant_tokens_per_minute":100000},` +
		`"report_header":"Server-Timing","stream_error_event":true,` +
		`"transport":{"dial_timeout":3000000000,"tls_handshake_timeout":2000000000,"response_header_timeout":60000000000,` +
		`"keepalive_idle_timeout":30000000000,"max_idle_conns_per_host":16,"versions":["h2c","2"],"proxy_from_environment":true,` +
		`"tls_insecure_skip_verify":true,` +
		`"tls_server_name":"api.internal","tls_trusted_ca_certs":["/a.pem","/b.pem"]},` +
		`"log_level":"info"}`
	if string(got) != want {
		t.Fatalf("parsed\n%s\nwant\n%s", got, want)
	}
	// Every parsed value must reach the core config unchanged.
	cfg := coreConfig(h.Config, caddy.NewReplacer())
	if cfg.Delay.Quantile != 0.9 {
		t.Fatalf("cfg.Delay.Quantile = %v, want 0.9", cfg.Delay.Quantile)
	} else if cfg.Budget.MaxConcurrentHedges != -1 {
		t.Fatalf("cfg.Budget.MaxConcurrentHedges = %v, want -1", cfg.Budget.MaxConcurrentHedges)
	} else if cfg.Idempotency.TTL != -1 {
		t.Fatalf("cfg.Idempotency.TTL = %v, want -1", cfg.Idempotency.TTL)
	} else if cfg.Upstreams[1].SetHeaders["Authorization"] != "Bearer sk-2" {
		t.Fatalf("cfg.Upstreams[1].SetHeaders[\"Authorization\"] = %q, want \"Bearer sk-2\"", cfg.Upstreams[1].SetHeaders["Authorization"])
	} else if cfg.Budget.TenantTokensPerMinute != 100000 {
		t.Fatalf("cfg.Budget.TenantTokensPerMinute = %v, want 100000", cfg.Budget.TenantTokensPerMinute)
	}
}

func TestCaddyfileDelayForms(t *testing.T) {
	h, err := parse(t, "llm_hedge http://a {\n delay adaptive\n}")
	if err != nil {
		t.Fatalf("delay adaptive: %v", err)
	} else if h.Delay.Mode != "adaptive" {
		t.Fatalf("delay adaptive: h.Delay.Mode = %q, want \"adaptive\"", h.Delay.Mode)
	} else if h.Delay.Fixed != 0 {
		t.Fatalf("delay adaptive: h.Delay.Fixed = %v, want 0", h.Delay.Fixed)
	}
	h, err = parse(t, "llm_hedge http://a {\n delay 1.5s\n}")
	if err != nil {
		t.Fatalf("delay 1.5s: %v", err)
	} else if time.Duration(h.Delay.Fixed) != 1500*time.Millisecond {
		t.Fatalf("delay 1.5s: time.Duration(h.Delay.Fixed) = %v, want %v", time.Duration(h.Delay.Fixed), 1500*time.Millisecond)
	}
}

func TestCaddyfileErrors(t *testing.T) {
	for _, tc := range []struct{ name, input, want string }{
		{"unknown option", "llm_hedge {\n frobnicate 1\n}", `unrecognized llm_hedge option "frobnicate", at Testfile:2`},
		{"delay without value", "llm_hedge {\n delay\n}", "delay: want `delay <duration>`"},
		{"delay not a duration", "llm_hedge {\n delay soon\n}", `delay "soon": want a duration`},
		{"fixed delay with block", "llm_hedge {\n delay 1s {\n  quantile 0.9\n }\n}", "belong to `delay adaptive`"},
		{"adaptive unknown option", "llm_hedge {\n delay adaptive {\n  p 0.9\n }\n}", `unrecognized delay option "p"`},
		{"adaptive bad initial", "llm_hedge {\n delay adaptive fast\n}", "want the initial delay as a duration"},
		{"quantile not a number", "llm_hedge {\n delay adaptive {\n  quantile high\n }\n}", `quantile "high": want a number`},
		{"max_attempts not int", "llm_hedge {\n max_attempts two\n}", `max_attempts "two": want an integer`},
		{"max_attempts off", "llm_hedge {\n max_attempts off\n}", "max_attempts cannot be off"},
		{"timeout two args", "llm_hedge {\n timeout 1s 2s\n}", "timeout takes exactly one argument, got 2"},
		{"bad size", "llm_hedge {\n max_body lots\n}", `max_body "lots": want a size`},
		{"upstream without url", "llm_hedge {\n upstream\n}", "upstream takes exactly one argument, got 0"},
		{"upstream unknown option", "llm_hedge {\n upstream http://a {\n  weight 2\n }\n}", `unrecognized upstream option "weight"`},
		{"header_up add", "llm_hedge {\n upstream http://a {\n  header_up +X-A b\n }\n}", "header_up: want"},
		{"header_up no value", "llm_hedge {\n upstream http://a {\n  header_up X-A\n }\n}", "header_up: want"},
		{"methods empty", "llm_hedge {\n methods\n}", "methods needs at least one argument"},
		{"idempotency args", "llm_hedge {\n idempotency on\n}", `idempotency takes no arguments, got ["on"]`},
		{"idempotency unknown", "llm_hedge {\n idempotency {\n  store redis\n }\n}", `unrecognized idempotency option "store"`},
		{"budget unknown", "llm_hedge {\n budget {\n  percent 10\n }\n}", `unrecognized budget option "percent"`},
		{"budget burst off", "llm_hedge {\n budget {\n  burst off\n }\n}", "burst cannot be off"},
		{"transport unknown", "llm_hedge {\n transport {\n  proxy_protocol v2\n }\n}", `unrecognized transport option "proxy_protocol"`},
		{"flag with value", "llm_hedge {\n stream_error_event yes\n}", "stream_error_event takes no arguments"},
		{"report_header two", "llm_hedge {\n report_header A B\n}", "report_header takes at most one header name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, tc.input)
			if err == nil {
				t.Fatalf("err = nil, want an error")
			} else if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err.Error() = %q, want it to contain %q", err.Error(), tc.want)
			}
		})
	}
}

// Every option of config.Config has a Caddyfile spelling: its JSON name (in
// its block), except the upstreams and delay's mode and fixed, which have
// a syntax of their own. A new core option is parsed without a new case.
func TestCaddyfileSpellsEveryCoreOption(t *testing.T) {
	cfgType := reflect.TypeOf(Handler{}.Config)
	for i := 0; i < cfgType.NumField(); i++ {
		top := cfgType.Field(i)
		name := jsonName(top)
		switch {
		case name == "upstreams":
		case top.Type.Kind() == reflect.Struct:
			for j := 0; j < top.Type.NumField(); j++ {
				inner := top.Type.Field(j)
				opener := name
				if name == "delay" {
					if n := jsonName(inner); n == "mode" || n == "fixed" {
						continue
					}
					opener = "delay adaptive"
				}
				checkSpelled(t, opener+" {\n"+optionLine(inner)+"\n}", name+"."+jsonName(inner), top.Index, inner.Index)
			}
		default:
			checkSpelled(t, optionLine(top), name, top.Index)
		}
	}
}

func jsonName(f reflect.StructField) string { return strings.Split(f.Tag.Get("json"), ",")[0] }

// optionLine is `<json name> <a value of the field's type>`.
func optionLine(f reflect.StructField) string {
	values := map[string]string{"Duration": "7s", "ByteSize": "4KiB", "string": "X-Value", "int": "3", "int64": "3", "float64": "0.5", "bool": ""}
	value, ok := values[f.Type.Name()]
	if f.Type.Kind() == reflect.Slice {
		value, ok = "A B", true
	} else if !ok && f.Type.Kind() == reflect.String {
		value, ok = "X-Value", true // core's string types
	}
	if !ok {
		return jsonName(f) + " <no Caddyfile value for " + f.Type.String() + ">"
	}
	return strings.TrimSpace(jsonName(f) + " " + value)
}

// checkSpelled parses the block and wants the core field at path non-zero.
func checkSpelled(t *testing.T, block, option string, path ...[]int) {
	t.Helper()
	h, err := parse(t, "llm_hedge http://a {\n"+block+"\n}")
	if err != nil {
		t.Errorf("core option %s has no Caddyfile spelling: %v", option, err)
		return
	}
	v := reflect.ValueOf(h.Config)
	for _, index := range path {
		v = v.FieldByIndex(index)
	}
	if v.IsZero() {
		t.Errorf("Caddyfile %q left core option %s at zero", block, option)
	}
}

// The validity options in the Caddyfile: `validate` takes the checks as
// arguments, validate_failure and validate_schema one value each.
func TestCaddyfileValidate(t *testing.T) {
	h, err := parse(t, "llm_hedge http://a {\n validate json_schema finish\n validate_failure 502\n validate_schema `{\"type\":\"object\"}`\n}")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(h.ValidateChecks, " "); got != "json_schema finish" {
		t.Fatalf("validate = %q, want \"json_schema finish\"", got)
	} else if h.ValidateFailure != "502" {
		t.Fatalf("validate_failure = %q, want \"502\"", h.ValidateFailure)
	} else if h.ValidateSchema != `{"type":"object"}` {
		t.Fatalf("validate_schema = %q, want {\"type\":\"object\"}", h.ValidateSchema)
	} else if err := h.Config.Validate(); err != nil {
		t.Fatalf("Validate = %v, want nil", err)
	}
}
