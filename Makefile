# FlowFabric reconcilers on River. `make run` and `make test` need nothing but
# Go: scripts/ensure-postgres.sh finds or starts a local PostgreSQL.
GO        ?= go
BIN       := bin/worker
# Honour DATABASE_URL when set; otherwise ensure-postgres.sh prints the
# local server's URL (starting one if needed).
DB_URL     = $$(./scripts/ensure-postgres.sh)

.PHONY: all build run migrate test test-fleet lint bench clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/worker

# DEMO_RATE: items per second `make run` feeds into the ff_* tables so a
# newcomer sees the reconcilers work at once (0 turns the demo feed off).
DEMO_RATE ?= 20

## run: start (or find) PostgreSQL, migrate River and the ff_* tables, feed a demo workload, run the worker with River UI.
run: build
	@url=$(DB_URL) && \
	DATABASE_URL="$$url" ./$(BIN) migrate --ff-schema && \
	if [ "$(DEMO_RATE)" != 0 ]; then \
	  DATABASE_URL="$$url" ./$(BIN) demo --rate $(DEMO_RATE) > bin/demo.log 2>&1 & demo=$$!; \
	  trap 'kill -INT $$demo 2>/dev/null; wait $$demo' EXIT; \
	  echo "demo workload: $(DEMO_RATE) items/s in namespace demo (log: bin/demo.log; DEMO_RATE=0 turns it off)"; \
	fi; \
	DATABASE_URL="$$url" ./$(BIN) run

## migrate: create River's tables and the ff_* tables in $DATABASE_URL (or the local server).
migrate: build
	@url=$(DB_URL) && DATABASE_URL="$$url" ./$(BIN) migrate --ff-schema

## test: lint, then every test against a real PostgreSQL (each test makes its own database).
# One test at a time: statements over whole 256-way partitioned tables take
# ~1,000-2,300 lock slots each, and a server with the default
# max_locks_per_transaction (64 x 100 connections) has 6,400 in all.
test: lint
	@url=$(DB_URL) && TEST_DATABASE_URL="$${TEST_DATABASE_URL:-$$url}" $(GO) test -count=1 -p 1 -parallel 1 -timeout 30m ./...

## test-fleet: the long chaos test: 3 real worker processes, ~90 s of feed, kills and backend terminations,
## River's rescuer (about 2 minutes). FF_CHAOS_REPORT=path also writes the figures as JSON.
test-fleet:
	@url=$(DB_URL) && TEST_DATABASE_URL="$${TEST_DATABASE_URL:-$$url}" FF_CHAOS_LONG=1 $(GO) test -count=1 -run TestFleetChaos -v ./internal/chaostest/

## lint: go vet and gofmt.
lint:
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

## bench: benchmark against the seed's design on a throwaway database and write docs/benchmarks.md.
bench: build
	@url=$(DB_URL) && DATABASE_URL="$$url" ./$(BIN) bench --out docs/benchmarks.md $(BENCH_FLAGS)

clean:
	rm -rf bin
