package migrations

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

// RetentionIndexName is our index on ff_exec_core, the one retention's
// ticks and trims read: FlowFabric's migrations index no column of a
// terminal execution's age (its own trim reads a lane's executions whole),
// so without it every retention tick would read every execution. Partial
// on terminal executions only, it costs nothing to writes of live ones.
const RetentionIndexName = "ffreconcile_exec_core_terminal_idx"

// retentionIndex is RetentionIndexName, built online on a large table.
var retentionIndex = partialIndex{
	name: RetentionIndexName, childSuffix: "_ffr_terminal_idx",
	table: "ff_exec_core", cols: `(partition_key, terminal_at_ms) WHERE lifecycle_phase = 'terminal'`,
	what: "retention's index",
}

func init() { register(retentionIndex.object()) }

// ApplyRetentionIndex creates the retention index on ff_exec_core if it is
// missing (or was left unfinished); running it again is a no-op. `worker
// migrate` applies it with every object (ApplyObjects).
func ApplyRetentionIndex(ctx context.Context, pool *pgxpool.Pool) error {
	return retentionIndex.apply(ctx, pool, onlineIndexRows)
}
