package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/flowfabric/ffreconcile/internal/dbnames"
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
	if err := dbnames.ValidateSchemaName(schema); err != nil {
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
	// ConnTag is the tag every connection of the process carries at the end
	// of its application_name (ConnTagged), by which the others tell that
	// it has none left (DepartedWorkers). Empty is stored as NULL: the
	// process is then never judged by its connections.
	ConnTag string
}

// ConnTagged is the application_name of a connection of the process whose
// ConnTag is tag: name, a space and the tag (just name when tag is empty).
// DepartedWorkers recognises a connection by that suffix.
func ConnTagged(name, tag string) string {
	if tag == "" {
		return name
	}
	return name + " " + tag
}

// UpsertWorkerHeartbeat records that the process w.ClientID is alive now.
// A zero w.StartedAt starts a new process record (started_at = now());
// otherwise started_at is set to w.StartedAt, so a row deleted by another
// process's cleanup during a long stall comes back with its true start. It
// returns the stored started_at, which the caller passes on later beats.
// HeartbeatAt and Age of w are ignored.
func UpsertWorkerHeartbeat(ctx context.Context, db DB, schema string, w WorkerHeartbeat) (time.Time, error) {
	table, err := riverTable(schema, dbnames.WorkerTable)
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
		INSERT INTO `+table+` AS w (client_id, hostname, pid, version, started_at, heartbeat_at, config, conn_tag)
		VALUES ($1, $2, $3, $4, COALESCE($5::timestamptz, now()), now(), $6::jsonb, NULLIF($7, ''))
		ON CONFLICT (client_id) DO UPDATE
		   SET hostname = EXCLUDED.hostname, pid = EXCLUDED.pid, version = EXCLUDED.version,
		       started_at = EXCLUDED.started_at, heartbeat_at = EXCLUDED.heartbeat_at, config = EXCLUDED.config,
		       conn_tag = EXCLUDED.conn_tag
		RETURNING w.started_at`,
		w.ClientID, w.Hostname, w.PID, version, started, config, w.ConnTag).Scan(&out)
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
//
// It also returns the row it replaced when that was a previous incarnation
// of w.ClientID (a fixed client ID, restarted) that recorded another
// connection tag and is disconnected (see DepartedWorkers): the process
// died without a clean stop, and what it held is its successor's to take
// over, since no other process will see its row again.
func RegisterWorkerHeartbeat(ctx context.Context, db Beginner, schema string, w WorkerHeartbeat, liveFor time.Duration,
	accept func(live []WorkerHeartbeat) error) (time.Time, *DepartedWorker, error) {
	table, err := riverTable(schema, dbnames.WorkerTable)
	if err != nil {
		return time.Time{}, nil, err
	}
	var started time.Time
	var previous *DepartedWorker
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
		prev, err := queryDeparted(ctx, tx, schema, `
			 WHERE w.client_id = $1 AND w.conn_tag IS DISTINCT FROM NULLIF($2, '') AND d.disconnected`,
			w.ClientID, w.ConnTag, int64(0))
		if err != nil {
			return false, err
		}
		if len(prev) == 1 {
			previous = &prev[0]
		}
		started, err = UpsertWorkerHeartbeat(ctx, tx, schema, w)
		return err == nil, err
	})
	if err != nil {
		return time.Time{}, nil, err
	}
	return started, previous, nil
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
	table, err := riverTable(schema, dbnames.WorkerTable)
	if err != nil {
		return false, err
	}
	tag, err := db.Exec(ctx, `DELETE FROM `+table+` WHERE client_id = $1 AND started_at = $2`, clientID, startedAt)
	if err != nil {
		return false, fmt.Errorf("delete heartbeat of %s: %w", clientID, tableErr(err))
	}
	return tag.RowsAffected() > 0, nil
}

// DepartedWorker is a row of the heartbeat table whose process is gone.
type DepartedWorker struct {
	ClientID  string
	StartedAt time.Time
	// Disconnected: the process recorded a connection tag and no
	// connection of the server carries it any more. It died, or lost the
	// database, without a clean stop (which deletes the row first).
	Disconnected bool
	// Stale: its last heartbeat is older than the stale age.
	Stale bool
	// LeaderElectedAt is the elected_at of the River leadership River's
	// river_leader gives the process, zero when it is not the leader.
	LeaderElectedAt time.Time
	// SeenAt is when the row was found so, by the database's clock. A
	// disconnected process started nothing after it: a job running under
	// its client ID since then is a successor's (the same fixed ID,
	// restarted meanwhile).
	SeenAt time.Time
}

// DepartedWorkers returns up to limit rows of schema's heartbeat table, other
// than self's, whose process is gone: disconnected (it recorded a connection
// tag and pg_stat_activity shows no connection carrying it), or stale (its
// last heartbeat is older than staleAfter); longest silent first, each with
// the River leadership it holds, if any.
//
// A process is judged by its connections only if the caller can see its
// own: selfTag must be non-empty and this statement's own connection must
// show it in pg_stat_activity. A pooler that rewrites application_name, or
// a server that hides it, then makes no process look dead.
//
// Cost: the heartbeat table (a row per process, no index needed) and one
// read of pg_stat_activity (a row per server connection); river_leader by its
// primary key's single row.
func DepartedWorkers(ctx context.Context, db DB, schema, self, selfTag string, staleAfter time.Duration, limit int) ([]DepartedWorker, error) {
	return queryDeparted(ctx, db, schema, `
		 WHERE w.client_id <> $1
		   AND (d.disconnected OR w.heartbeat_at < now() - $3::bigint * interval '1 millisecond')
		 ORDER BY w.heartbeat_at, w.client_id
		 LIMIT $4`, self, selfTag, staleAfter.Milliseconds(), limit)
}

// queryDeparted selects the rows of schema's heartbeat table that where
// (over w, the row, and d, its disconnected flag) keeps, as DepartedWorkers:
// $1 is the caller's client ID, $2 its tag, $3 the stale age in
// milliseconds.
func queryDeparted(ctx context.Context, db DB, schema, where string, args ...any) ([]DepartedWorker, error) {
	table, err := riverTable(schema, dbnames.WorkerTable)
	if err != nil {
		return nil, err
	}
	leader := pgx.Identifier{schema, "river_leader"}.Sanitize()
	rows, err := db.Query(ctx, `
		WITH apps AS MATERIALIZED (
		    SELECT pid, application_name FROM pg_stat_activity WHERE application_name <> ''
		), judge AS (
		    SELECT $2 <> '' AND EXISTS (
		        SELECT 1 FROM apps WHERE pid = pg_backend_pid() AND right(application_name, length($2) + 1) = ' ' || $2) AS ok
		)
		SELECT w.client_id, w.started_at, d.disconnected, w.heartbeat_at < now() - $3::bigint * interval '1 millisecond', l.elected_at,
		       statement_timestamp()
		  FROM `+table+` w
		 CROSS JOIN judge
		 CROSS JOIN LATERAL (
		     SELECT judge.ok AND w.conn_tag IS NOT NULL AND NOT EXISTS (
		         SELECT 1 FROM apps a WHERE right(a.application_name, length(w.conn_tag) + 1) = ' ' || w.conn_tag) AS disconnected
		 ) d
		  LEFT JOIN `+leader+` l ON l.leader_id = w.client_id`+where, args...)
	if err != nil {
		return nil, fmt.Errorf("find departed workers: %w", tableErr(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DepartedWorker, error) {
		var d DepartedWorker
		var elected *time.Time
		err := r.Scan(&d.ClientID, &d.StartedAt, &d.Disconnected, &d.Stale, &elected, &d.SeenAt)
		if elected != nil {
			d.LeaderElectedAt = *elected
		}
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("find departed workers: %w", tableErr(err))
	}
	return out, nil
}

// ListWorkerHeartbeats returns every process's row, most recently started
// first, with its age by the database's clock.
func ListWorkerHeartbeats(ctx context.Context, db DB, schema string) ([]WorkerHeartbeat, error) {
	table, err := riverTable(schema, dbnames.WorkerTable)
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

// LeadsWithOthers reports whether clientID holds schema's River leadership
// while another process of the schema beat within liveFor: a leader about
// to stop then has someone to hand its ticks to (fleet.Fleet.Stop).
//
// Cost: river_leader's single row and the heartbeat table (a row per
// process, no index needed).
func LeadsWithOthers(ctx context.Context, db DB, schema, clientID string, liveFor time.Duration) (bool, error) {
	table, err := riverTable(schema, dbnames.WorkerTable)
	if err != nil {
		return false, err
	}
	leader := pgx.Identifier{schema, "river_leader"}.Sanitize()
	var ok bool
	err = db.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM `+leader+` WHERE leader_id = $1)
		   AND EXISTS (SELECT 1 FROM `+table+`
		                WHERE client_id <> $1 AND heartbeat_at >= now() - $2::bigint * interval '1 millisecond')`,
		clientID, liveFor.Milliseconds()).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("read the leadership: %w", tableErr(err))
	}
	return ok, nil
}
