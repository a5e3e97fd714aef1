package main

import (
	"context"
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/migrations"
	"github.com/flowfabric/ffreconcile/workers"
)

// statusJSON runs `worker status --format json` and decodes its document.
func statusJSON(t *testing.T, db *testdb.DB, args ...string) statusReport {
	t.Helper()
	code, out, stderr := runMain(t, context.Background(),
		append([]string{"status", "--database-url", db.URL, "--format", "json"}, args...)...)
	if code != 0 {
		t.Fatalf("worker status: exit %d, stderr %q", code, stderr)
	}
	var rep statusReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("decode status JSON: %v\n%s", err, out)
	}
	return rep
}

func dueOf(t *testing.T, rep statusReport, reconciler string) statusDue {
	t.Helper()
	for _, d := range rep.Due {
		if d.Reconciler == reconciler {
			return d
		}
	}
	t.Fatalf("no due entry for %s in %+v", reconciler, rep.Due)
	return statusDue{}
}

func TestStatusOnSeededDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	past, future := time.Now().Add(-time.Minute).UnixMilli(), time.Now().Add(time.Hour).UnixMilli()

	// Expired leases: three in partition 7 and two in 9 of tenant demo, one
	// in 200 of another tenant; one lease in 7 not yet expired.
	lease := func(p int16, ns string, at int64) {
		id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, Namespace: ns})
		fftest.InsertAttempt(t, db.Pool, p, id, 0, fftest.Ms(at))
	}
	for range 3 {
		lease(7, "demo", past)
	}
	lease(9, "demo", past)
	lease(9, "demo", past)
	lease(200, "other", past)
	lease(7, "demo", future)
	// Two timed-out suspensions, one delayed execution come due, one
	// pending cancel group.
	for range 2 {
		id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: 11, Namespace: "demo", LifecyclePhase: "suspended"})
		fftest.InsertSuspension(t, db.Pool, fftest.Suspension{Partition: 11, ExecutionID: id, TimeoutAtMs: fftest.Ms(past)})
	}
	d := fftest.Delayed(12, past)
	d.Namespace = "demo"
	fftest.InsertExec(t, db.Pool, d)
	flow := fftest.NewUUID()
	down := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: 13, FlowID: flow, Namespace: "demo"})
	fftest.InsertPendingCancel(t, db.Pool, 13, flow, down, past)
	// The flow, with its live member: the flow summary's probe finds its
	// partition (and nothing else: it counts no due rows).
	fftest.InsertFlow(t, db.Pool, 13, flow, "open", map[string]any{"namespace": "demo"})

	// River jobs, inserted by an insert-only client (no fleet runs here, so
	// they stay where they are): three row jobs available, one scan
	// scheduled.
	client, err := river.NewClient(riverpgxv5.New(db.Pool), &river.Config{Schema: testdb.RiverSchema})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := client.Insert(ctx, jobs.LeaseReleaseArgs{Partition: 7, ExecutionID: fftest.NewUUID(), AttemptIndex: int32(i)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.Insert(ctx, jobs.LeaseExpiryScanArgs{ScanArgs: jobs.ScanArgs{Partition: 7}}, &river.InsertOpts{ScheduledAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}

	t.Run("JSON", func(t *testing.T) {
		rep := statusJSON(t, db, "--top", "2")
		if rep.Filter != nil || rep.RiverSchema != "river" || !rep.WorkerTablePresent || rep.Leader != nil || len(rep.Workers) != 0 {
			t.Fatalf("report header %+v; want no filter, schema river, heartbeat table present, no leader, no workers", rep)
		}
		le := dueOf(t, rep, "lease_expiry")
		if le.Due != 6 || le.Capped || le.OutsideFilter != nil {
			t.Errorf("lease_expiry %+v; want 6 due, not capped, no outside count", le)
		}
		if want := []statusPartition{{7, 3}, {9, 2}}; len(le.TopPartitions) != 2 || le.TopPartitions[0] != want[0] || le.TopPartitions[1] != want[1] {
			t.Errorf("lease_expiry top partitions %+v; want %+v", le.TopPartitions, want)
		}
		for name, want := range map[string]int64{"suspension_timeout": 2, "delayed_promotion": 1, "cancel_dispatch": 1, "cancel_reconcile": 1} {
			if got := dueOf(t, rep, name); got.Due != want {
				t.Errorf("%s: %+v; want %d due", name, got, want)
			}
		}
		if want := []statusProbed{{"flow_summary", 1}}; !slices.Equal(rep.Probed, want) {
			t.Errorf("probed %+v; want %+v", rep.Probed, want)
		}
		if len(rep.Queues) != 4 || rep.Queues[3].Queue != jobs.QueueTrims {
			t.Fatalf("queues %+v; want ff_ticks, ff_control, ff_rows and ff_retention", rep.Queues)
		}
		for _, q := range rep.Queues {
			if len(q.States) != len(riverStates()) {
				t.Errorf("queue %s states %v; want every state listed", q.Queue, q.States)
			}
			want := map[string]map[string]int64{jobs.QueueControl: {"scheduled": 1}, jobs.QueueRows: {"available": 3}}[q.Queue]
			for s, n := range q.States {
				if n != want[s] {
					t.Errorf("queue %s state %s: %d jobs; want %d", q.Queue, s, n, want[s])
				}
			}
		}
		wantKinds := []statusKind{{jobs.KindLeaseRelease, 3}, {jobs.KindLeaseExpiryScan, 1}}
		if len(rep.UnfinishedByKind) != 2 || rep.UnfinishedByKind[0] != wantKinds[0] || rep.UnfinishedByKind[1] != wantKinds[1] {
			t.Errorf("unfinished by kind %+v; want %+v", rep.UnfinishedByKind, wantKinds)
		}
	})

	t.Run("JSONFiltered", func(t *testing.T) {
		rep := statusJSON(t, db, "--namespace", "demo", "--instance-tag", "")
		if rep.Filter == nil || rep.Filter.Namespace != "demo" {
			t.Fatalf("filter %+v; want namespace demo", rep.Filter)
		}
		le := dueOf(t, rep, "lease_expiry")
		if le.Due != 5 || le.OutsideFilter == nil || *le.OutsideFilter != 1 || len(le.TopPartitions) != 2 {
			t.Errorf("lease_expiry %+v; want 5 due, 1 outside the filter, 2 partitions shown", le)
		}
		// Field names are part of the contract: check the raw document.
		_, out, _ := runMain(t, ctx, "status", "--database-url", db.URL, "--format", "json", "--namespace", "demo")
		for _, key := range []string{`"generated_at"`, `"due_cap"`, `"outside_filter": 1`, `"top_partitions"`, `"unfinished_jobs_by_kind"`,
			`"leader": null`, `"worker_table_present": true`, `"workers": []`} {
			if !strings.Contains(out, key) {
				t.Errorf("JSON lacks %s:\n%s", key, out)
			}
		}
	})

	t.Run("Text", func(t *testing.T) {
		code, out, stderr := runMain(t, ctx, "status", "--database-url", db.URL, "--namespace", "demo")
		if code != 0 {
			t.Fatalf("exit %d, stderr %q", code, stderr)
		}
		for _, re := range []string{
			`filter: namespace=demo`,
			`(?m)^lease_expiry +5 +1 +p7: 3, p9: 2$`, // partition 200 is outside the filter
			`(?m)^suspension_timeout +2 +0 +p11: 2$`,
			`(?m)^delayed_promotion +1 +0 +p12: 1$`,
			`(?m)^cancel_dispatch +1 +0 +p13: 1$`,
			`(?m)^Reconcilers without due rows.*\n^RECONCILER +PARTITIONS TO PASS\n^flow_summary +1$`,
			`(?m)^QUEUE +AVAILABLE +SCHEDULED +PENDING +RUNNING +RETRYABLE +COMPLETED +DISCARDED +CANCELLED$`,
			`(?m)^ff_ticks +0 +0 +0 +0 +0 +0 +0 +0$`,
			`(?m)^ff_control +0 +1 +0 +0 +0 +0 +0 +0$`,
			`(?m)^ff_rows +3 +0 +0 +0 +0 +0 +0 +0$`,
			`(?m)^ff\.lease_expiry\.release +3$`,
			`Leader: none elected`,
			`(?m)^Workers .*\n^none$`,
		} {
			if !regexp.MustCompile(re).MatchString(out) {
				t.Errorf("output does not match %s:\n%s", re, out)
			}
		}
		// Without a filter: no outside count, and --top's default of 3.
		_, out, _ = runMain(t, ctx, "status", "--database-url", db.URL)
		if re := `(?m)^lease_expiry +6 +- +p7: 3, p9: 2, p200: 1$`; !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("unfiltered output does not match %s:\n%s", re, out)
		}
	})
}

func riverStates() []string {
	return []string{"available", "scheduled", "pending", "running", "retryable", "completed", "discarded", "cancelled"}
}

func TestStatusShowsLeaderAndHeartbeats(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	f := fleettest.Start(t, db, fleet.Config{Reconcilers: fleettest.Fast(workers.LeaseExpiry)})
	id := f.Client.ID()

	var rep statusReport
	fleettest.WaitFor(t, fleettest.Patient, "the fleet's leader and heartbeat in worker status", func() (bool, string) {
		rep = statusJSON(t, db)
		ok := rep.Leader != nil && rep.Leader.LeaderID == id && !rep.Leader.Expired &&
			len(rep.Workers) == 1 && rep.Workers[0].ClientID == id && rep.Workers[0].Leader
		return ok, fleettest.Statusf("leader %+v, workers %+v", rep.Leader, rep.Workers)
	})
	if w := rep.Workers[0]; w.PID <= 0 || w.Hostname == "" || w.Late || w.StartedAt.IsZero() {
		t.Errorf("worker %+v; want a pid, a host, a start time and a fresh heartbeat", w)
	}
	code, out, _ := runMain(t, context.Background(), "status", "--database-url", db.URL)
	if code != 0 || !regexp.MustCompile(`(?m)^Leader: `+regexp.QuoteMeta(id)+`, elected `).MatchString(out) ||
		!regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(id)+` +\S+ +[0-9]+ +\S+ +\S+ +[0-9.]+m?s ago +yes$`).MatchString(out) {
		t.Errorf("text status (exit %d) does not show %s as leader with a heartbeat:\n%s", code, id, out)
	}

	// A clean stop removes the process from the list at once.
	if err := f.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if rep := statusJSON(t, db); len(rep.Workers) != 0 {
		t.Errorf("workers after a clean stop: %+v; want none", rep.Workers)
	}
}

// TestStatusCountsRowsAsTheFleetTakesThem: with --reconcilers as the fleet
// runs them, an expired lease is counted for the one reconciler that takes
// it: in the default fleet, an active execution declaring retries for
// attempt_timeout and every other for lease_expiry, so their counts add up
// to the expired leases; a fleet running one of them counts them all for
// it, and shows only the reconcilers it runs. The dispatcher counts only
// the pending cancel groups it acts on (flag set or group missing); the
// reconciler counts them all. A regression counts a row for both, for
// neither, or a flag-clear group as the dispatcher's backlog.
func TestStatusCountsRowsAsTheFleetTakesThem(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	past := time.Now().Add(-time.Minute).UnixMilli()
	for i := range 5 {
		e := fftest.Exec{Partition: 7}
		if i < 2 {
			e.Policy = map[string]any{"retry_policy": map[string]any{"max_retries": 3}}
		}
		id := fftest.InsertExec(t, db.Pool, e)
		fftest.InsertAttempt(t, db.Pool, 7, id, 0, fftest.Ms(past))
	}
	// A lease left on a terminal execution: lease expiry's alone.
	id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: 8, LifecyclePhase: "terminal"})
	fftest.InsertAttempt(t, db.Pool, 8, id, 0, fftest.Ms(past))
	// Pending cancel groups: flag set, flag clear, orphan.
	for _, flag := range []bool{true, false} {
		flow := fftest.NewUUID()
		down := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: 13, FlowID: flow})
		fftest.InsertEdgeGroup(t, db.Pool, fftest.EdgeGroup{Partition: 13, FlowID: flow, DownstreamEID: down, Flag: flag})
		fftest.InsertPendingCancel(t, db.Pool, 13, flow, down, past)
	}
	fftest.InsertPendingCancel(t, db.Pool, 13, fftest.NewUUID(), fftest.NewUUID(), past)

	tests := []struct {
		name string
		args []string
		want map[string]int64 // reconciler → due; -1: not shown
	}{
		{"Default", nil, map[string]int64{"lease_expiry": 4, "attempt_timeout": 2, "cancel_dispatch": 2, "cancel_reconcile": 3}},
		{"Both", []string{"--reconcilers", "attempt_timeout,lease_expiry"}, map[string]int64{"lease_expiry": 4, "attempt_timeout": 2, "cancel_dispatch": -1}},
		{"LeaseExpiryOnly", []string{"--reconcilers", "lease_expiry"}, map[string]int64{"lease_expiry": 6, "attempt_timeout": -1}},
		{"AttemptTimeoutOnly", []string{"--reconcilers", "attempt_timeout,dependency"}, map[string]int64{"lease_expiry": -1, "attempt_timeout": 5, "dependency": 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := statusJSON(t, db, tt.args...)
			shown := map[string]int64{}
			for _, d := range rep.Due {
				shown[d.Reconciler] = d.Due
			}
			for name, want := range tt.want {
				got, ok := shown[name]
				switch {
				case want < 0 && ok:
					t.Errorf("%s shown (%d due) though the fleet does not run it", name, got)
				case want >= 0 && (!ok || got != want):
					t.Errorf("%s: %d due (shown %v); want %d", name, got, ok, want)
				}
			}
		})
	}
}

func TestStatusFailsWithOneClearLine(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	empty := testdb.NewEmpty(t)
	riverOnly := testdb.NewEmpty(t)
	if _, err := migrations.ApplyRiver(ctx, riverOnly.Pool, "river", nil); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"Unreachable", []string{"--database-url", "postgres://u:sekret@127.0.0.1:1/x?connect_timeout=2"}, 1, "cannot reach database postgres://u:xxxxx@127.0.0.1:1/x"},
		{"NoRiverSchema", []string{"--database-url", empty.URL}, 1, `River's tables are missing from schema "river"`},
		{"OtherRiverSchema", []string{"--database-url", riverOnly.URL, "--river-schema", "elsewhere"}, 1, `missing from schema "elsewhere"`},
		{"NoFFTables", []string{"--database-url", riverOnly.URL}, 1, "ff_exec_core"},
		{"BadFormat", []string{"--database-url", empty.URL, "--format", "yaml"}, 2, `--format must be text or json, got "yaml"`},
		{"BadTop", []string{"--database-url", empty.URL, "--top", "-1"}, 2, "--top must be in 0..256"},
		{"BadSchema", []string{"--database-url", empty.URL, "--river-schema", "a;b"}, 2, "invalid River schema name"},
		{"BadTag", []string{"--database-url", empty.URL, "--instance-tag", "novalue"}, 2, "want KEY=VALUE"},
		{"BadReconciler", []string{"--database-url", empty.URL, "--reconcilers", "lease_expiry,nope"}, 2, `unknown reconciler "nope"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, stderr := runMain(t, ctx, append([]string{"status"}, tt.args...)...)
			if code != tt.code || !strings.Contains(stderr, tt.want) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", code, stderr, tt.code, tt.want)
			}
			if lines := strings.Split(strings.TrimSpace(stderr), "\n"); len(lines) != 1 || !strings.HasPrefix(lines[0], "worker status: ") {
				t.Errorf("want exactly one error line; stderr %q", stderr)
			}
			if out != "" || strings.Contains(stderr, "sekret") {
				t.Errorf("stdout %q, stderr %q: want no output and no password", out, stderr)
			}
		})
	}
}
