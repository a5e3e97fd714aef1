package migrations

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// RetentionIndexName is our index on ff_exec_core, the one retention's
// ticks and trims read: FlowFabric's migrations index no column of an
// ended execution's age (its own trim reads a lane's executions whole), so
// without it every retention tick would read every execution. Partial on
// ended executions only (terminal and cancelled: store.EndedPhases), it
// costs nothing to writes of live ones.
const RetentionIndexName = "ffreconcile_exec_core_ended_idx"

// OldRetentionIndexName is the index retention read before it trimmed
// cancelled executions too (partial on 'terminal' alone): ApplyRetentionIndex
// drops it once RetentionIndexName is in place.
const OldRetentionIndexName = "ffreconcile_exec_core_terminal_idx"

// retentionIndex is RetentionIndexName, built online on a large table.
var retentionIndex = partialIndex{
	name: RetentionIndexName, childSuffix: "_ffr_ended_idx",
	table: "ff_exec_core", cols: `(partition_key, terminal_at_ms) WHERE lifecycle_phase IN ('terminal', 'cancelled')`,
	what: "retention's index",
}

func init() {
	o := retentionIndex.object()
	o.Apply = func(ctx context.Context, pool *pgxpool.Pool, _ string) (string, error) {
		if err := ApplyRetentionIndex(ctx, pool); err != nil {
			return "", err
		}
		return fmt.Sprintf("%s: %s on %s is in place", retentionIndex.name, retentionIndex.what, retentionIndex.table), nil
	}
	register(o)
}

// ApplyRetentionIndex creates the retention index on ff_exec_core if it is
// missing (or was left unfinished), then drops the old one
// (OldRetentionIndexName) if it is there; running it again is a no-op.
// `worker migrate` applies it with every object (ApplyObjects).
func ApplyRetentionIndex(ctx context.Context, pool *pgxpool.Pool) error {
	return applyRetentionIndex(ctx, pool, onlineIndexRows)
}

// applyRetentionIndex is ApplyRetentionIndex, built online at onlineRows.
// The old index is dropped only after the new one is valid, so a fleet's
// retention always has one to read. Dropping a partitioned index cannot be
// done concurrently: DROP INDEX takes ff_exec_core's lock for a moment
// (it waits for transactions on the table, and writers wait behind it), a
// catalog change only, once.
func applyRetentionIndex(ctx context.Context, pool *pgxpool.Pool, onlineRows float64) error {
	if err := retentionIndex.apply(ctx, pool, onlineRows); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `DROP INDEX IF EXISTS `+OldRetentionIndexName); err != nil {
		return fmt.Errorf("%s: drop the old index %s: %w", retentionIndex.what, OldRetentionIndexName, err)
	}
	return nil
}
