package migrations

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowfabric/ffreconcile/internal/dbnames"
)

// OutboxTrimTableName is our table, next to FlowFabric's (the search
// path's schema), recording how far outbox retention has deleted each
// outbox: a lease-history consumer whose cursor is behind that point is
// told that events were deleted, instead of silently skipping them.
const OutboxTrimTableName = dbnames.OutboxTrimTable

// outboxTrimDDL holds one row per outbox table (ff_lease_event,
// ff_completion_event): the highest event id outbox retention deleted from
// it. It never holds more than a handful of rows.
const outboxTrimDDL = `CREATE TABLE IF NOT EXISTS ffreconcile_outbox_trim (
    outbox          text        PRIMARY KEY,
    trimmed_through bigint      NOT NULL,
    trimmed_at      timestamptz NOT NULL
)`

// outboxTrimColumns are the columns outbox retention and lease history use.
var outboxTrimColumns = []string{"outbox", "trimmed_through", "trimmed_at"}

func init() {
	register(Object{
		Name: OutboxTrimTableName, DDL: outboxTrimDDL,
		Apply: func(ctx context.Context, pool *pgxpool.Pool, _ string) (string, error) {
			if err := ApplyOutboxTrimTable(ctx, pool); err != nil {
				return "", err
			}
			return OutboxTrimTableName + ": outbox retention's trim marks are in place", nil
		},
		Check: func(ctx context.Context, pool *pgxpool.Pool, _ string) error {
			return checkColumns(ctx, pool, OutboxTrimTableName, outboxTrimColumns, "run `worker migrate`")
		},
	})
}

// ApplyOutboxTrimTable creates the outbox trim table if it is missing.
// Running it again is a no-op. Like the heartbeat table it is ours, so
// `worker migrate` applies it with or without --ff-schema.
func ApplyOutboxTrimTable(ctx context.Context, pool *pgxpool.Pool) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// See ApplyWorkerTable: CREATE … IF NOT EXISTS races itself.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('ffreconcile.migrations.outbox_trim'))`); err != nil {
			return fmt.Errorf("lock: %w", err)
		}
		_, err := tx.Exec(ctx, outboxTrimDDL)
		return err
	})
	if err != nil {
		return fmt.Errorf("outbox trim table %s: %w", OutboxTrimTableName, err)
	}
	return nil
}
