package heartbeat_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/heartbeat"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/migrations"
	"github.com/flowfabric/ffreconcile/store"
)

func TestRunBeatsCleansUpAndDeletesOnStop(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	// A process that died 11 minutes ago without a clean stop.
	if _, err := db.Pool.Exec(ctx, `INSERT INTO river.ffreconcile_worker (client_id, hostname, pid, started_at, heartbeat_at)
		VALUES ('dead', 'h', 1, now() - interval '1 hour', now() - interval '11 minutes')`); err != nil {
		t.Fatal(err)
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- heartbeat.Run(runCtx, db.Pool, testdb.RiverSchema, "me", 50*time.Millisecond, fleettest.Logger(t))
	}()

	list := func() map[string]store.WorkerHeartbeat {
		rows, err := store.ListWorkerHeartbeats(ctx, db.Pool, testdb.RiverSchema)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]store.WorkerHeartbeat{}
		for _, w := range rows {
			m[w.ClientID] = w
		}
		return m
	}
	var first store.WorkerHeartbeat
	fleettest.WaitFor(t, 10*time.Second, "first beat and cleanup", func() (bool, string) {
		m := list()
		first = m["me"]
		_, dead := m["dead"]
		return first.ClientID != "" && !dead, fleettest.Statusf("rows %v", m)
	})
	host, _ := os.Hostname()
	if first.PID != os.Getpid() || first.Hostname != host {
		t.Fatalf("row %+v; want this process (pid %d, host %s)", first, os.Getpid(), host)
	}
	fleettest.WaitFor(t, 10*time.Second, "a later beat", func() (bool, string) {
		w := list()["me"]
		return w.HeartbeatAt.After(first.HeartbeatAt) && w.StartedAt.Equal(first.StartedAt),
			fleettest.Statusf("first %+v, now %+v", first, w)
	})

	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v; want nil on a clean stop", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if m := list(); len(m) != 0 {
		t.Fatalf("rows after a clean stop: %v; want none", m)
	}
}

func TestRunRejectsBadArguments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, call := range map[string]func() error{
		"Schema":   func() error { return heartbeat.Run(ctx, nil, "a;b", "c", 0, nil) },
		"ClientID": func() error { return heartbeat.Run(ctx, nil, "river", "", 0, nil) },
		"Interval": func() error { return heartbeat.Run(ctx, nil, "river", "c", -time.Second, nil) },
	} {
		if err := call(); err == nil {
			t.Errorf("%s: Run returned nil; want an error", name)
		}
	}
}

// TestRunSurvivesAMissingTable: beats against a database whose heartbeat
// table is missing fail, are logged once (not at every beat) and retried;
// once the table exists the next beat records the process and says it
// recovered, and a stop deletes the row. A regression that gave up after a
// failed beat, or logged every one, fails here.
func TestRunSurvivesAMissingTable(t *testing.T) {
	t.Parallel()
	db := testdb.NewEmpty(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	done := make(chan error, 1)
	go func() { done <- heartbeat.Run(ctx, db.Pool, "river", "c", 20*time.Millisecond, logger) }()

	// Several beats fail meanwhile.
	time.Sleep(200 * time.Millisecond)
	if n := strings.Count(logs.String(), "worker heartbeat failed"); n != 1 {
		t.Fatalf("%d warnings for ~10 failed beats; want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "does not exist") {
		t.Fatalf("the warning does not say what is missing:\n%s", logs.String())
	}
	if err := migrations.ApplyWorkerTable(context.Background(), db.Pool, "river"); err != nil {
		t.Fatal(err)
	}
	fleettest.WaitFor(t, 5*time.Second, "a beat after the table appeared", func() (bool, string) {
		n := fftest.Count(t, db.Pool, `SELECT count(*) FROM river.ffreconcile_worker WHERE client_id = 'c'`)
		return n == 1 && strings.Contains(logs.String(), "worker heartbeat recovered"), logs.String()
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v; want nil", err)
	}
	if n := fftest.Count(t, db.Pool, `SELECT count(*) FROM river.ffreconcile_worker`); n != 0 {
		t.Fatalf("%d heartbeat rows after the stop; want 0", n)
	}
}

// syncBuffer is a bytes.Buffer safe for a logger and a test to share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
