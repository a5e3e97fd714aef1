package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// QueuedRows counts one partition's row jobs of one kind that are due and
// not finished.
type QueuedRows struct {
	// Available jobs wait in the queue.
	Available int
	// Running jobs have started and not yet been finalized.
	Running int
}

// QueuedRowJobs returns, per partition, the row jobs of kind in queue that
// are due at at (scheduled_at <= at: a job enqueued ahead of its row's
// deadline counts only from then) and available or running, in River's
// schema. A tick skips the partitions with available jobs: their due rows are
// usually already queued, and scanning them again would only re-offer those
// rows to River's uniqueness check, which under a backlog costs more than the
// actions themselves. The counts tell it when they are not (see fanOut).
// Index: river_job (state, queue, priority, scheduled_at, id), River's fetch
// index — the cost is O(due unfinished jobs of the queue).
func QueuedRowJobs(ctx context.Context, db DB, riverSchema, queue, kind string, at time.Time) (map[int16]QueuedRows, error) {
	rows, err := db.Query(ctx, `
		SELECT (args->>'partition')::smallint, count(*) FILTER (WHERE state = 'available'), count(*) FILTER (WHERE state = 'running')
		  FROM `+pgx.Identifier{riverSchema, "river_job"}.Sanitize()+`
		 WHERE state IN ('available', 'running') AND queue = $1 AND scheduled_at <= $3 AND kind = $2 AND args ? 'partition'
		 GROUP BY 1`, queue, kind, at)
	if err != nil {
		return nil, fmt.Errorf("queued %s jobs: %w", kind, err)
	}
	out := map[int16]QueuedRows{}
	var (
		p              int16
		avail, running int64
	)
	_, err = pgx.ForEachRow(rows, []any{&p, &avail, &running}, func() error {
		out[p] = QueuedRows{Available: int(avail), Running: int(running)}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("queued %s jobs: %w", kind, err)
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
