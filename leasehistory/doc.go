// Package leasehistory streams FlowFabric lease events (acquired, renewed,
// expired, reclaimed, revoked) from the ff_lease_event outbox table, a Go
// port of FlowFabric's Postgres subscribe_lease_history that also closes its
// lost-event gap.
//
//	sub, err := leasehistory.Subscribe(ctx, pool, leasehistory.Options{
//		Partitions: []int{7},
//		Cursor:     saved, // nil: from now
//	})
//	if err != nil {
//		return err
//	}
//	for ev := range sub.Events() {
//		if ev.Type == leasehistory.EventDisconnected {
//			log.Printf("reconnecting: %v", ev.Err) // not terminal
//			continue
//		}
//		handle(ev)
//		saved = ev.Cursor // persist after handling
//	}
//	return sub.Err()
//
// # Delivery
//
// Events arrive in event_id order, each exactly once, starting strictly after
// Options.Cursor. A subscription first replays what exists after its cursor,
// then LISTENs on the ff_lease_event channel on a connection it takes from
// the pool, and re-reads after each notification (the payload is only a
// wake-up). With Options.Poll it re-reads on a timer instead, for
// transaction-mode poolers where LISTEN is unavailable.
//
// When the connection fails, the subscription delivers an EventDisconnected
// event carrying the current cursor, reconnects with exponential backoff and
// resumes after the last delivered event: nothing is lost or repeated, and the
// consumer does not need to resubscribe.
//
// Rows are read unfiltered, and partition, namespace and instance tag filters
// are applied in Go, so a filtered subscription still advances its cursor past
// rows it does not deliver. Rows with an unknown event type or an execution id
// that is not a UUID are skipped with a warning, and the cursor moves past
// them too.
//
// # Cursors
//
// A Cursor is FlowFabric's Postgres event cursor: byte 0x02 then the event id
// as a big-endian int64. Its text form is the lowercase hex of those 9 bytes,
// e.g. 02000000000000002a. The empty cursor means "from now"; events whose
// ids are lower than the highest id committed at Subscribe time are then not
// delivered even if their transactions commit later.
//
// # Holes: events that commit out of order
//
// event_id is taken from a sequence when a row is inserted, not when its
// transaction commits. If transaction A takes id 10 and commits after
// transaction B has taken and committed id 11, a reader that delivered 11 and
// then asks for event_id > 11 never sees 10. FlowFabric's subscriber has this
// gap; this package closes it.
//
// Because ids are global, every id is accounted for: the reader sees all rows
// after its cursor and delivers them in order up to the first missing id (a
// hole). It holds there until either the row becomes visible (it is then
// delivered) or the hole is shown to be permanent (a rolled-back insert, or a
// sequence value never used), and it never moves its cursor past an
// unresolved hole. While holding it looks again every 30 ms, notifications or
// not.
//
// A hole is permanent once every transaction that was running just after the
// read that revealed it has ended and a later read still does not show the
// row. The id was taken before that read by a transaction that was then
// either running (so it is on the list) or already over. Running transactions
// are read from pg_locks: each transaction holds a lock on its own virtual
// transaction id from its start, before it has an xid, which is the signal
// CREATE INDEX CONCURRENTLY waits on. (pg_snapshot_xip of
// pg_current_snapshot is not enough: it lists neither transactions that have
// no xid yet nor those whose xid is at or above the snapshot's xmax, which is
// one past the latest completed xid, so a writer can be missing from it while
// it runs.) Transactions are checked before the re-read, so "ended" implies
// the re-read sees their outcome. A resolved hole is normally passed within
// tens of milliseconds.
//
// Only transactions of the subscriber's database are waited for (a backend
// writes into its own database only), but a long one there, even one that
// never touches ff_lease_event, would stall the stream. Options.GapWait
// (default 5 s) bounds the wait: past it the hole is passed with a warning,
// and a row that commits there later is not delivered. Transactions that
// outlived the bound are not waited for again by later holes. On a hot
// standby the lock table does not show the primary's writers, so holes
// always wait for the bound there; subscribe against the primary. An id
// taken in one transaction and inserted by a later one (nextval() then an
// explicit event_id) is not covered either, beyond the bound; FlowFabric
// inserts with the column default.
package leasehistory
