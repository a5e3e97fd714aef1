package store

import (
	"context"
	"fmt"
	"strconv"
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
		SELECT args->>'partition', count(*) FILTER (WHERE state = 'available'), count(*) FILTER (WHERE state = 'running')
		  FROM `+pgx.Identifier{riverSchema, "river_job"}.Sanitize()+`
		 WHERE state IN ('available', 'running') AND queue = $1 AND scheduled_at <= $3 AND kind = $2
		   AND jsonb_typeof(args->'partition') = 'number'
		 GROUP BY 1`, queue, kind, at)
	if err != nil {
		return nil, fmt.Errorf("queued %s jobs: %w", kind, err)
	}
	out := map[int16]QueuedRows{}
	var (
		arg            string
		avail, running int64
	)
	_, err = pgx.ForEachRow(rows, []any{&arg, &avail, &running}, func() error {
		if p, ok := partitionArg(arg); ok {
			out[p] = QueuedRows{Available: int(avail), Running: int(running)}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("queued %s jobs: %w", kind, err)
	}
	return out, nil
}

// PartitionScans is what one partition's unfinished scan jobs are doing.
type PartitionScans struct {
	// Waiting: a scan waits in the queue (available) and has read nothing yet.
	Waiting bool
	// Started is the largest id among the partition's scans that have started
	// or cannot start now (running, retryable, scheduled, pending); 0: none.
	Started int64
}

// UnfinishedScans returns, per partition, the unfinished scan jobs of kind in
// queue, in River's schema: a tick leaves a partition whose scan is waiting
// alone and gives one whose scan has started a follow-up (see the jobs
// package's "Follow-up scans"). Index: river_job (state, queue, priority,
// scheduled_at, id), River's fetch index — the cost is O(unfinished jobs of
// the queue), at most a few per partition.
func UnfinishedScans(ctx context.Context, db DB, riverSchema, queue, kind string) (map[int16]PartitionScans, error) {
	rows, err := db.Query(ctx, `
		SELECT args->>'partition', bool_or(state = 'available'), coalesce(max(id) FILTER (WHERE state <> 'available'), 0)
		  FROM `+pgx.Identifier{riverSchema, "river_job"}.Sanitize()+`
		 WHERE state IN ('available', 'running', 'retryable', 'scheduled', 'pending') AND queue = $1 AND kind = $2
		   AND jsonb_typeof(args->'partition') = 'number'
		 GROUP BY 1`, queue, kind)
	if err != nil {
		return nil, fmt.Errorf("unfinished %s jobs: %w", kind, err)
	}
	out := map[int16]PartitionScans{}
	var (
		arg     string
		waiting bool
		started int64
	)
	_, err = pgx.ForEachRow(rows, []any{&arg, &waiting, &started}, func() error {
		if p, ok := partitionArg(arg); ok {
			out[p] = PartitionScans{Waiting: waiting, Started: started}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("unfinished %s jobs: %w", kind, err)
	}
	return out, nil
}

// partitionArg reads a job's "partition" arg, a JSON number, as the text
// Postgres returns for it (->>, one text per number). Jobs whose args hold no
// partition River could decode (1.5, 99999, or not a number, filtered in SQL)
// are left out: they were inserted by hand, and the workers cancel them when
// they run (see the jobs package's validation), so they must not fail a tick
// meanwhile.
func partitionArg(arg string) (int16, bool) {
	p, err := strconv.ParseInt(arg, 10, 16)
	return int16(p), err == nil
}

// Notify sends one notification on channel with payload (pg_notify), in its
// own transaction: listeners receive it at once.
func Notify(ctx context.Context, db DB, channel, payload string) error {
	if _, err := db.Exec(ctx, `SELECT pg_notify($1, $2)`, channel, payload); err != nil {
		return fmt.Errorf("notify %s: %w", channel, err)
	}
	return nil
}

// RunningJobsOf returns the ids of up to limit jobs that River's river_job
// shows running in an attempt by clientID (the last entry of attempted_by:
// an earlier attempt by it that another process has since taken over does
// not count) that started before before, lowest id first.
// Index: river_job (state, queue, priority, scheduled_at, id), River's fetch
// index, whose leading column is the state: the cost is O(running jobs of the
// whole fleet), bounded by the row workers of its processes.
func RunningJobsOf(ctx context.Context, db DB, riverSchema, clientID string, before time.Time, limit int) ([]int64, error) {
	rows, err := db.Query(ctx, `
		SELECT id FROM `+pgx.Identifier{riverSchema, "river_job"}.Sanitize()+`
		 WHERE state = 'running' AND attempted_by[cardinality(attempted_by)] = $1 AND attempted_at < $3
		 ORDER BY id LIMIT $2`, clientID, limit, before)
	if err != nil {
		return nil, fmt.Errorf("running jobs of %s: %w", clientID, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("running jobs of %s: %w", clientID, err)
	}
	return ids, nil
}

// KindState is a River job kind and state, as FleetJobCounts keys them.
type KindState struct{ Kind, State string }

// FleetJobCounts counts the fleet's River jobs (kinds ff.*) in riverSchema
// by kind and state, for the metrics. Cost: river_job's rows of kinds ff.%,
// every state (River keeps finished jobs for their retention); no index
// narrows it, so callers read it at most once per scrape interval.
func FleetJobCounts(ctx context.Context, db DB, riverSchema string) (map[KindState]int64, error) {
	rows, err := db.Query(ctx, `SELECT kind, state::text, count(*) FROM `+
		pgx.Identifier{riverSchema, "river_job"}.Sanitize()+` WHERE kind LIKE 'ff.%' GROUP BY 1, 2`)
	if err != nil {
		return nil, fmt.Errorf("count the fleet's River jobs: %w", err)
	}
	counts := map[KindState]int64{}
	var (
		k KindState
		n int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&k.Kind, &k.State, &n}, func() error {
		counts[k] = n
		return nil
	}); err != nil {
		return nil, fmt.Errorf("count the fleet's River jobs: %w", err)
	}
	return counts, nil
}
