package leasehistory

import (
	"context"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/flowfabric/ffreconcile/store"
)

// batchSize is the number of rows read per query (FlowFabric's REPLAY_BATCH).
const batchSize = 256

// reader walks ff_lease_event in event_id order and applies the hole rule
// (see the package documentation). It is used by one goroutine; only pos is
// read concurrently.
type reader struct {
	filter  filter
	logger  *slog.Logger
	gapWait time.Duration
	now     func() time.Time

	// cursor is the highest id that has been delivered, filtered out, or
	// passed as a permanent hole; pos mirrors it for Subscription.Cursor.
	cursor int64
	pos    atomic.Int64

	// stopAt ends a bounded read once cursor reaches it (stopping only).
	stopping bool
	stopAt   int64

	// acceptTrimmed: a trim ahead of the cursor is reported as an
	// EventTrimmed notice instead of ending the subscription;
	// trimmedThrough is the highest trim mark reported, below which holes
	// are passed at once (their events are deleted, not in flight).
	acceptTrimmed  bool
	trimmedThrough int64

	hold *hold
	// ignored holds transactions that outlived gapWait while blocking a
	// hole; later holes do not wait for them again, so one long transaction
	// (say, a long report) costs one bound, not one per hole.
	ignored map[string]struct{}

	signals *testSignals // nil outside tests
}

// hold is the state while delivery is stopped at a missing event id.
type hold struct {
	// coverMax is the highest event id visible in the read that found the
	// hole. Every missing id below it had been taken from the sequence
	// before that read, by a transaction that was running at that point or
	// had already ended.
	coverMax int64
	since    time.Time

	vxidsRead bool
	vxids     []string // transactions, listed after that read, not yet seen to finish
	// finished: every transaction in vxids has ended, as checked before the
	// latest read, so that read shows each of them committed or not.
	finished bool
	// unreliable: the server is a standby whose lock table does not show
	// the primary's writers; only the bound ends the hold.
	unreliable bool
}

func (r *reader) setCursor(id int64) {
	r.cursor = id
	r.pos.Store(id)
}

// done reports whether a bounded read has reached its end.
func (r *reader) done() bool { return r.stopping && r.cursor >= r.stopAt }

// pump delivers every deliverable row after the cursor through emit. It
// returns holding=true when it stopped at an unresolved hole, in which case
// the caller should call it again soon even without a notification.
//
// Order matters: the running-transaction check runs before the row read, so
// when the check says every candidate writer has ended, the read that follows
// sees whether the missing row was committed.
func (r *reader) pump(ctx context.Context, db leaseEventDB, emit func(Event) error) (holding bool, err error) {
	if r.done() {
		return false, nil
	}
	if err := r.checkHold(ctx, db); err != nil {
		return false, err
	}
	for {
		rows, err := store.LeaseEventsAfter(ctx, db, r.cursor, batchSize)
		if err != nil {
			return false, err
		}
		if len(rows) > 0 && rows[0].EventID > r.cursor+1 {
			// A hole at the cursor: in flight, rolled back, or trimmed.
			if err := r.checkTrimmed(ctx, db, emit); err != nil {
				return false, err
			}
		}
		now := r.now()
		for i := range rows {
			row := &rows[i]
			if r.done() {
				r.hold = nil
				return false, nil
			}
			for row.EventID > r.cursor+1 {
				if !r.passHole(row, rows[len(rows)-1].EventID, now) {
					return true, nil
				}
			}
			if err := r.deliver(row, emit); err != nil {
				return false, err
			}
		}
		if len(rows) < batchSize {
			r.hold = nil
			return false, nil
		}
	}
}

// checkHold refreshes what the current hold is waiting for.
func (r *reader) checkHold(ctx context.Context, db leaseEventDB) error {
	h := r.hold
	if h == nil || h.finished || h.unreliable && h.vxidsRead {
		return nil
	}
	if !h.vxidsRead {
		vxids, inRecovery, err := store.RunningTransactions(ctx, db)
		if err != nil {
			return err
		}
		present := make(map[string]struct{}, len(vxids))
		for _, v := range vxids {
			present[v] = struct{}{}
			if _, skip := r.ignored[v]; !skip {
				h.vxids = append(h.vxids, v)
			}
		}
		for v := range r.ignored {
			if _, ok := present[v]; !ok {
				delete(r.ignored, v) // ended; forget it
			}
		}
		h.vxidsRead, h.unreliable = true, inRecovery
		h.finished = !inRecovery && len(h.vxids) == 0
		if r.signals != nil && r.signals.holdListed != nil {
			r.signals.holdListed(slices.Clone(h.vxids))
		}
		return nil
	}
	running, err := store.StillRunning(ctx, db, h.vxids)
	if err != nil {
		return err
	}
	h.vxids = running
	h.finished = len(running) == 0
	return nil
}

// passHole handles the missing ids before row (the first is cursor+1). It
// advances the cursor past them and returns true when they are known to be
// permanent or the bound has passed; otherwise it records or keeps the hold
// and returns false. lastID is the highest id in the current read.
func (r *reader) passHole(row *store.LeaseEvent, lastID int64, now time.Time) bool {
	first := r.cursor + 1
	if first <= r.trimmedThrough {
		// Deleted by outbox retention, already reported.
		r.setCursor(min(row.EventID-1, r.trimmedThrough))
		return true
	}
	h := r.hold
	if h == nil || first >= h.coverMax {
		// A hole not covered by the current hold: the transactions to wait
		// for are listed on the next pump, after this read.
		r.hold = &hold{coverMax: lastID, since: now}
		r.logger.Debug("leasehistory: waiting at missing event id", "event_id", first, "next_visible", row.EventID)
		return false
	}
	timedOut := now.Sub(h.since) >= r.gapWait
	if !h.finished && !timedOut {
		return false
	}
	last := min(row.EventID, h.coverMax) - 1
	if h.finished {
		r.logger.Debug("leasehistory: passing permanent gap in event ids (rolled back or abandoned)",
			"from", first, "to", last)
	} else {
		r.logger.Warn("leasehistory: passing event ids still missing after the gap wait bound; a transaction that commits them later will not be delivered",
			"from", first, "to", last, "waited", now.Sub(h.since).Round(time.Millisecond), "running_transactions", h.vxids)
		if !h.unreliable {
			if r.ignored == nil {
				r.ignored = make(map[string]struct{})
			}
			for _, v := range h.vxids {
				r.ignored[v] = struct{}{}
			}
		}
	}
	r.setCursor(last)
	return true
}

// deliver filters, converts and emits row, then moves the cursor past it.
func (r *reader) deliver(row *store.LeaseEvent, emit func(Event) error) error {
	if r.filter.passes(row) {
		ev, err := toEvent(row)
		if err != nil {
			r.logger.Warn("leasehistory: skipping lease event", "event_id", row.EventID, "error", err)
		} else if err := emit(ev); err != nil {
			return err
		}
	}
	r.setCursor(row.EventID)
	return nil
}
