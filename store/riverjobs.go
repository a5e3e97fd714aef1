package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// PartitionsWithQueuedJobs returns the partitions that have row jobs of kind
// waiting in queue (state available and already due) in River's schema. A
// tick skips them: their due rows are already queued, and scanning them again
// would only re-offer those rows to River's uniqueness check, which under a
// backlog costs more than the actions themselves. They are scanned again once
// their queue is empty; a row whose job is running or retrying does not hold
// its partition back, nor does a job enqueued ahead of its row's deadline
// (available with a future scheduled_at): its partition may hold rows falling
// due after it. Index: river_job (state, queue, priority, scheduled_at, id),
// River's fetch index — the cost is O(due available jobs of the queue).
func PartitionsWithQueuedJobs(ctx context.Context, db DB, riverSchema, queue, kind string) (map[int16]bool, error) {
	rows, err := db.Query(ctx, `
		SELECT DISTINCT (args->>'partition')::smallint FROM `+pgx.Identifier{riverSchema, "river_job"}.Sanitize()+`
		 WHERE state = 'available' AND queue = $1 AND scheduled_at <= now() AND kind = $2 AND args ? 'partition'`, queue, kind)
	if err != nil {
		return nil, fmt.Errorf("partitions with queued %s jobs: %w", kind, err)
	}
	parts, err := pgx.CollectRows(rows, pgx.RowTo[int16])
	if err != nil {
		return nil, fmt.Errorf("partitions with queued %s jobs: %w", kind, err)
	}
	out := make(map[int16]bool, len(parts))
	for _, p := range parts {
		out[p] = true
	}
	return out, nil
}

// Notify sends one notification on channel with payload (pg_notify), in its
// own transaction: listeners receive it at once.
func Notify(ctx context.Context, db DB, channel, payload string) error {
	if _, err := db.Exec(ctx, `SELECT pg_notify($1, $2)`, channel, payload); err != nil {
		return fmt.Errorf("notify %s: %w", channel, err)
	}
	return nil
}
