# FlowFabric reconcilers on River. `make run` and `make test` need nothing but
# Go: scripts/ensure-postgres.sh finds or starts a local PostgreSQL.
GO        ?= go
BIN       := bin/worker
# Honour DATABASE_URL when set; otherwise ensure-postgres.sh prints the
# local server's URL (starting one if needed).
DB_URL     = $$(./scripts/ensure-postgres.sh)

.PHONY: all build run migrate test test-short lint bench clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/worker

## run: start (or find) PostgreSQL, migrate River and the ff_* tables, run the worker with River UI.
run: build
	@url=$(DB_URL) && \
	DATABASE_URL="$$url" ./$(BIN) migrate --ff-schema && \
	DATABASE_URL="$$url" ./$(BIN) run

## migrate: create River's tables and the ff_* tables in $DATABASE_URL (or the local server).
migrate: build
	@url=$(DB_URL) && DATABASE_URL="$$url" ./$(BIN) migrate --ff-schema

## test: lint, then every test against a real PostgreSQL (each test makes its own database).
test: lint
	@url=$(DB_URL) && TEST_DATABASE_URL="$${TEST_DATABASE_URL:-$$url}" $(GO) test -count=1 -p 1 -timeout 20m ./...

## lint: go vet and gofmt.
lint:
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

clean:
	rm -rf bin
