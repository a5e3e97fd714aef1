package workers_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/workers"
)

// TestRawSQLBadJobsOfEveryKindAreCancelledOnce: for every kind with args to
// check, a job inserted without the Go hooks is cancelled at its first
// attempt with the reason, whether River cannot decode its args (caught
// around the worker, see Set.Middleware) or they decode to invalid values
// (caught in the worker wrapper, see validating). A kind registered without
// the wrapper would fail here: its bad-value job would run and error, or
// succeed, instead of being cancelled.
func TestRawSQLBadJobsOfEveryKindAreCancelledOnce(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	// An outbox retention (of a year, so nothing is trimmed) makes the
	// fleet work the retention queue, where the bad trim jobs go.
	f := fleettest.Start(t, db, fleet.Config{Reconcilers: map[string]time.Duration{workers.OutboxRetention.Name: time.Hour}, Settings: workers.Values{workers.OutboxAge: 365 * 24 * time.Hour}})

	const id = `"6f1c0b1e-2d3a-4b5c-8d9e-0a1b2c3d4e5f"`
	kinds := []struct {
		kind, queue, fields string // fields: the args' JSON after "partition"
	}{
		{jobs.KindLeaseExpiryScan, jobs.QueueControl, ``},
		{jobs.KindLeaseRelease, jobs.QueueRows, `, "execution_id": ` + id + `, "attempt_index": 0`},
		{jobs.KindSuspensionTimeoutScan, jobs.QueueControl, ``},
		{jobs.KindSuspensionExpire, jobs.QueueRows, `, "execution_id": ` + id},
		{jobs.KindDelayedPromotionScan, jobs.QueueControl, ``},
		{jobs.KindPromote, jobs.QueueRows, `, "execution_id": ` + id},
		{jobs.KindCancelDispatchScan, jobs.QueueControl, ``},
		{jobs.KindCancelDispatch, jobs.QueueRows, `, "flow_id": ` + id + `, "downstream_eid": ` + id},
		{jobs.KindCancelReconcileScan, jobs.QueueControl, ``},
		{jobs.KindCancelReconcile, jobs.QueueRows, `, "flow_id": ` + id + `, "downstream_eid": ` + id},
		{jobs.KindCancelBacklogScan, jobs.QueueControl, ``},
		{jobs.KindCancelBacklogDrain, jobs.QueueRows, `, "flow_id": ` + id},
		{jobs.KindAttemptTimeoutScan, jobs.QueueControl, ``},
		{jobs.KindAttemptExpire, jobs.QueueRows, `, "execution_id": ` + id + `, "attempt_index": 0`},
		{jobs.KindExecutionDeadlineScan, jobs.QueueControl, ``},
		{jobs.KindDeadlineExpire, jobs.QueueRows, `, "execution_id": ` + id},
		{jobs.KindWaitpointExpiryScan, jobs.QueueControl, ``},
		{jobs.KindWaitpointClose, jobs.QueueRows, `, "waitpoint_id": ` + id},
		{jobs.KindBudgetResetScan, jobs.QueueControl, ``},
		{jobs.KindBudgetReset, jobs.QueueRows, `, "budget_id": "b-1"`},
		{jobs.KindClaimGrantExpiryScan, jobs.QueueControl, ``},
		{jobs.KindClaimGrantExpire, jobs.QueueRows, `, "grant_id": "0a1b"`},
		{jobs.KindQuotaReconcileScan, jobs.QueueControl, ``},
		{jobs.KindQuotaReconcile, jobs.QueueRows, `, "quota_policy_id": "qp-1", "execution_id": "{fp:1}:x"`},
		{jobs.KindBudgetDedupExpiryScan, jobs.QueueControl, ``},
		{jobs.KindBudgetDedupDelete, jobs.QueueRows, `, "dedup_key": "k-1"`},
		{jobs.KindWorkerRegistryTTLScan, jobs.QueueControl, ``},
		{jobs.KindWorkerSweep, jobs.QueueRows, `, "namespace": "default", "worker_instance_id": "w-1"`},
		{jobs.KindDependencyScan, jobs.QueueControl, ``},
		{jobs.KindDependencyDispatch, jobs.QueueRows, `, "event_id": 7`},
		{jobs.KindRetentionTrim, jobs.QueueTrims, ``},
		{jobs.KindFlowSummaryProject, jobs.QueueControl, ``},
	}
	// Every reconciler's scan and row kinds are here, or a new reconciler
	// would go untested.
	for _, r := range workers.All() {
		for _, kind := range []string{r.ScanKind(), r.RowKind()} {
			if kind == "" {
				continue // retention has no row jobs
			}
			if !slices.ContainsFunc(kinds, func(k struct{ kind, queue, fields string }) bool { return k.kind == kind }) {
				t.Fatalf("kind %s of %s has no bad jobs here", kind, r.Name)
			}
		}
	}
	type job struct {
		name, prefix, reason string
		id                   int64
	}
	var inserted []job
	for _, k := range kinds {
		for _, bad := range []struct{ name, partition, want string }{
			{"BadValue", `256`, "partition 256 is out of range 0..255"},
			{"Undecodable", `"7"`, "malformed JSON args: json: cannot unmarshal string into Go struct field"},
		} {
			j := job{name: k.kind + "/" + bad.name, prefix: fmt.Sprintf("JobCancelError: invalid %s job: ", k.kind), reason: bad.want}
			j.id = db.InsertRawJob(t, k.kind, k.queue, "available", `{"partition": `+bad.partition+k.fields+`}`)
			inserted = append(inserted, j)
		}
	}
	for _, j := range inserted {
		t.Run(j.name, func(t *testing.T) {
			got := waitJobState(t, db.Pool, j.id, "cancelled")
			if got.Attempt != 1 || len(got.Errors) != 1 || !strings.HasPrefix(got.Errors[0], j.prefix) || !strings.Contains(got.Errors[0], j.reason) {
				t.Fatalf("job = %+v; want attempt 1 and the one error %q…%q…", got, j.prefix, j.reason)
			}
		})
	}
	var skipped int64
	for _, name := range workers.Names() {
		skipped += f.Workers.Stats().For(name).Skipped.Load()
	}
	if skipped != int64(len(inserted)) {
		t.Errorf("skipped = %d; want %d", skipped, len(inserted))
	}
}
