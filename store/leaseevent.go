package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// LeaseEventChannel is the NOTIFY channel that the ff_lease_event AFTER
// INSERT trigger signals with the new event_id as payload.
const LeaseEventChannel = "ff_lease_event"

// leaseEventDB is what the lease event queries need: *pgxpool.Pool,
// *pgxpool.Conn, *pgx.Conn and pgx.Tx all satisfy it.
type leaseEventDB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
}

// LeaseEvent is one ff_lease_event row, as stored (bare UUID execution id,
// NULLs as nil pointers).
type LeaseEvent struct {
	EventID      int64
	ExecutionID  string
	LeaseID      *string
	EventType    string
	OccurredAtMs int64
	PartitionKey int32
	Namespace    *string
	InstanceTag  *string
}

// LeaseEventsAfter returns up to limit rows with event_id > afterID in
// event_id order, across all partitions and unfiltered.
//
// Reading unfiltered is deliberate: event ids come from one global sequence,
// so a caller can only tell a missing id (an uncommitted or rolled-back
// insert) from a filtered-out one if it sees every row. Partition, namespace
// and tag filters are applied by the caller.
//
// Index: the primary key (event_id), range scan from afterID.
func LeaseEventsAfter(ctx context.Context, db leaseEventDB, afterID int64, limit int) ([]LeaseEvent, error) {
	rows, err := db.Query(ctx, `
SELECT event_id, execution_id, lease_id, event_type, occurred_at_ms,
       partition_key, namespace, instance_tag
FROM ff_lease_event
WHERE event_id > $1
ORDER BY event_id
LIMIT $2`, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("query ff_lease_event after %d: %w", afterID, err)
	}
	events, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (LeaseEvent, error) {
		var e LeaseEvent
		err := row.Scan(&e.EventID, &e.ExecutionID, &e.LeaseID, &e.EventType, &e.OccurredAtMs,
			&e.PartitionKey, &e.Namespace, &e.InstanceTag)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("read ff_lease_event after %d: %w", afterID, err)
	}
	return events, nil
}

// MaxLeaseEventID returns the highest committed event_id, or 0 when the table
// is empty.
//
// Index: the primary key (event_id), one backward index step.
func MaxLeaseEventID(ctx context.Context, db leaseEventDB) (int64, error) {
	var id int64
	if err := db.QueryRow(ctx, `SELECT COALESCE(max(event_id), 0) FROM ff_lease_event`).Scan(&id); err != nil {
		return 0, fmt.Errorf("query max ff_lease_event.event_id: %w", err)
	}
	return id, nil
}

// ListenLeaseEvents subscribes the session to LeaseEventChannel. db must be a
// single connection that the caller keeps (a LISTEN on a pool is lost when the
// connection goes back).
func ListenLeaseEvents(ctx context.Context, db leaseEventDB) error {
	if _, err := db.Exec(ctx, `LISTEN `+LeaseEventChannel); err != nil {
		return fmt.Errorf("listen %s: %w", LeaseEventChannel, err)
	}
	return nil
}

// RunningTransactions lists the transactions in progress in the caller's
// database, other than the caller's own, as virtual transaction ids
// ("3/1042"; prepared transactions appear as "-1/<xid>"). Only they can
// insert into its tables: a backend is connected to one database for life,
// so transactions of other databases (pg_locks lists the whole server's)
// are left out, and a long one there cannot stall a reader here.
//
// Every transaction holds an exclusive lock on its own virtual transaction id
// from its first statement to its end, whether or not it has been assigned an
// xid yet, and a prepared transaction keeps the lock on its xid. So unlike
// pg_snapshot_xip(pg_current_snapshot()), which leaves out transactions with
// no xid yet and those with an xid at or above the snapshot's xmax, this list
// contains every transaction that could still commit a row. It is the same
// signal CREATE INDEX CONCURRENTLY waits on.
//
// inRecovery reports a hot standby: its lock table shows only local
// transactions, not the primary's writers, so callers must not rely on the
// list there.
//
// Index: none; pg_locks and pg_stat_activity are in-memory views.
func RunningTransactions(ctx context.Context, db leaseEventDB) (vxids []string, inRecovery bool, err error) {
	err = db.QueryRow(ctx, `
SELECT pg_is_in_recovery(),
       COALESCE(array_agg(DISTINCT l.virtualtransaction), '{}')
FROM pg_locks l
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype IN ('virtualxid', 'transactionid')
  AND l.granted
  AND l.pid IS DISTINCT FROM pg_backend_pid()
  AND (a.datname = current_database()
       OR (l.pid IS NULL AND EXISTS (SELECT 1 FROM pg_prepared_xacts p
                                      WHERE p.transaction = l.transactionid AND p.database = current_database())))`).Scan(&inRecovery, &vxids)
	if err != nil {
		return nil, false, fmt.Errorf("list running transactions: %w", err)
	}
	return vxids, inRecovery, nil
}

// StillRunning returns the members of vxids (from RunningTransactions) that
// have not finished yet. A transaction reported finished here has left the
// proc array, so any snapshot taken afterwards sees its outcome.
//
// Index: none; pg_locks is an in-memory view of the lock table.
func StillRunning(ctx context.Context, db leaseEventDB, vxids []string) ([]string, error) {
	if len(vxids) == 0 {
		return nil, nil
	}
	var running []string
	err := db.QueryRow(ctx, `
SELECT COALESCE(array_agg(DISTINCT virtualtransaction), '{}')
FROM pg_locks
WHERE locktype IN ('virtualxid', 'transactionid')
  AND granted
  AND virtualtransaction = ANY ($1::text[])`, vxids).Scan(&running)
	if err != nil {
		return nil, fmt.Errorf("check running transactions: %w", err)
	}
	return running, nil
}

// LeaseEventsTrimmedThrough returns the highest lease event id outbox
// retention has deleted: every event at or below it that ever committed may
// be gone. 0 when nothing was deleted, or when the table of trim marks does
// not exist (no fleet with outbox retention migrated it). Lease history
// reads it to tell a consumer behind the trim what it missed.
//
// Index: the table's primary key.
func LeaseEventsTrimmedThrough(ctx context.Context, db DB) (int64, error) {
	const outbox = "ff_lease_event"
	var through int64
	err := db.QueryRow(ctx, `SELECT COALESCE((SELECT trimmed_through FROM ffreconcile_outbox_trim WHERE outbox = $1), 0)`,
		outbox).Scan(&through)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return 0, nil
	}
	// The scalar subquery makes one row either way: no ErrNoRows.
	if err != nil {
		return 0, fmt.Errorf("read how far %s was trimmed: %w", outbox, err)
	}
	return through, nil
}
