package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

// TestReleaseExpiredLease checks the seed's release_one row by row: an
// expired lease is released, its active execution flipped to reclaimable
// with one `expired` lease event carrying its tenant, a terminal or missing
// execution left as it is; a renewed lease is left alone. A regression shows
// as a changed value the seed keeps, or a DeadlineMs other than the expiry
// released (0: read after the statement cleared it).
func TestReleaseExpiredLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	pool := db.Pool
	const now = int64(1_000_000)

	t.Run("ActiveExecutionIsReleasedAsTheSeedWrites", func(t *testing.T) {
		id := fftest.InsertExec(t, pool, fftest.Exec{Partition: 7, Namespace: "tenant-a",
			Tags: map[string]string{"cairn.instance_id": "inst-1", "other": "x"}})
		fftest.InsertAttempt(t, pool, 7, id, 2, fftest.Ms(now-1))

		res, err := store.ReleaseExpiredLease(ctx, pool, 7, id, 2, now, store.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		if !res.Released || !res.ExecFlipped || res.ExecMissing || res.EventID == 0 {
			t.Fatalf("result = %+v; want released, flipped, event written", res)
		}
		// The statement clears lease_expires_at_ms: DeadlineMs is the
		// expiry it had (seeded at now - 1), read before, not the NULL after.
		if res.DeadlineMs != now-1 {
			t.Fatalf("DeadlineMs = %d; want the released expiry %d", res.DeadlineMs, now-1)
		}
		att := fftest.ReadAttempt(t, pool, 7, id, 2)
		if att.LeaseExpiresAtMs != nil || att.Outcome == nil || *att.Outcome != "lease_expired_reclaimable" {
			t.Fatalf("attempt = lease %v outcome %v; want NULL, lease_expired_reclaimable", att.LeaseExpiresAtMs, att.Outcome)
		}
		ex := fftest.ReadExec(t, pool, 7, id)
		if ex.LifecyclePhase != "runnable" || ex.OwnershipState != "unowned" ||
			ex.EligibilityState != "eligible_now" || ex.AttemptState != "attempt_interrupted" {
			t.Fatalf("exec = %+v; want runnable/unowned/eligible_now/attempt_interrupted", ex)
		}
		// What the seed leaves at the claim's `running`, FlowFabric's
		// readers now see as what the row is: waiting for a worker.
		if ex.PublicState != "waiting" || fftest.Deref(ex.BlockingReason) != "waiting_for_worker" {
			t.Fatalf("public_state, blocking_reason = %q, %s; want waiting, waiting_for_worker", ex.PublicState, fftest.Deref(ex.BlockingReason))
		}
		if got := ex.RawFields["lease_expired_at_ms"]; got != float64(now) {
			t.Fatalf("raw_fields.lease_expired_at_ms = %v; want %d", got, now)
		}
		if ex.RawFields["namespace"] != "tenant-a" {
			t.Fatalf("raw_fields lost its namespace: %v", ex.RawFields)
		}
		evs := fftest.LeaseEvents(t, pool, id)
		if len(evs) != 1 {
			t.Fatalf("%d lease events; want 1", len(evs))
		}
		ev := evs[0]
		if ev.EventType != "expired" || ev.Partition != 7 || ev.OccurredAtMs != now || ev.EventID != res.EventID ||
			ev.Namespace == nil || *ev.Namespace != "tenant-a" || ev.InstanceTag == nil || *ev.InstanceTag != "inst-1" {
			t.Fatalf("event = %+v; want expired, partition 7, at now, namespace tenant-a, tag inst-1", ev)
		}

		// A second run (the job ran twice) changes nothing.
		res, err = store.ReleaseExpiredLease(ctx, pool, 7, id, 2, now+5, store.Filter{})
		if err != nil || res.Released || res.DeadlineMs != 0 {
			t.Fatalf("second run = %+v, %v; want no-op, DeadlineMs 0", res, err)
		}
		if n := len(fftest.LeaseEvents(t, pool, id)); n != 1 {
			t.Fatalf("%d lease events after a second run; want 1", n)
		}
	})

	t.Run("RenewedLeaseIsLeftAlone", func(t *testing.T) {
		id := fftest.InsertExec(t, pool, fftest.Exec{Partition: 3})
		fftest.InsertAttempt(t, pool, 3, id, 0, fftest.Ms(now+60_000))
		res, err := store.ReleaseExpiredLease(ctx, pool, 3, id, 0, now, store.Filter{})
		// Not released: DeadlineMs 0, not the live lease's expiry.
		if err != nil || res.Released || res.DeadlineMs != 0 {
			t.Fatalf("result = %+v, %v; want no-op, DeadlineMs 0", res, err)
		}
		if ex := fftest.ReadExec(t, pool, 3, id); ex.LifecyclePhase != "active" || ex.RawFields["lease_expired_at_ms"] != nil {
			t.Fatalf("exec changed: %+v", ex)
		}
		if n := len(fftest.LeaseEvents(t, pool, id)); n != 0 {
			t.Fatalf("%d events; want 0", n)
		}
	})

	t.Run("TerminalExecutionIsUntouchedButLeaseReleased", func(t *testing.T) {
		id := fftest.InsertExec(t, pool, fftest.Exec{Partition: 4, LifecyclePhase: "terminal", OwnershipState: "unowned",
			PublicState: "completed", AttemptState: "attempt_terminal"})
		fftest.InsertAttempt(t, pool, 4, id, 0, fftest.Ms(now-10))
		res, err := store.ReleaseExpiredLease(ctx, pool, 4, id, 0, now, store.Filter{})
		if err != nil || !res.Released || res.ExecFlipped || res.DeadlineMs != now-10 {
			t.Fatalf("result = %+v, %v; want released at its expiry %d, not flipped", res, err, now-10)
		}
		ex := fftest.ReadExec(t, pool, 4, id)
		if ex.LifecyclePhase != "terminal" || ex.PublicState != "completed" || ex.RawFields["lease_expired_at_ms"] != nil {
			t.Fatalf("terminal exec changed: %+v", ex)
		}
		if att := fftest.ReadAttempt(t, pool, 4, id, 0); att.LeaseExpiresAtMs != nil {
			t.Fatal("lease not released")
		}
		if n := len(fftest.LeaseEvents(t, pool, id)); n != 1 {
			t.Fatalf("%d events; want 1", n)
		}
	})

	t.Run("MissingExecutionWritesEventWithNullTenant", func(t *testing.T) {
		id := fftest.NewUUID()
		fftest.InsertAttempt(t, pool, 5, id, 1, fftest.Ms(now-10))
		res, err := store.ReleaseExpiredLease(ctx, pool, 5, id, 1, now, store.Filter{})
		if err != nil || !res.Released || !res.ExecMissing {
			t.Fatalf("result = %+v, %v; want released, exec missing", res, err)
		}
		evs := fftest.LeaseEvents(t, pool, id)
		if len(evs) != 1 || evs[0].Namespace != nil || evs[0].InstanceTag != nil {
			t.Fatalf("events = %+v; want one with NULL namespace and tag", evs)
		}
	})

	t.Run("MalformedRawFieldsAreKept", func(t *testing.T) {
		id := fftest.InsertExec(t, pool, fftest.Exec{Partition: 6, RawFields: "not an object"})
		fftest.InsertAttempt(t, pool, 6, id, 0, fftest.Ms(now-10))
		res, err := store.ReleaseExpiredLease(ctx, pool, 6, id, 0, now, store.Filter{})
		if err != nil || !res.Released || !res.ExecFlipped || !res.RawFieldsMalformed {
			t.Fatalf("result = %+v, %v; want released, flipped, raw_fields malformed", res, err)
		}
		if ex := fftest.ReadExec(t, pool, 6, id); ex.RawFieldsText != `"not an object"` {
			t.Fatalf("raw_fields = %s; want it kept", ex.RawFieldsText)
		}
	})
}

// TestReleaseExpiredLeasesBatch: a batch gives every attempt the result it
// would get alone, in input order: released ones with their own event and
// tenant, a renewed one and an unknown one as no-ops, a missing execution, a
// malformed raw_fields, two attempts of one execution (the second sees the
// first's change, as sequential runs would), and the same attempt twice
// (released once), each released one with its own expiry as DeadlineMs.
func TestReleaseExpiredLeasesBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const now, p = int64(3_000_000), int16(11)

	a := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, Namespace: "tenant-a", Tags: map[string]string{"cairn.instance_id": "i-a"}})
	fftest.InsertAttempt(t, pool, p, a, 0, fftest.Ms(now-1))
	b := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, Namespace: "tenant-b"})
	fftest.InsertAttempt(t, pool, p, b, 0, fftest.Ms(now-5))
	fftest.InsertAttempt(t, pool, p, b, 1, fftest.Ms(now-2))
	renewed := fftest.InsertExec(t, pool, fftest.Exec{Partition: p})
	fftest.InsertAttempt(t, pool, p, renewed, 0, fftest.Ms(now+60_000))
	orphan := fftest.NewUUID()
	fftest.InsertAttempt(t, pool, p, orphan, 0, fftest.Ms(now-1))
	malformed := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, RawFields: []int{1}})
	fftest.InsertAttempt(t, pool, p, malformed, 0, fftest.Ms(now-1))
	unknown := fftest.NewUUID()

	refs := []store.LeaseRef{{a, 0}, {b, 0}, {renewed, 0}, {b, 1}, {orphan, 0}, {malformed, 0}, {unknown, 3}, {a, 0}}
	got, err := store.ReleaseExpiredLeases(ctx, pool, p, refs, now, store.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	want := []store.ReleaseResult{
		{Released: true, ExecFlipped: true, DeadlineMs: now - 1},
		{Released: true, ExecFlipped: true, DeadlineMs: now - 5},
		{},
		{Released: true, DeadlineMs: now - 2}, // b is runnable once its attempt 0 released it
		{Released: true, ExecMissing: true, DeadlineMs: now - 1},
		{Released: true, ExecFlipped: true, RawFieldsMalformed: true, DeadlineMs: now - 1},
		{},
		{}, // the same attempt again: already released
	}
	if len(got) != len(want) {
		t.Fatalf("%d results for %d refs", len(got), len(refs))
	}
	for i := range want {
		g := got[i]
		if g.Released != (g.EventID != 0) {
			t.Errorf("ref %d: released %v with event %d", i, g.Released, g.EventID)
		}
		g.EventID = 0
		if g != want[i] {
			t.Errorf("ref %d (%s/%d) = %+v, want %+v", i, refs[i].ExecutionID, refs[i].AttemptIndex, g, want[i])
		}
	}
	for _, c := range []struct {
		id, namespace string
		events        int
	}{{a, "tenant-a", 1}, {b, "tenant-b", 2}, {renewed, "", 0}, {orphan, "", 1}, {malformed, "", 1}} {
		evs := fftest.LeaseEvents(t, pool, c.id)
		if len(evs) != c.events {
			t.Fatalf("%s: %d events, want %d", c.id, len(evs), c.events)
		}
		for _, ev := range evs {
			if (ev.Namespace == nil) != (c.namespace == "") || (ev.Namespace != nil && *ev.Namespace != c.namespace) {
				t.Fatalf("%s: event namespace %v, want %q", c.id, ev.Namespace, c.namespace)
			}
		}
	}
	if evs := fftest.LeaseEvents(t, pool, a); *evs[0].InstanceTag != "i-a" || evs[0].EventID != got[0].EventID {
		t.Fatalf("event of a = %+v, result %+v", evs[0], got[0])
	}
	if ex := fftest.ReadExec(t, pool, p, renewed); ex.LifecyclePhase != "active" {
		t.Fatalf("renewed execution changed: %+v", ex)
	}
}

// TestReleaseRechecksUnderLock proves the re-check happens under the row
// lock: a change to the lease that holds the attempt row when the release
// starts, and commits while the release waits on the lock, decides. A
// renewal wins, and the release becomes a no-op instead of overwriting the
// fresh lease (DeadlineMs 0, not the renewed expiry). An expiry moved but
// still lapsed is released, and DeadlineMs is the moved one, found under the
// lock (lateness is measured from it), not the one the scan saw.
func TestReleaseRechecksUnderLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	pool := db.Pool
	const now = int64(2_000_000)

	tests := []struct {
		name    string
		moveTo  int64 // the lease expiry the concurrent change commits
		release bool  // whether the release applies
	}{
		{name: "RenewedWins", moveTo: now + 30_000},
		{name: "MovedButLapsed", moveTo: now - 10, release: true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := int16(9 + i)
			id := fftest.InsertExec(t, pool, fftest.Exec{Partition: p})
			fftest.InsertAttempt(t, pool, p, id, 0, fftest.Ms(now-1))

			change, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer change.Rollback(ctx) //nolint:errcheck
			if _, err := change.Exec(ctx, `UPDATE ff_attempt SET lease_expires_at_ms = $1 WHERE partition_key = $2 AND execution_id = $3`,
				tt.moveTo, p, id); err != nil {
				t.Fatal(err)
			}

			done := make(chan store.ReleaseResult, 1)
			errc := make(chan error, 1)
			go func() {
				res, err := store.ReleaseExpiredLease(ctx, pool, p, id, 0, now, store.Filter{})
				if err != nil {
					errc <- err
					return
				}
				done <- res
			}()

			// Wait until the release is blocked on the change's row lock.
			waitForLockWait(t, pool, "ff_attempt")
			if err := change.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			var res store.ReleaseResult
			select {
			case res = <-done:
			case err := <-errc:
				t.Fatal(err)
			case <-time.After(10 * time.Second):
				t.Fatal("release did not finish")
			}
			events := len(fftest.LeaseEvents(t, pool, id))
			att := fftest.ReadAttempt(t, pool, p, id, 0)
			if !tt.release {
				if res.Released || res.DeadlineMs != 0 {
					t.Fatalf("release overwrote a renewed lease: %+v; want no-op, DeadlineMs 0", res)
				}
				if att.LeaseExpiresAtMs == nil || *att.LeaseExpiresAtMs != tt.moveTo {
					t.Fatalf("lease = %v; want the renewal's %d", att.LeaseExpiresAtMs, tt.moveTo)
				}
				if events != 0 {
					t.Fatalf("%d events; want 0", events)
				}
				return
			}
			if !res.Released || res.DeadlineMs != tt.moveTo {
				t.Fatalf("result = %+v; want released, DeadlineMs %d (the moved expiry)", res, tt.moveTo)
			}
			if att.LeaseExpiresAtMs != nil || events != 1 {
				t.Fatalf("lease = %v, %d events; want released with one event", att.LeaseExpiresAtMs, events)
			}
		})
	}
}
