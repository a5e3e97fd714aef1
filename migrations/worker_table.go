package migrations

import (
	"context"
	"fmt"

	"github.com/flowfabric/ffreconcile/internal/dbnames"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// WorkerTableName is the table, in River's schema, where each worker process
// records its heartbeat. River's open-source edition keeps no table of live
// clients (only the elected leader, in river_leader), so `worker status`
// could not otherwise tell which processes are running.
const WorkerTableName = dbnames.WorkerTable

// workerTableDDL is the heartbeat table, with %s standing for its
// schema-qualified name. It holds one row per live process, so it needs no
// index beyond its primary key: the bounded cleanup of stale rows reads the
// whole table, which is a handful of rows. heartbeat_at is written with the
// database's clock, so ages compare across hosts whose clocks disagree.
const workerTableDDL = `CREATE TABLE IF NOT EXISTS %s (
    client_id    text PRIMARY KEY,
    hostname     text NOT NULL,
    pid          integer NOT NULL,
    version      text,
    started_at   timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL,
    config       jsonb
)`

// workerTableConfigDDL adds the config column to a table created before it
// existed. It holds the process's fleet configuration (the settings that
// shape its jobs), which a starting process compares with the live ones'.
const workerTableConfigDDL = `ALTER TABLE %s ADD COLUMN IF NOT EXISTS config jsonb`

// workerTableConnTagDDL adds the conn_tag column to a table created before
// it existed. A process records there the tag its connections carry in
// their application_name, by which the others tell, from pg_stat_activity,
// that it died without a clean stop (it has no connection left) and take
// over its leadership and running jobs at once. NULL for a process of an
// earlier version, or one whose connections may not carry the tag
// (--poll-only, behind a pooler): such a process is never judged by its
// connections.
const workerTableConnTagDDL = `ALTER TABLE %s ADD COLUMN IF NOT EXISTS conn_tag text`

// ApplyWorkerTable creates schema (if missing) and the worker heartbeat
// table in it (if missing), and adds the config and conn_tag columns to a
// table of an earlier version. Running it again is a no-op.
//
// It runs apart from ApplyRiver because the table is ours, not River's:
// rivermigrate knows nothing of it and must never be asked to.
func ApplyWorkerTable(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if err := ValidateSchemaName(schema); err != nil {
		return err
	}
	// CREATE … IF NOT EXISTS is not safe against itself: two processes
	// migrating at once can both pass the existence check and one then fails
	// on a duplicate catalog entry. A transaction-scoped advisory lock
	// serialises them; the loser then finds the table and does nothing.
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('ffreconcile.migrations.worker_table'))`); err != nil {
			return fmt.Errorf("lock: %w", err)
		}
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
			return fmt.Errorf("create schema: %w", err)
		}
		table := pgx.Identifier{schema, WorkerTableName}.Sanitize()
		if _, err := tx.Exec(ctx, fmt.Sprintf(workerTableDDL, table)); err != nil {
			return fmt.Errorf("create table: %w", err)
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(workerTableConfigDDL, table)); err != nil {
			return fmt.Errorf("add config column: %w", err)
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(workerTableConnTagDDL, table)); err != nil {
			return fmt.Errorf("add conn_tag column: %w", err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("worker heartbeat table %s.%s: %w", schema, WorkerTableName, err)
	}
	return nil
}
