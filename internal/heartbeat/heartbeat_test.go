package heartbeat_test

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/heartbeat"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/internal/testlog"
	"github.com/flowfabric/ffreconcile/migrations"
	"github.com/flowfabric/ffreconcile/store"
)

// register registers clientID on db's schema river, failing t on an error.
func register(t *testing.T, db *testdb.DB, clientID string, logger *slog.Logger) *heartbeat.Process {
	t.Helper()
	p, err := heartbeat.Register(context.Background(), db.Pool, heartbeat.Config{Schema: testdb.RiverSchema, ClientID: clientID, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRegisterBeatsCleansUpAndDeletesOnStop: a registered process's row is
// there at once and beaten fresh, rows of processes gone without a clean
// stop are deleted, and a stop deletes the process's own row.
func TestRegisterBeatsCleansUpAndDeletesOnStop(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	// A process that died 11 minutes ago without a clean stop.
	if _, err := db.Pool.Exec(ctx, `INSERT INTO river.ffreconcile_worker (client_id, hostname, pid, started_at, heartbeat_at)
		VALUES ('dead', 'h', 1, now() - interval '1 hour', now() - interval '11 minutes')`); err != nil {
		t.Fatal(err)
	}

	runCtx, stop := context.WithCancel(ctx)
	proc := register(t, db, "me", fleettest.Logger(t))
	done := make(chan struct{})
	go func() { defer close(done); proc.Run(runCtx, 50*time.Millisecond) }()

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
	fleettest.WaitFor(t, fleettest.Patient, "first beat and cleanup", func() (bool, string) {
		m := list()
		first = m["me"]
		_, dead := m["dead"]
		return first.ClientID != "" && !dead, fleettest.Statusf("rows %v", m)
	})
	host, _ := os.Hostname()
	if first.PID != os.Getpid() || first.Hostname != host {
		t.Fatalf("row %+v; want this process (pid %d, host %s)", first, os.Getpid(), host)
	}
	fleettest.WaitFor(t, fleettest.Patient, "a later beat", func() (bool, string) {
		w := list()["me"]
		return w.HeartbeatAt.After(first.HeartbeatAt) && w.StartedAt.Equal(first.StartedAt),
			fleettest.Statusf("first %+v, now %+v", first, w)
	})

	stop()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if m := list(); len(m) != 0 {
		t.Fatalf("rows after a clean stop: %v; want none", m)
	}
}

func TestRegisterRejectsBadArguments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, call := range map[string]func() error{
		"Schema": func() error {
			_, err := heartbeat.Register(ctx, nil, heartbeat.Config{Schema: "a;b", ClientID: "c"})
			return err
		},
		"ClientID": func() error { _, err := heartbeat.Register(ctx, nil, heartbeat.Config{Schema: "river"}); return err },
	} {
		if err := call(); err == nil {
			t.Errorf("%s: Register returned nil; want an error", name)
		}
	}
}

// TestRunSurvivesALostTable: once the heartbeat table is gone under a
// running process, its beats fail, are logged once and then once every 12
// failed beats (not at every beat), and retried; once the table is back the
// next beat records the process again and says it recovered, and a stop
// deletes the row. A regression that gave up after a failed beat, or logged
// every one, fails here. The test counts beats through a test signal
// (OnBeat), so it proves the same on a machine of any speed.
func TestRunSurvivesALostTable(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs := &testlog.Buffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	proc := register(t, db, "c", logger)
	if _, err := db.Pool.Exec(ctx, `DROP TABLE river.ffreconcile_worker`); err != nil {
		t.Fatal(err)
	}
	beats := make(chan error, 100)
	proc.OnBeat(func(err error) {
		select {
		case beats <- err:
		default: // the test has stopped counting
		}
	})
	done := make(chan struct{})
	go func() { defer close(done); proc.Run(ctx, 5*time.Millisecond) }()

	// failedBeats waits for n more beats, each of which must fail.
	failedBeats := func(n int) {
		t.Helper()
		for i := range n {
			select {
			case err := <-beats:
				if err == nil {
					t.Fatalf("beat %d recorded the row with its table gone", i+1)
				}
			case <-time.After(time.Minute):
				t.Fatalf("no beat within a minute, after %d of %d", i, n)
			}
		}
	}
	warnings := func() int { return strings.Count(logs.String(), "worker heartbeat failed") }
	failedBeats(12)
	if n := warnings(); n != 1 {
		t.Fatalf("%d warnings for 12 failed beats; want 1:\n%s", n, logs.String())
	}
	failedBeats(1)
	if n := warnings(); n != 2 {
		t.Fatalf("%d warnings for 13 failed beats; want 1 more at the 13th:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "does not exist") {
		t.Fatalf("the warning does not say what is missing:\n%s", logs.String())
	}
	if err := migrations.ApplyWorkerTable(context.Background(), db.Pool, "river"); err != nil {
		t.Fatal(err)
	}
	fleettest.WaitFor(t, fleettest.Patient, "a beat after the table came back", func() (bool, string) {
		n := fftest.Count(t, db.Pool, `SELECT count(*) FROM river.ffreconcile_worker WHERE client_id = 'c'`)
		return n == 1 && strings.Contains(logs.String(), "worker heartbeat recovered"), logs.String()
	})
	cancel()
	<-done
	if n := fftest.Count(t, db.Pool, `SELECT count(*) FROM river.ffreconcile_worker`); n != 0 {
		t.Fatalf("%d heartbeat rows after the stop; want 0", n)
	}
}
