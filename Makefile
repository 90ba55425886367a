# tollgate — see README.md.
GO ?= go
export PATH := $(PATH):/usr/local/go/bin

.PHONY: all test check deps build run bench fuzz

all: check test

# deps makes sure the programs the tests start are installed: the tests run
# real redis-server processes (and nginx, Caddy) on loopback, never fakes.
deps:
	@./scripts/deps.sh

# test is what CI runs (.ci/run): every package, with the race detector,
# then the Helm chart's tests (deploy/helm/test, a module of its own so that
# Helm's dependencies stay out of tollgate's go.mod).
test: deps
	$(GO) test -race -shuffle=on -count=1 ./...
	cd deploy/helm/test && $(GO) test -race -shuffle=on -count=1 ./...

# bench measures tollgate against its peers side by side, in one run, and
# prints the ratios (bench/RESULTS.md): the Redis rows against
# go-redis/redis_rate, the memory rows against throttled and
# sethvargo/go-limiter on 100,000 live keys, the HTTP middleware rows
# against sethvargo/go-limiter's httplimit and go-chi/httprate, then the
# decision service
# (bench/serveload), against envoyproxy/ratelimit when ENVOY_RATELIMIT
# names its binary (built from its own source, never kept here). Each part
# ends with its paths against their goals.
bench: deps
	cd bench && $(GO) run ./cmd/compare
	ENVOY_RATELIMIT="$(ENVOY_RATELIMIT)" bench/serveload/compare.sh

# fuzz runs every fuzz target in the module (scripts/fuzz.sh) for FUZZTIME
# each (default 30s): make fuzz FUZZTIME=5m.
fuzz: deps
	@GO="$(GO)" ./scripts/fuzz.sh

check:
	@out=$$(gofmt -s -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt -s would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	cd deploy/helm/test && $(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
	@# The public API: exported names per package, as scripts/apicount counts them.
	$(GO) run ./scripts/apicount -max 224
	@# 32-bit platforms: everything builds but the test-only conformance package.
	GOARCH=386 $(GO) build $$($(GO) list ./... | grep -v /internal/test/conformance)

build:
	$(GO) build -o bin/tollgate ./cmd/tollgate

# image builds the container image without a daemon (scripts/image): the
# tarball bin/tollgate-image.tar for docker load and podman load, and the
# OCI layout bin/tollgate-oci for registries. Every timestamp in it is the
# last commit's, so two builds of one commit give one digest.
IMAGE_TAG ?= tollgate:latest
.PHONY: image
image:
	SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct 2>/dev/null || echo 0) \
		$(GO) run ./scripts/image -o bin/tollgate-image.tar -oci bin/tollgate-oci -tag $(IMAGE_TAG)

# run builds bin/tollgate, saying so first: the first build downloads and
# compiles every module, which takes minutes on a busy machine, and the
# compiling prints nothing. Then it starts the decision service on the
# memory store with the example rules. ARGS adds flags:
# make run ARGS='--http 127.0.0.1:9090'.
run:
	@echo "building tollgate into bin/tollgate (the first build downloads and compiles the modules, and can take minutes)..."
	@$(GO) build -o bin/tollgate ./cmd/tollgate
	@echo "starting: bin/tollgate serve --config examples/ratelimit.yaml $(ARGS)"
	@exec bin/tollgate serve --config examples/ratelimit.yaml $(ARGS)

# The lab (README "Lab"): each target runs `tollgate demo <name>` against the
# Redis at REDIS_URL (default redis://127.0.0.1:6379), or against a throwaway
# redis-server the demo starts when nothing answers there.
LAB := bucket drain refill race boundary skew
.PHONY: $(LAB) simulate

$(LAB): deps
	@$(GO) run ./cmd/tollgate demo $@

# simulate regenerates the tables and charts of README "Choosing an
# algorithm": docs/simulate/<pattern>.md and .svg. -redis replays every
# decision through a real Redis to measure its state (MEMORY USAGE).
simulate: deps
	$(GO) run ./cmd/tollgate simulate -redis -out docs/simulate
