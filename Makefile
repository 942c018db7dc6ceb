# The whole test suite: `make test` (what CI runs, through .ci/run).
# It installs what the tests need (yaegi v0.16.1 and golangci-lint into the
# cache folder, Debian's redis-server through apt-get when it is missing) and
# builds the real Caddy and Traefik binaries on first use (cached outside the
# checkout in $(LLMHEDGE_CACHE), keyed by version and source hash).

GO            ?= go
LLMHEDGE_CACHE ?= $(HOME)/.cache/llmhedge
export LLMHEDGE_CACHE
YAEGI_VERSION := v0.16.1
YAEGI         := $(LLMHEDGE_CACHE)/bin/yaegi-$(YAEGI_VERSION)
GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT := $(LLMHEDGE_CACHE)/bin/golangci-lint-$(GOLANGCI_LINT_VERSION)
FUZZTIME      ?= 15s

.PHONY: test vet lint unit yaegi fuzz demo tools redis-server

test: vet lint unit yaegi fuzz

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

unit: redis-server
	$(GO) test -race -count=1 -timeout 30m ./...

# yaegi resolves imports GOPATH-style: link the checkout into a temporary
# GOPATH and test the packages Traefik would interpret.
yaegi: $(YAEGI)
	@set -e; gopath=$$(mktemp -d); trap 'rm -rf "$$gopath"' EXIT; \
	mkdir -p $$gopath/src/github.com/llmhedge; \
	ln -s "$(CURDIR)" $$gopath/src/github.com/llmhedge/llmhedge; \
	cd $$gopath/src/github.com/llmhedge/llmhedge; \
	for pkg in core traefikplugin; do \
		if ls $$pkg/*.go >/dev/null 2>&1; then \
			echo "yaegi test ./$$pkg"; \
			GOPATH=$$gopath GOFLAGS= timeout 900 $(YAEGI) test github.com/llmhedge/llmhedge/$$pkg; \
		fi; \
	done

# go test -fuzz takes one target per run.
fuzz:
	$(GO) test -run='^$$' -fuzz=FuzzFirstEventDetector -fuzztime=$(FUZZTIME) ./core
	$(GO) test -run='^$$' -fuzz=FuzzRequestJSON -fuzztime=$(FUZZTIME) ./core

demo:
	$(GO) run ./examples/demo
