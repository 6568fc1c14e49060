# sockfleet. `make run` runs the fleet locally; `make test` runs every test.
# Both install what they need: Go modules, and under .tools/ the pinned npm tools
# (dynoxide, the local DynamoDB engine, and the CDK CLI).

SHELL := /bin/bash
GO    ?= go
TOOLS := .tools/node_modules/.installed
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION = 20

.PHONY: all tools build run test vet fmt-check unit bench clean

all: build

$(TOOLS): .tools/package.json .tools/package-lock.json
	npm ci --prefix .tools --no-audit --no-fund --loglevel=error
	@touch $@

tools: $(TOOLS)

build:
	$(GO) build ./...

run: tools
	$(GO) run ./cmd/sockfleet-local

test: tools vet fmt-check unit

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v /testdata/)); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

unit: tools
	$(GO) test -race -count=1 -timeout 20m ./...

bench: tools
	$(GO) test -run '^$$' -bench . -benchtime 2s ./shared/...

clean:
	rm -rf bin cdk.out .local
