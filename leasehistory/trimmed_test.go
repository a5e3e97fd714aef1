package leasehistory_test

import (
	"errors"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/leasehistory"
	"github.com/flowfabric/ffreconcile/store"
)

// TestCursorBehindTheTrim: outbox retention deletes the oldest events.
// Resuming from a cursor before the trim's mark is refused with a
// *TrimmedError naming the gap and the cursor to resume from (nothing is
// skipped silently); with AcceptTrimmed the first event is an
// EventTrimmed notice and the rest of the history follows; a cursor at the
// mark resumes as usual. A following subscription overtaken by a trim ends
// with the same error. A regression delivers what is left as if nothing
// were missing.
func TestCursorBehindTheTrim(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := testCtx(t)
	var all []int64
	for range 5 {
		all = append(all, insertEvent(t, ctx, db.Pool, 1, "renewed", nil, nil))
	}
	// Trim the first three (everything occurred "now"; a cutoff in the
	// future takes them, three at a time).
	res, err := store.TrimLeaseEvents(ctx, db.Pool, time.Now().Add(time.Hour).UnixMilli(), 3)
	if err != nil || res.Through != all[2] {
		t.Fatalf("trim = %+v, %v; want through %d", res, err, all[2])
	}

	t.Run("Refused", func(t *testing.T) {
		_, err := leasehistory.Subscribe(ctx, db.Pool, leasehistory.Options{Cursor: leasehistory.EncodeCursor(all[0]), StopWhenCaughtUp: true, Logger: quiet})
		var te *leasehistory.TrimmedError
		if !errors.As(err, &te) {
			t.Fatalf("Subscribe behind the trim: %v; want a *TrimmedError", err)
		}
		if te.Cursor != all[0] || te.TrimmedThrough != all[2] {
			t.Fatalf("TrimmedError %+v; want cursor %d, trimmed through %d", te, all[0], all[2])
		}
		if got, _ := te.Resume().EventID(); got != all[2] {
			t.Fatalf("Resume() = %d; want %d", got, all[2])
		}
	})
	t.Run("Accepted", func(t *testing.T) {
		sub := subscribe(t, ctx, db.Pool, leasehistory.Options{Cursor: leasehistory.EncodeCursor(0), StopWhenCaughtUp: true, AcceptTrimmed: true})
		evs := drain(t, sub)
		if len(evs) != 3 || evs[0].Type != leasehistory.EventTrimmed || evs[0].EventID != all[2] {
			t.Fatalf("events %+v; want a trimmed notice through %d, then %d and %d", evs, all[2], all[3], all[4])
		}
		if evs[1].EventID != all[3] || evs[2].EventID != all[4] {
			t.Fatalf("after the notice: %v; want %d, %d", ids(evs[1:]), all[3], all[4])
		}
	})
	t.Run("AtTheMark", func(t *testing.T) {
		sub := subscribe(t, ctx, db.Pool, leasehistory.Options{Cursor: leasehistory.EncodeCursor(all[2]), StopWhenCaughtUp: true})
		if evs := drain(t, sub); len(evs) != 2 || evs[0].EventID != all[3] {
			t.Fatalf("events %v; want %d, %d", ids(evs), all[3], all[4])
		}
	})
	t.Run("OvertakenWhileFollowing", func(t *testing.T) {
		sub := subscribe(t, ctx, db.Pool, leasehistory.Options{Cursor: leasehistory.EncodeCursor(all[4])})
		// Two events are written and trimmed before the subscription can
		// read them (in one transaction), then a third arrives.
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		insertEvent(t, ctx, tx, 1, "renewed", nil, nil)
		insertEvent(t, ctx, tx, 1, "renewed", nil, nil)
		if _, err := store.TrimLeaseEvents(ctx, tx, time.Now().Add(time.Hour).UnixMilli(), 100); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		insertEvent(t, ctx, db.Pool, 1, "renewed", nil, nil)
		deadline := time.After(15 * time.Second)
		for {
			select {
			case ev, ok := <-sub.Events():
				if !ok {
					var te *leasehistory.TrimmedError
					if !errors.As(sub.Err(), &te) || te.Cursor != all[4] {
						t.Fatalf("subscription ended with %v; want a *TrimmedError at cursor %d", sub.Err(), all[4])
					}
					return
				}
				if ev.Type != leasehistory.EventDisconnected {
					t.Fatalf("event %+v delivered across the trim", ev)
				}
			case <-deadline:
				t.Fatal("the subscription did not end within 15s")
			}
		}
	})
}
