# sockfleet. `make run` runs the fleet locally; `make test` runs every test.
# Both install what they need: Go modules, and under .tools/ the pinned npm tools,
# in two packages: .tools/local (dynoxide and kinesalite, the local engines; dynoxide
# is published for linux-x64) and .tools/deploy (the CDK CLI, installable anywhere).
# `make synth` and `make deploy` install only .tools/deploy, so they work from macOS,
# Windows and Linux on x64 or arm64.

SHELL := /bin/bash
GO    ?= go
LOCAL_TOOLS  := .tools/local/node_modules/.installed
DEPLOY_TOOLS := .tools/deploy/node_modules/.installed
# The open-source Lambda Runtime Interface Emulator runs the real reconciler binary
# locally. Built from the Go module proxy at a pinned version.
RIE         := .tools/bin/aws-lambda-rie
RIE_VERSION := v0.0.0-20261030222936-bef5c4ba774d
# Jaeger, the local trace backend of `make run` and the fleet tests: cmd/jaeger built
# from a Go module of its own (.tools/jaeger/go.mod pins the version), so the
# project's go.mod carries none of its dependencies. A cold build (modules not yet
# downloaded, empty build cache) is about 15 CPU-minutes (README, Prerequisites);
# after that Go's build cache makes it seconds.
JAEGER      := .tools/bin/jaeger
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION = 20

.PHONY: all tools local-tools deploy-tools local-bin build run test vet fmt-check unit bench clean template

all: build

$(LOCAL_TOOLS): .tools/local/package.json .tools/local/package-lock.json
	npm ci --prefix .tools/local --no-audit --no-fund --loglevel=error
	@touch $@

$(DEPLOY_TOOLS): .tools/deploy/package.json .tools/deploy/package-lock.json
	npm ci --prefix .tools/deploy --no-audit --no-fund --loglevel=error
	@touch $@

$(RIE):
	GOBIN=$(CURDIR)/.tools/bin $(GO) install github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie@$(RIE_VERSION)

$(JAEGER): .tools/jaeger/go.mod .tools/jaeger/go.sum
	cd .tools/jaeger && $(GO) build -o $(CURDIR)/$(JAEGER) github.com/jaegertracing/jaeger/cmd/jaeger

# The local engines, the Lambda emulator and Jaeger: what `make run` and the Go tests need.
local-tools: $(LOCAL_TOOLS) $(RIE) $(JAEGER)
# The CDK CLI: all the deploy path needs from npm.
deploy-tools: $(DEPLOY_TOOLS)
tools: local-tools deploy-tools

build:
	$(GO) build ./...

# The binaries `make run` starts: workers, the reconciler (for this machine, run under
# the emulator) and the operator CLI.
local-bin:
	$(GO) build -o .local/bin/worker ./worker
	CGO_ENABLED=0 $(GO) build -tags lambda.norpc -o .local/bin/bootstrap ./functions/reconciler
	$(GO) build -o .local/bin/sockfleet ./cmd/sockfleet
	$(GO) build -o .local/bin/sockfleet-local ./cmd/sockfleet-local

# Flags for sockfleet-local, e.g. make run RUN_ARGS='-worker-env SOCKFLEET_RESUME=none'.
# `make run SINK=kinesis` delivers to a stream on kinesalite instead of files.
RUN_ARGS ?=

run: local-tools local-bin template
	.local/bin/sockfleet-local $(if $(SINK),-sink $(SINK)) $(RUN_ARGS)

test: tools vet fmt-check unit infra-test

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v /testdata/)); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

unit: local-tools template
	$(GO) test -race -count=1 -timeout 20m ./...

bench: local-tools template
	$(GO) test -run '^$$' -bench . -benchtime 2s ./shared/... ./worker/... && $(GO) run ./cmd/worker-bench -tracing both && $(GO) run ./cmd/sockfleet-bench && $(GO) run ./cmd/sockfleet-bench -deploy && $(GO) run ./cmd/sockfleet-bench -deploy -deploy-conns 200 -deploy-rate 10 -deploy-rtt 20ms && $(GO) run ./cmd/sockfleet-bench -rebalance 300

clean:
	rm -rf bin cdk.out .local

# AWS (README, "Deploying to AWS"). The reconciler Lambda is a static linux/arm64
# `bootstrap`; the CDK app in infra/ is a Go module of its own, run by cdk.json.
# Extra CLI arguments go in CDK_ARGS, e.g. make deploy CDK_ARGS='-c desiredCount=4'.
.PHONY: lambda synth deploy infra-test
CDK        := .tools/deploy/node_modules/.bin/cdk
CDK_ARGS   ?=
CDK_SILENT := CDK_DISABLE_VERSION_CHECK=true CDK_DISABLE_CLI_TELEMETRY=true

lambda:
	@test -d functions/reconciler || { echo "lambda: ./functions/reconciler (the reconciler's main package) does not exist" >&2; exit 1; }
	CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build -tags lambda.norpc -trimpath -ldflags='-s -w' \
		-o bin/reconciler/bootstrap ./functions/reconciler

synth: deploy-tools lambda
	$(CDK) synth $(CDK_ARGS)

deploy: deploy-tools lambda
	$(CDK) deploy $(CDK_ARGS)

# The synthesized template whose IAM policies (shared/local/iam) and security groups
# (shared/local/netrules) `make run`, the fleet tests and the benchmarks enforce
# locally. Synthesized again only when the stack's sources or the arguments change;
# the infra build is cached after the first time.
# `make run SINK=kinesis` synthesizes the stack with its Kinesis stream, so the
# workers may write to it.
TEMPLATE      := cdk.out/Sockfleet.template.json
TEMPLATE_ARGS := $(if $(filter kinesis,$(SINK)),-c kinesisStream=create)
TEMPLATE_SRC  := cdk.json $(wildcard infra/*.go infra/go.mod infra/go.sum shared/schema/*.go shared/filters/*.go)

template: $(TEMPLATE)

.local/template-args: FORCE
	@mkdir -p .local
	@echo '$(TEMPLATE_ARGS)' | cmp -s - $@ || echo '$(TEMPLATE_ARGS)' > $@

$(TEMPLATE): $(TEMPLATE_SRC) .local/template-args | $(DEPLOY_TOOLS)
	@test -f bin/reconciler/bootstrap || $(MAKE) --no-print-directory lambda
	$(CDK_SILENT) $(CDK) synth --quiet --no-version-reporting --no-notices $(TEMPLATE_ARGS)
	@touch $@

.PHONY: FORCE
FORCE:

# Assertion tests of the stack, then the same synth `cdk deploy` runs, offline.
infra-test: deploy-tools lambda
	cd infra && $(GO) vet ./... && $(GO) test -count=1 -timeout 20m ./...
	$(CDK_SILENT) $(CDK) synth --quiet --no-version-reporting --no-notices

