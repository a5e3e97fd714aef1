package workers_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
)

// lateRecorder is a workers.Observer keeping every lateness reported.
type lateRecorder struct {
	mu   sync.Mutex
	late map[string][]time.Duration
}

func (o *lateRecorder) Lateness(reconciler string, d time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.late == nil {
		o.late = map[string][]time.Duration{}
	}
	o.late[reconciler] = append(o.late[reconciler], d)
}

func (o *lateRecorder) of(reconciler string) []time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]time.Duration(nil), o.late[reconciler]...)
}

// TestRowsAlreadyDueReportLatenessFromTheirRow: a row already due when
// scanned gets a row job whose args carry no deadline (a value no other job
// has would cost river_job's GIN index over args an entry of its own), and
// its lateness is still reported, measured from the deadline the action
// found under its lock. The row is an hour overdue, so the lateness is at
// least that and, were it measured from anything else (the job's insert, or
// a zero deadline), far from it. A regression shows as deadline_ms back in
// the args, or as no lateness (the action's deadline dropped) or a wrong one.
func TestRowsAlreadyDueReportLatenessFromTheirRow(t *testing.T) {
	t.Parallel()
	const overdue = time.Hour
	for _, tt := range deadlineRows {
		if tt.rowJob == nil {
			continue // promotions and the dependency reconciler measure lateness their own way
		}
		t.Run(tt.r.Name, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			obs := &lateRecorder{}
			deadline := time.Now().Add(-overdue).UnixMilli()
			id := tt.insert(t, db.Pool, 7, deadline)
			f := fleettest.Start(t, db, fleet.Config{Reconcilers: fleettest.Fast(tt.r), Observer: obs})
			c := f.Workers.Stats().For(tt.r.Name)

			fleettest.WaitFor(t, fleettest.Patient, "the overdue row to be acted on", func() (bool, string) {
				return tt.acted(t, db.Pool, 7, id), fleettest.Statusf("%+v", c.Snapshot())
			})
			fleettest.WaitFor(t, fleettest.Patient, "its lateness reported", func() (bool, string) {
				return len(obs.of(tt.r.Name)) > 0, fleettest.Statusf("%+v", c.Snapshot())
			})

			var n int
			var deadlineArg bool
			if err := db.Pool.QueryRow(context.Background(), `
				SELECT count(*), bool_or(args ? 'deadline_ms') FROM river.river_job
				 WHERE kind = $1 AND args->>$3 = $2`, tt.r.RowKind(), id, tt.idArg).Scan(&n, &deadlineArg); err != nil {
				t.Fatal(err)
			}
			if n != 1 || deadlineArg {
				t.Fatalf("%d row jobs, deadline_ms in their args: %v; want one, without deadline_ms", n, deadlineArg)
			}
			late := obs.of(tt.r.Name)
			// The upper bound only rules out a deadline other than the
			// row's: the test would have to run for ten minutes to reach it.
			if len(late) != 1 || late[0] < overdue || late[0] > overdue+10*time.Minute {
				t.Fatalf("lateness reported %v; want one, from the row's deadline %s ago", late, overdue)
			}
		})
	}
}
