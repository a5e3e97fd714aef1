package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

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
		att := fftest.ReadAttempt(t, pool, 7, id, 2)
		if att.LeaseExpiresAtMs != nil || att.Outcome == nil || *att.Outcome != "lease_expired_reclaimable" {
			t.Fatalf("attempt = lease %v outcome %v; want NULL, lease_expired_reclaimable", att.LeaseExpiresAtMs, att.Outcome)
		}
		ex := fftest.ReadExec(t, pool, 7, id)
		if ex.LifecyclePhase != "runnable" || ex.OwnershipState != "unowned" ||
			ex.EligibilityState != "eligible_now" || ex.AttemptState != "attempt_interrupted" {
			t.Fatalf("exec = %+v; want runnable/unowned/eligible_now/attempt_interrupted", ex)
		}
		if ex.PublicState != "running" {
			t.Fatalf("public_state = %q; the seed leaves it alone", ex.PublicState)
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
		if err != nil || res.Released {
			t.Fatalf("second run = %+v, %v; want no-op", res, err)
		}
		if n := len(fftest.LeaseEvents(t, pool, id)); n != 1 {
			t.Fatalf("%d lease events after a second run; want 1", n)
		}
	})

	t.Run("RenewedLeaseIsLeftAlone", func(t *testing.T) {
		id := fftest.InsertExec(t, pool, fftest.Exec{Partition: 3})
		fftest.InsertAttempt(t, pool, 3, id, 0, fftest.Ms(now+60_000))
		res, err := store.ReleaseExpiredLease(ctx, pool, 3, id, 0, now, store.Filter{})
		if err != nil || res.Released {
			t.Fatalf("result = %+v, %v; want no-op", res, err)
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
		if err != nil || !res.Released || res.ExecFlipped {
			t.Fatalf("result = %+v, %v; want released, not flipped", res, err)
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
// (released once).
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
		{Released: true, ExecFlipped: true},
		{Released: true, ExecFlipped: true},
		{},
		{Released: true}, // b is runnable once its attempt 0 released it
		{Released: true, ExecMissing: true},
		{Released: true, ExecFlipped: true, RawFieldsMalformed: true},
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
// lock: a renewal that holds the attempt row when the release starts, and
// commits while the release waits on the lock, wins, and the release becomes
// a no-op instead of overwriting the fresh lease.
func TestReleaseRechecksUnderLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	pool := db.Pool
	const now = int64(2_000_000)

	id := fftest.InsertExec(t, pool, fftest.Exec{Partition: 9})
	fftest.InsertAttempt(t, pool, 9, id, 0, fftest.Ms(now-1))

	renew, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer renew.Rollback(ctx) //nolint:errcheck
	if _, err := renew.Exec(ctx, `UPDATE ff_attempt SET lease_expires_at_ms = $1 WHERE partition_key = 9 AND execution_id = $2`,
		now+30_000, id); err != nil {
		t.Fatal(err)
	}

	done := make(chan store.ReleaseResult, 1)
	errc := make(chan error, 1)
	go func() {
		res, err := store.ReleaseExpiredLease(ctx, pool, 9, id, 0, now, store.Filter{})
		if err != nil {
			errc <- err
			return
		}
		done <- res
	}()

	// Wait until the release is blocked on the renewal's row lock.
	waitForLockWait(t, pool, "ff_attempt")
	if err := renew.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-done:
		if res.Released {
			t.Fatalf("release overwrote a renewed lease: %+v", res)
		}
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("release did not finish")
	}
	if att := fftest.ReadAttempt(t, pool, 9, id, 0); att.LeaseExpiresAtMs == nil || *att.LeaseExpiresAtMs != now+30_000 {
		t.Fatalf("lease = %v; want the renewal's %d", att.LeaseExpiresAtMs, now+30_000)
	}
	if n := len(fftest.LeaseEvents(t, pool, id)); n != 0 {
		t.Fatalf("%d events; want 0", n)
	}
}
