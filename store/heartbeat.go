package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/flowfabric/ffreconcile/migrations"
)

// Worker heartbeats live in <river schema>.ffreconcile_worker (see
// migrations.ApplyWorkerTable), one row per running process. Every time is
// the database's clock (now()), never the caller's: processes on different
// hosts then agree on how old a heartbeat is.

// ErrWorkerTableMissing is returned when the heartbeat table does not exist
// in the given schema, or lacks a column: `worker migrate` has not run since
// the table or the column was introduced.
var ErrWorkerTableMissing = errors.New("worker heartbeat table is missing or outdated; run `worker migrate`")

// riverTable returns schema.table quoted for SQL, after checking schema the
// way River's own configuration does. Schema names cannot be bound as
// parameters, so they are validated and quoted, never pasted.
func riverTable(schema, table string) (string, error) {
	if err := migrations.ValidateSchemaName(schema); err != nil {
		return "", err
	}
	return pgx.Identifier{schema, table}.Sanitize(), nil
}

// WorkerHeartbeat is one process's row.
type WorkerHeartbeat struct {
	ClientID string
	Hostname string
	PID      int
	// Version is the build's version; empty is stored as NULL.
	Version     string
	StartedAt   time.Time
	HeartbeatAt time.Time
	// Age is how long ago HeartbeatAt was, by the database's clock (set by
	// ListWorkerHeartbeats and RegisterWorkerHeartbeat).
	Age time.Duration
	// Config is the process's fleet configuration as JSON; nil is stored as
	// NULL (a process of a version that did not record it).
	Config []byte
}

// UpsertWorkerHeartbeat records that the process w.ClientID is alive now.
// A zero w.StartedAt starts a new process record (started_at = now());
// otherwise started_at is set to w.StartedAt, so a row deleted by another
// process's cleanup during a long stall comes back with its true start. It
// returns the stored started_at, which the caller passes on later beats.
// HeartbeatAt and Age of w are ignored.
func UpsertWorkerHeartbeat(ctx context.Context, db DB, schema string, w WorkerHeartbeat) (time.Time, error) {
	table, err := riverTable(schema, migrations.WorkerTableName)
	if err != nil {
		return time.Time{}, err
	}
	var started *time.Time
	if !w.StartedAt.IsZero() {
		started = &w.StartedAt
	}
	var version *string
	if w.Version != "" {
		version = &w.Version
	}
	var config *string
	if w.Config != nil {
		c := string(w.Config)
		config = &c
	}
	var out time.Time
	err = db.QueryRow(ctx, `
		INSERT INTO `+table+` AS w (client_id, hostname, pid, version, started_at, heartbeat_at, config)
		VALUES ($1, $2, $3, $4, COALESCE($5::timestamptz, now()), now(), $6::jsonb)
		ON CONFLICT (client_id) DO UPDATE
		   SET hostname = EXCLUDED.hostname, pid = EXCLUDED.pid, version = EXCLUDED.version,
		       started_at = EXCLUDED.started_at, heartbeat_at = EXCLUDED.heartbeat_at, config = EXCLUDED.config
		RETURNING w.started_at`,
		w.ClientID, w.Hostname, w.PID, version, started, config).Scan(&out)
	if err != nil {
		return time.Time{}, fmt.Errorf("upsert heartbeat of %s: %w", w.ClientID, tableErr(err))
	}
	return out, nil
}

// RegisterWorkerHeartbeat records a starting process, as
// UpsertWorkerHeartbeat does, once accept has approved the other processes
// whose last heartbeat is at most liveFor old (with their Config and Age).
// Registrations of one schema are serialised by an advisory lock, so two
// processes starting at once each see the other, whichever goes first. An
// error from accept is returned as is and nothing is recorded.
func RegisterWorkerHeartbeat(ctx context.Context, db Beginner, schema string, w WorkerHeartbeat, liveFor time.Duration,
	accept func(live []WorkerHeartbeat) error) (time.Time, error) {
	table, err := riverTable(schema, migrations.WorkerTableName)
	if err != nil {
		return time.Time{}, err
	}
	var started time.Time
	err = inTx(ctx, db, func(tx pgx.Tx) (bool, error) {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "ffreconcile.register."+table); err != nil {
			return false, fmt.Errorf("lock registrations: %w", err)
		}
		rows, err := tx.Query(ctx, `
			SELECT client_id, hostname, pid, COALESCE(version, ''), started_at, heartbeat_at,
			       (extract(epoch FROM now() - heartbeat_at) * 1000)::bigint, config::text
			  FROM `+table+`
			 WHERE client_id <> $1 AND heartbeat_at >= now() - $2::bigint * interval '1 millisecond'
			 ORDER BY started_at, client_id`, w.ClientID, liveFor.Milliseconds())
		if err != nil {
			return false, fmt.Errorf("list live processes: %w", tableErr(err))
		}
		live, err := pgx.CollectRows(rows, scanHeartbeat)
		if err != nil {
			return false, fmt.Errorf("list live processes: %w", tableErr(err))
		}
		if err := accept(live); err != nil {
			return false, err
		}
		started, err = UpsertWorkerHeartbeat(ctx, tx, schema, w)
		return err == nil, err
	})
	if err != nil {
		return time.Time{}, err
	}
	return started, nil
}

// scanHeartbeat reads a row of the heartbeat table as the queries above
// select it: the columns, the age in milliseconds and the config as text.
func scanHeartbeat(r pgx.CollectableRow) (WorkerHeartbeat, error) {
	var w WorkerHeartbeat
	var ageMs int64
	var config *string
	err := r.Scan(&w.ClientID, &w.Hostname, &w.PID, &w.Version, &w.StartedAt, &w.HeartbeatAt, &ageMs, &config)
	w.Age = time.Duration(ageMs) * time.Millisecond
	if config != nil {
		w.Config = []byte(*config)
	}
	return w, err
}

// DeleteWorkerHeartbeat removes clientID's row if it is still the record
// started at startedAt, and reports whether it did. Matching the start time
// keeps a stopping process from deleting the row of a successor that reuses
// its client ID (a fixed --client-id) and has already beaten.
func DeleteWorkerHeartbeat(ctx context.Context, db DB, schema, clientID string, startedAt time.Time) (bool, error) {
	table, err := riverTable(schema, migrations.WorkerTableName)
	if err != nil {
		return false, err
	}
	tag, err := db.Exec(ctx, `DELETE FROM `+table+` WHERE client_id = $1 AND started_at = $2`, clientID, startedAt)
	if err != nil {
		return false, fmt.Errorf("delete heartbeat of %s: %w", clientID, tableErr(err))
	}
	return tag.RowsAffected() > 0, nil
}

// DeleteStaleWorkerHeartbeats deletes up to limit rows, oldest first, whose
// last heartbeat is older than olderThan: processes that died without a
// clean stop. The limit bounds the work one beat does whatever was left
// behind; the next beat continues.
func DeleteStaleWorkerHeartbeats(ctx context.Context, db DB, schema string, olderThan time.Duration, limit int) (int64, error) {
	table, err := riverTable(schema, migrations.WorkerTableName)
	if err != nil {
		return 0, err
	}
	tag, err := db.Exec(ctx, `
		DELETE FROM `+table+` WHERE client_id IN (
		    SELECT client_id FROM `+table+`
		     WHERE heartbeat_at < now() - $1::bigint * interval '1 millisecond'
		     ORDER BY heartbeat_at LIMIT $2)`, olderThan.Milliseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("delete stale heartbeats: %w", tableErr(err))
	}
	return tag.RowsAffected(), nil
}

// ListWorkerHeartbeats returns every process's row, most recently started
// first, with its age by the database's clock.
func ListWorkerHeartbeats(ctx context.Context, db DB, schema string) ([]WorkerHeartbeat, error) {
	table, err := riverTable(schema, migrations.WorkerTableName)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `
		SELECT client_id, hostname, pid, COALESCE(version, ''), started_at, heartbeat_at,
		       (extract(epoch FROM now() - heartbeat_at) * 1000)::bigint, config::text
		  FROM `+table+` ORDER BY started_at DESC, client_id`)
	if err != nil {
		return nil, fmt.Errorf("list heartbeats: %w", tableErr(err))
	}
	out, err := pgx.CollectRows(rows, scanHeartbeat)
	if err != nil {
		return nil, fmt.Errorf("list heartbeats: %w", tableErr(err))
	}
	return out, nil
}

// tableErr turns Postgres's undefined_table, and undefined_column (a table
// of an earlier version, without config), into ErrWorkerTableMissing, the
// one failure an operator must act on.
func tableErr(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42703") {
		return fmt.Errorf("%w (%s)", ErrWorkerTableMissing, pgErr.Message)
	}
	return err
}
