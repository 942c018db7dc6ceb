# The whole test suite: `make test` (what CI runs, through .ci/run).
# It installs what the tests need (yaegi v0.16.1 into the cache folder) and
# builds the real Caddy and Traefik binaries on first use (cached outside the
# checkout in $(LLMHEDGE_CACHE), keyed by version and source hash).

GO            ?= go
LLMHEDGE_CACHE ?= $(HOME)/.cache/llmhedge
export LLMHEDGE_CACHE
YAEGI_VERSION := v0.16.1
YAEGI         := $(LLMHEDGE_CACHE)/bin/yaegi-$(YAEGI_VERSION)
FUZZTIME      ?= 15s

.PHONY: test vet unit yaegi fuzz demo tools

test: vet unit yaegi fuzz

tools: $(YAEGI)

$(YAEGI):
	mkdir -p $(LLMHEDGE_CACHE)/bin
	GOBIN=$(LLMHEDGE_CACHE)/bin/tmp-yaegi $(GO) install github.com/traefik/yaegi/cmd/yaegi@$(YAEGI_VERSION)
	mv $(LLMHEDGE_CACHE)/bin/tmp-yaegi/yaegi $(YAEGI)

vet:
	$(GO) vet ./...

unit:
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
