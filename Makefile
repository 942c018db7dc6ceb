# Three lanes of tests (README: "Contributor notes: test lanes"):
#   make unit  go test -short: no process outside the test binary, minutes;
#   make e2e   the packages whose tests start real proxies, Redis, Node;
#   make test  the whole suite (what CI runs, through .ci/run): every test,
#              not -short (`make suite`), plus vet, lint, yaegi, fuzz,
#              rules and kubernetes.
# The last two install what the tests need (yaegi v0.16.1 and golangci-lint
# into the cache folder, Debian's redis-server and prometheus through
# apt-get when missing) and build the real Caddy and Traefik binaries on
# first use (cached outside the checkout in $(LLMHEDGE_CACHE), keyed by
# version and source hash).

GO            ?= go
LLMHEDGE_CACHE ?= $(HOME)/.cache/llmhedge
export LLMHEDGE_CACHE
YAEGI_VERSION := v0.16.1
YAEGI         := $(LLMHEDGE_CACHE)/bin/yaegi-$(YAEGI_VERSION)
# INTERPRETED are the packages Traefik interprets: the plugin and what it
# imports of this module.
INTERPRETED    = $(shell $(GO) list -deps -f "{{if not .Standard}}{{.ImportPath}}{{end}}" ./traefikplugin | sed "s|^github.com/llmhedge/llmhedge/||")
GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT := $(LLMHEDGE_CACHE)/bin/golangci-lint-$(GOLANGCI_LINT_VERSION)
FUZZTIME      ?= 15s

.PHONY: test vet lint unit e2e suite yaegi fuzz demo tools redis-server prometheus rules kubernetes

test: vet lint suite yaegi fuzz rules kubernetes

tools: $(YAEGI) $(GOLANGCI_LINT)

# The fleet tests start their own redis-server (internal/testkit/redisproc);
# install Debian's package when there is none (sudo when not root).
redis-server:
	@if ! command -v redis-server >/dev/null 2>&1 && [ ! -x /usr/bin/redis-server ]; then \
		if [ "$$(id -u)" = 0 ]; then sudo=; \
		elif command -v sudo >/dev/null 2>&1; then sudo=sudo; \
		else echo "redis-server is missing and this user cannot install it: run apt-get install -y redis-server as root" >&2; exit 1; fi; \
		echo "installing redis-server"; \
		$$sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q redis-server; \
	fi

$(YAEGI):
	mkdir -p $(LLMHEDGE_CACHE)/bin
	GOBIN=$(LLMHEDGE_CACHE)/bin/tmp-yaegi $(GO) install github.com/traefik/yaegi/cmd/yaegi@$(YAEGI_VERSION)
	mv $(LLMHEDGE_CACHE)/bin/tmp-yaegi/yaegi $(YAEGI)

$(GOLANGCI_LINT):
	mkdir -p $(LLMHEDGE_CACHE)/bin
	GOBIN=$(LLMHEDGE_CACHE)/bin/tmp-golangci-lint $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(LLMHEDGE_CACHE)/bin/tmp-golangci-lint/golangci-lint $(GOLANGCI_LINT)

vet:
	$(GO) vet ./...

# The linters of .golangci.yml (a few minutes on 2 cores from a cold cache).
lint: $(GOLANGCI_LINT)
	$(GOLANGCI_LINT) run ./...

# Debian's prometheus package (promtool, and the server the end-to-end test
# of deploy/ runs on a loopback port of its own). The package enables a
# service on :9090 where an init system runs: it is stopped and disabled,
# the tests need none.
prometheus:
	@if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ]; then sudo=; \
		elif command -v sudo >/dev/null 2>&1; then sudo=sudo; \
		else echo "prometheus is missing and this user cannot install it: run apt-get install -y prometheus as root" >&2; exit 1; fi; \
		echo "installing prometheus"; \
		$$sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q --no-install-recommends prometheus && \
		{ $$sudo systemctl disable --now prometheus 2>/dev/null || $$sudo service prometheus stop 2>/dev/null || true; }; \
	fi

# The Prometheus rules of deploy/prometheus, checked and unit-tested on
# synthetic series.
rules: prometheus
	promtool check rules deploy/prometheus/llmhedge-rules.yml
	cd deploy/prometheus && promtool test rules llmhedge-rules.test.yml

# The Kubernetes examples decoded strictly into Traefik's CRD types and the
# Kubernetes API types: a module of its own (Traefik's go.mod has replace
# lines a dependent must repeat).
kubernetes:
	cd deploy/kubernetes/validate && $(GO) test -count=1 ./...

# While editing: under -short the test kit skips every test that starts a
# process (redisproc, caddybin, traefikbin, nodesdk, proc.SkipShort) and the
# long load tests, so this needs neither Redis nor a proxy build.
unit:
	$(GO) test -race -short -count=1 -timeout 15m ./...

# The packages whose tests start processes: redis-server (redisproc), a
# built Caddy, Traefik or Jaeger (caddybin, traefikbin, jaeger), node and npm (nodesdk),
# prometheus or promtool (deploy), or the command under test as a child
# (the cmd packages, envoyfilter's hostile client). A package whose tests
# start one joins this list.
E2E_PKGS := \
	./caddymodule \
	./caddymodule/e2e \
	./cmd/llmhedge-ctl \
	./cmd/llmhedge-tune \
	./core/coretest \
	./deploy \
	./envoyfilter \
	./envoyfilter/cmd/llmhedge-extproc \
	./fleetredis \
	./internal/fleete2e \
	./internal/testkit/caddybin \
	./internal/testkit/jaeger \
	./internal/testkit/nodesdk \
	./internal/testkit/proc \
	./internal/testkit/redisproc \
	./internal/testkit/yaegistress \
	./resp \
	./traefikplugin \
	./traefikplugin/e2e

# Before a push that touches an adapter or the fleet: those packages whole
# (not -short), against the real processes.
e2e: redis-server prometheus
	$(GO) test -race -count=1 -timeout 30m $(E2E_PKGS)

# Every test of the module, not -short: the go test part of `make test`.
# GOTESTFLAGS=-json makes its output a report (e.g. of the slowest tests).
suite: redis-server prometheus
	$(GO) test $(GOTESTFLAGS) -race -count=1 -timeout 30m ./...

# yaegi resolves imports GOPATH-style: link the checkout into a temporary
# GOPATH and test the packages Traefik would interpret (resp: the plugin's
# Redis client for fleet mode).
yaegi: $(YAEGI) redis-server
	@set -e; gopath=$$(mktemp -d); trap 'rm -rf "$$gopath"' EXIT; \
	mkdir -p $$gopath/src/github.com/llmhedge; \
	ln -s "$(CURDIR)" $$gopath/src/github.com/llmhedge/llmhedge; \
	cd $$gopath/src/github.com/llmhedge/llmhedge; \
	for pkg in $(INTERPRETED); do \
		if ls $$pkg/*.go >/dev/null 2>&1; then \
			echo "yaegi test ./$$pkg"; \
			GOPATH=$$gopath GOFLAGS= timeout 900 $(YAEGI) test github.com/llmhedge/llmhedge/$$pkg; \
		fi; \
	done

# go test -fuzz takes one target per run.
fuzz:
	$(GO) test -run='^$$' -fuzz=FuzzFirstEventDetector -fuzztime=$(FUZZTIME) ./core/stream
	$(GO) test -run='^$$' -fuzz=FuzzRequestJSON -fuzztime=$(FUZZTIME) ./core

demo:
	$(GO) run ./examples/demo
