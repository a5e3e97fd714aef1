# FlowFabric reconcilers on River. `make run` and `make test` need nothing but
# Go: scripts/ensure-postgres.sh finds or starts a local PostgreSQL.
GO        ?= go
# pipefail: a recipe piping go test into its reporter fails with go test.
SHELL       := bash
.SHELLFLAGS := -eu -o pipefail -c
BIN       := bin/worker
# Honour DATABASE_URL when set; otherwise ensure-postgres.sh prints the
# local server's URL (starting one if needed).
DB_URL     = $$(./scripts/ensure-postgres.sh)

.PHONY: all build run migrate install test test-fleet lint bench soak clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/worker

# DEMO_RATE: items per second `make run` feeds into the ff_* tables so a
# newcomer sees the reconcilers work at once (0 turns the demo feed off).
DEMO_RATE ?= 20
# DEMO_FLAGS: more `worker demo` flags, e.g. --malformed to also write rows
# the worker warns about (deliberately malformed; off by default).
DEMO_FLAGS ?=

# RUN_DB: the database `make run` and `make migrate` use on the local
# server when DATABASE_URL is unset, created when missing (never the
# server's postgres maintenance database). Drop it with
#   psql -h 127.0.0.1 -U postgres -c 'DROP DATABASE ffreconcile WITH (FORCE)'
RUN_DB ?= ffreconcile
RUN_URL = $$(if [ -n "$${DATABASE_URL:-}" ]; then echo "$$DATABASE_URL"; else ./scripts/ensure-postgres.sh | sed 's|/postgres?|/$(RUN_DB)?|'; fi)

# Ctrl-C stops the worker and the demo feed alike; the trap, run under
# -e, must not fail when the feed already stopped on that same Ctrl-C.
## run: start (or find) PostgreSQL, create and migrate the ffreconcile database, feed a demo workload, run the worker with River UI.
# Ctrl-C reaches every process of the foreground group: the worker stops
# gracefully and exits 0, the demo is stopped by the trap, and the recipe's
# shell ignores the signal itself so that it exits with the worker's status
# (make then reports no error for a clean stop). A failed migration stops
# here, before the worker would fail on the same tables.
run: build
	@trap '' INT; \
	url=$(RUN_URL) && echo "database: $$url" && \
	DATABASE_URL="$$url" ./$(BIN) migrate --ff-schema --create-database || exit $$?; \
	if [ "$(DEMO_RATE)" != 0 ]; then \
	  DATABASE_URL="$$url" ./$(BIN) demo --rate $(DEMO_RATE) $(DEMO_FLAGS) > bin/demo.log 2>&1 & demo=$$!; \
	  trap 'kill -INT $$demo 2>/dev/null || true; wait $$demo || true' EXIT; \
	  echo "demo workload: $(DEMO_RATE) items/s in namespace demo (log: bin/demo.log; DEMO_RATE=0 turns it off)"; \
	fi; \
	DATABASE_URL="$$url" ./$(BIN) run

## migrate: create River's tables and the ff_* tables in $DATABASE_URL (or the local server's ffreconcile database).
migrate: build
	@url=$(RUN_URL) && DATABASE_URL="$$url" ./$(BIN) migrate --ff-schema --create-database

## install: install the worker binary as `worker` in $(go env GOPATH)/bin (or $GOBIN).
install:
	$(GO) install ./cmd/worker

## test: lint, then every test against a real PostgreSQL: a private cluster started for the run
## (scripts/test-postgres.sh; TEST_DATABASE_URL uses another server), each test in a database of its own.
## The alert rules' tests need promtool: scripts/ensure-promtool.sh installs Debian's prometheus package when it is missing.
# Packages (TEST_P) and tests within a package (TEST_PARALLEL) run side by
# side: much of a test's time is spent waiting for ticks. On 2 cores, 2 x 4
# took 772 s with every tick on time where 4 x 8 took 870 s and left
# ticks' statements timing out (Postgres plans each test's statements over
# 256 partitions: the server's CPU is what the suite waits for). With
# TEST_DATABASE_URL on a server with the default lock table, use 1, 1 and 1
# (TEST_PARALLEL_WORKERS too).
TEST_P        ?= 2
TEST_PARALLEL ?= 4
# The workers package's tests mostly wait for 1 s ticks and deadlines, not
# for the CPU: 8 at once took it from ~145 s to ~90 s in the suite, which
# it had outlasted.
TEST_PARALLEL_WORKERS ?= 8
# The longest packages start first (go test starts packages in the order
# given; ./... adds the rest): last in ./...'s order, workers ran alone for
# its last minute with 45-80 % of the CPU idle, and migrations (one
# single-threaded migration of an empty database) held the last 6 s of the
# run at half the CPU.
TEST_FIRST    := ./workers ./cmd/worker ./internal/chaostest ./store ./migrations ./internal/bench ./internal/takeover ./internal/metrics ./internal/testdb
test: lint
	@PROMTOOL=$$(./scripts/ensure-promtool.sh); export PROMTOOL; \
	url=$$(./scripts/test-postgres.sh start run); trap './scripts/test-postgres.sh stop run' EXIT; \
	echo "testing against $$url ($(TEST_P) packages x $(TEST_PARALLEL) tests at a time, $(TEST_PARALLEL_WORKERS) in workers)"; \
	TEST_DATABASE_URL="$$url" FF_TESTDB_REUSE=1 FF_TEST_PARALLEL_WORKERS=$(TEST_PARALLEL_WORKERS) $(GO) test -json -count=1 -p $(TEST_P) -parallel $(TEST_PARALLEL) -timeout 20m $(TEST_FIRST) ./... \
	  | $(GO) run ./internal/cmd/testreport

## test-fleet: the long chaos test: 3 real worker processes, ~90 s of feed, kills and backend terminations,
## River's rescuer (about 2 minutes). FF_CHAOS_REPORT=path also writes the figures as JSON.
test-fleet:
	@url=$$(./scripts/test-postgres.sh start run); trap './scripts/test-postgres.sh stop run' EXIT; \
	TEST_DATABASE_URL="$$url" FF_CHAOS_LONG=1 $(GO) test -count=1 -run TestFleetChaos -v ./internal/chaostest/

## lint: go vet, gofmt, and go.mod/go.sum as go mod tidy leaves them.
lint:
	$(GO) vet ./...
	@$(GO) mod tidy -diff || { echo "go.mod or go.sum is not tidy: run go mod tidy"; exit 1; }
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

## soak: 30 minutes of the demo's mixed stream into one fleet process, reported per 5-minute window in the Soak section of docs/benchmarks.md.
soak: build
	@url=$(DB_URL) && DATABASE_URL="$$url" ./$(BIN) bench --soak 30m --out docs/benchmarks.md $(BENCH_FLAGS)

## bench: benchmark against the seed's design on a throwaway database and write docs/benchmarks.md.
bench: build
	@url=$(DB_URL) && DATABASE_URL="$$url" ./$(BIN) bench --out docs/benchmarks.md $(BENCH_FLAGS)

## clean: the binary, and the test cluster's data (it is rebuilt on the next `make test`).
clean:
	./scripts/test-postgres.sh stop
	rm -rf bin .data/test-postgres "$$(./scripts/test-postgres.sh datadir)"
