package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/internal/dbnames"
)

// Read-only queries on River's tables for `worker status`. River's schema is
// configurable, so every table name is schema-qualified through riverTable
// (validated, quoted); values are always bound.

// RiverJobStates lists River's job states in the order `worker status`
// shows them: the unfinished states first, the way a job moves through
// them, then the finalized ones.
var RiverJobStates = []string{
	"available", "scheduled", "pending", "running", "retryable",
	"completed", "discarded", "cancelled",
}

// UnfinishedJobStates are the states of jobs that may still run.
var UnfinishedJobStates = []string{"available", "scheduled", "pending", "running", "retryable"}

// RiverSchemaExists reports whether River's tables are in schema.
func RiverSchemaExists(ctx context.Context, db DB, schema string) (bool, error) {
	table, err := riverTable(schema, "river_job")
	if err != nil {
		return false, err
	}
	var ok bool
	if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&ok); err != nil {
		return false, fmt.Errorf("look for River's tables in schema %s: %w", schema, err)
	}
	return ok, nil
}

// CheckRiverSchema returns an error saying what to run when River's tables
// are not in schema of db's database, naming the database it looked in: a
// database never migrated (or the wrong one, say the server's maintenance
// database) then fails with the fix, not with River's first query's
// "relation does not exist". Index: none; to_regclass reads the catalog.
func CheckRiverSchema(ctx context.Context, db DB, schema string) error {
	table, err := riverTable(schema, "river_job")
	if err != nil {
		return err
	}
	var ok bool
	var database string
	if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, current_database()`, table).Scan(&ok, &database); err != nil {
		return fmt.Errorf("look for River's tables in schema %s: %w", schema, err)
	}
	if !ok {
		return fmt.Errorf("River's tables are missing from schema %q of database %q: run `worker migrate` "+
			"(with --river-schema %s) against it, or point --database-url at the database that has them", schema, database, schema)
	}
	return nil
}

// WorkerTableExists reports whether the heartbeat table is in schema.
func WorkerTableExists(ctx context.Context, db DB, schema string) (bool, error) {
	table, err := riverTable(schema, dbnames.WorkerTable)
	if err != nil {
		return false, err
	}
	var ok bool
	if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&ok); err != nil {
		return false, fmt.Errorf("look for the worker heartbeat table in schema %s: %w", schema, err)
	}
	return ok, nil
}

// QueueStateCount is the number of jobs of one queue in one state.
type QueueStateCount struct {
	Queue string
	State string
	Jobs  int64
}

// RiverQueueDepth counts the jobs of each of queues by state. Only states
// that have jobs are returned. It reads every job of those queues, finished
// ones included, so its cost grows with the completed-job retention; that
// is acceptable for an operator's command, not for a hot path.
func RiverQueueDepth(ctx context.Context, db DB, schema string, queues []string) ([]QueueStateCount, error) {
	table, err := riverTable(schema, "river_job")
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `
		SELECT queue, state::text, count(*) FROM `+table+`
		 WHERE queue = ANY($1::text[])
		 GROUP BY 1, 2 ORDER BY 1, 2`, queues)
	if err != nil {
		return nil, fmt.Errorf("count River jobs by queue and state: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (QueueStateCount, error) {
		var c QueueStateCount
		err := r.Scan(&c.Queue, &c.State, &c.Jobs)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("count River jobs by queue and state: %w", err)
	}
	return out, nil
}

// KindCount is the number of jobs of one kind.
type KindCount struct {
	Kind string
	Jobs int64
}

// RiverUnfinishedByKind counts the jobs of queues that may still run
// (UnfinishedJobStates), by kind, most first.
func RiverUnfinishedByKind(ctx context.Context, db DB, schema string, queues []string) ([]KindCount, error) {
	table, err := riverTable(schema, "river_job")
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `
		SELECT kind, count(*) FROM `+table+`
		 WHERE queue = ANY($1::text[]) AND state::text = ANY($2::text[])
		 GROUP BY 1 ORDER BY 2 DESC, 1`, queues, UnfinishedJobStates)
	if err != nil {
		return nil, fmt.Errorf("count unfinished River jobs by kind: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (KindCount, error) {
		var c KindCount
		err := r.Scan(&c.Kind, &c.Jobs)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("count unfinished River jobs by kind: %w", err)
	}
	return out, nil
}

// RiverLeader is the elected leader as river_leader records it.
type RiverLeader struct {
	LeaderID  string
	ElectedAt time.Time
	ExpiresAt time.Time
	// ElectedAgo and ExpiresIn are measured by the database's clock, the
	// one River writes the row with. ExpiresIn is negative when the
	// leadership has lapsed without a successor (every client stopped or
	// lost the database).
	ElectedAgo time.Duration
	ExpiresIn  time.Duration
}

// CurrentRiverLeader returns the leader of schema's River clients, or nil
// when none has been elected (no client runs, or none ever did).
func CurrentRiverLeader(ctx context.Context, db DB, schema string) (*RiverLeader, error) {
	table, err := riverTable(schema, "river_leader")
	if err != nil {
		return nil, err
	}
	var l RiverLeader
	var agoMs, inMs int64
	err = db.QueryRow(ctx, `
		SELECT leader_id, elected_at, expires_at,
		       (extract(epoch FROM now() - elected_at) * 1000)::bigint,
		       (extract(epoch FROM expires_at - now()) * 1000)::bigint
		  FROM `+table+` ORDER BY expires_at DESC LIMIT 1`).
		Scan(&l.LeaderID, &l.ElectedAt, &l.ExpiresAt, &agoMs, &inMs)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read River leader: %w", err)
	}
	l.ElectedAgo = time.Duration(agoMs) * time.Millisecond
	l.ExpiresIn = time.Duration(inMs) * time.Millisecond
	return &l, nil
}
