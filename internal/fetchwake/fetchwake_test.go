package fetchwake_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/flowfabric/ffreconcile/internal/fetchwake"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
)

// TestWakerSendsOncePerGranuleNeverEarly: wake-ups asked for within one
// granule share one notification, which is sent no earlier than the latest
// of them; a later granule gets its own; nothing else is sent.
func TestWakerSendsOncePerGranuleNeverEarly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.NewEmpty(t)

	listener, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(ctx)
	if _, err := listener.Exec(ctx, `LISTEN "wk.river_insert"`); err != nil {
		t.Fatal(err)
	}

	const g = 100 * time.Millisecond
	w, err := fetchwake.New(fetchwake.Config{DB: db.Pool, Schema: "wk", Queue: "rows", Granularity: g, Logger: fleettest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	run(t, w)

	// A granule boundary half a second out, and one three granules later.
	first := time.Now().Add(500 * time.Millisecond).Truncate(g).Add(g)
	second := first.Add(3 * g)
	for _, at := range []time.Time{first.Add(-g / 2), second, first, first.Add(-g / 4)} {
		w.At(at)
	}
	if n := w.Pending(); n != 2 {
		t.Fatalf("pending = %d; want 2 granules", n)
	}

	for i, want := range []time.Time{first, second} {
		waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := listener.WaitForNotification(waitCtx)
		cancel()
		if err != nil {
			t.Fatalf("notification %d: %v", i, err)
		}
		if got := time.Now(); got.Before(want) {
			t.Fatalf("notification %d received at %s, before its granule %s", i, got.Format(time.StampMicro), want.Format(time.StampMicro))
		}
		if n.Payload != `{"queue":"rows"}` {
			t.Fatalf("payload %q", n.Payload)
		}
	}
	waitCtx, cancel := context.WithTimeout(ctx, 3*g)
	defer cancel()
	if n, err := listener.WaitForNotification(waitCtx); err == nil {
		t.Fatalf("unexpected third notification %+v", n)
	}
	if w.Sent() != 2 || w.Failed() != 0 || w.Pending() != 0 {
		t.Fatalf("sent %d, failed %d, pending %d; want 2, 0, 0", w.Sent(), w.Failed(), w.Pending())
	}
}

type snoozeArgs struct{}

func (snoozeArgs) Kind() string { return "fetchwake_test.snooze" }

// TestWakeStartsAJobRiverWouldPollFor: a job that snoozes briefly is left
// available with a future scheduled_at, which River fetches only at its next
// poll (here a minute away) or on an insert notification. The Waker's
// notification at the snooze's end starts it again well before that poll,
// which proves the channel and payload are the ones River listens for.
func TestWakeStartsAJobRiverWouldPollFor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)

	w, err := fetchwake.New(fetchwake.Config{DB: db.Pool, Schema: testdb.RiverSchema, Queue: "wake", Logger: fleettest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(ctx context.Context, job *river.Job[snoozeArgs]) error {
		if runs.Add(1) == 1 {
			const snooze = 300 * time.Millisecond
			w.At(time.Now().Add(snooze))
			return river.JobSnooze(snooze)
		}
		return nil
	}))
	client, err := river.NewClient(riverpgxv5.New(db.Pool), &river.Config{
		Schema:            testdb.RiverSchema,
		Logger:            fleettest.Logger(t),
		Queues:            map[string]river.QueueConfig{"wake": {MaxWorkers: 2}},
		FetchPollInterval: time.Minute,
		Workers:           workers,
	})
	if err != nil {
		t.Fatal(err)
	}
	run(t, w)
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = client.Stop(stopCtx)
	}()

	if _, err := client.Insert(ctx, snoozeArgs{}, &river.InsertOpts{Queue: "wake"}); err != nil {
		t.Fatal(err)
	}
	fleettest.WaitFor(t, fleettest.Patient, "the snoozed job to run again", func() (bool, string) {
		return runs.Load() == 2, fleettest.Statusf("%d runs, %d wake-ups sent", runs.Load(), w.Sent())
	})
}

// run runs w until the test ends.
func run(t *testing.T, w *fetchwake.Waker) {
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { stop(); <-done })
}
