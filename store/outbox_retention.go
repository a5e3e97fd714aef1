package store

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/flowfabric/ffreconcile/internal/dbnames"
)

// ErrOutboxTrimTableMissing: the outbox trim table does not exist;
// `worker migrate` creates it.
var ErrOutboxTrimTableMissing = errors.New("outbox trim table ffreconcile_outbox_trim is missing; run `worker migrate`")

// OutboxTrimTable is outbox retention's table of trim marks (see
// LeaseEventsTrimmedThrough), ours.
const OutboxTrimTable = dbnames.OutboxTrimTable

// OutboxTrimResult says what one outbox trim statement deleted.
type OutboxTrimResult struct {
	// Deleted events.
	Deleted int
	// Through is the highest event id deleted (0 when none).
	Through int64
	// OldestMs is the oldest deleted event's time (0 when none).
	OldestMs int64
}

// trimLeaseEventsSQL deletes, of the $2 oldest lease events by event_id,
// those before the first one whose occurred_at_ms is at or after $1 (the
// cutoff), and raises the lease outbox's trimmed-through mark to the
// highest id deleted, in the same statement. Events are deleted from the
// oldest on and never past a recent one, so what is left of the outbox is
// always a suffix of it: a lease-history cursor at or above the mark has
// lost nothing. Index: the primary key (event_id), O(batch).
const trimLeaseEventsSQL = `
WITH head AS (
    SELECT event_id, occurred_at_ms FROM ff_lease_event ORDER BY event_id LIMIT $2
), stop AS (
    SELECT min(event_id) AS id FROM head WHERE occurred_at_ms >= $1
), gone AS (
    DELETE FROM ff_lease_event t USING head h
     WHERE t.event_id = h.event_id AND h.event_id < COALESCE((SELECT id FROM stop), 9223372036854775807)
    RETURNING t.event_id, t.occurred_at_ms
), mark AS (
    INSERT INTO ffreconcile_outbox_trim AS m (outbox, trimmed_through, trimmed_at)
    SELECT 'ff_lease_event', max(event_id), now() FROM gone HAVING count(*) > 0
    ON CONFLICT (outbox) DO UPDATE
       SET trimmed_through = GREATEST(m.trimmed_through, EXCLUDED.trimmed_through), trimmed_at = EXCLUDED.trimmed_at
)
SELECT count(*), COALESCE(max(event_id), 0), COALESCE(min(occurred_at_ms), 0) FROM gone`

// TrimLeaseEvents deletes up to limit of the oldest lease events that
// occurred before cutoffMs, whatever their execution's state, and records
// how far it got (LeaseEventsTrimmedThrough). Fewer than limit deleted means
// nothing older is left. Running it twice deletes nothing more.
func TrimLeaseEvents(ctx context.Context, db DB, cutoffMs int64, limit int) (OutboxTrimResult, error) {
	var r OutboxTrimResult
	var n int64
	err := db.QueryRow(ctx, trimLeaseEventsSQL, cutoffMs, limit).Scan(&n, &r.Through, &r.OldestMs)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" && strings.Contains(pgErr.Message, "ffreconcile_outbox_trim") {
		return OutboxTrimResult{}, ErrOutboxTrimTableMissing
	}
	if err != nil {
		return OutboxTrimResult{}, fmt.Errorf("trim lease events: %w", err)
	}
	r.Deleted = int(n)
	return r, nil
}

// trimCompletionEventsSQL deletes, of the $2 oldest dispatched completion
// events by event_id, those before the first one committed at or after $1.
// An event not yet dispatched (dispatched_at_ms IS NULL) is never deleted:
// FlowFabric's dispatcher still owes its downstream executions their
// dependency resolution. Index: ff_completion_event_event_id_idx, merged
// across the partitions in event_id order, O(batch + undispatched events
// older than the batch's last).
const trimCompletionEventsSQL = `
WITH head AS (
    SELECT partition_key, event_id, committed_at_ms FROM ff_completion_event
     WHERE dispatched_at_ms IS NOT NULL
     ORDER BY event_id LIMIT $2
), stop AS (
    SELECT min(event_id) AS id FROM head WHERE committed_at_ms >= $1
), gone AS (
    DELETE FROM ff_completion_event t USING head h
     WHERE t.partition_key = h.partition_key AND t.event_id = h.event_id AND t.dispatched_at_ms IS NOT NULL
       AND h.event_id < COALESCE((SELECT id FROM stop), 9223372036854775807)
    RETURNING t.event_id, t.committed_at_ms
)
SELECT count(*), COALESCE(max(event_id), 0), COALESCE(min(committed_at_ms), 0) FROM gone`

// TrimCompletionEvents deletes up to limit of the oldest dispatched
// completion events committed before cutoffMs. Undispatched events are
// kept, however old. Running it twice deletes nothing more.
func TrimCompletionEvents(ctx context.Context, db DB, cutoffMs int64, limit int) (OutboxTrimResult, error) {
	var r OutboxTrimResult
	var n int64
	if err := db.QueryRow(ctx, trimCompletionEventsSQL, cutoffMs, limit).Scan(&n, &r.Through, &r.OldestMs); err != nil {
		return OutboxTrimResult{}, fmt.Errorf("trim completion events: %w", err)
	}
	r.Deleted = int(n)
	return r, nil
}
