package store_test

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"testing"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// dueCase is one reconciler's due rows, for the suites below: seed inserts
// one of its rows in partition p, due at atMs, belonging to the tenant (ns,
// tag) ("" ns: no execution row at all), and returns the row's key as a
// scan reports it (DueRow.ID, and ID2 when it has one).
type dueCase struct {
	name string
	due  *store.Due
	seed func(t *testing.T, db store.DB, p int16, atMs int64, ns, tag string) string
	// missing is what a row without its execution is: due (unless a filter
	// is set), never due (the execution is part of what makes it due), or
	// impossible (the row is the execution, or belongs to no tenant).
	missing missingExec
	// extra checks what only this reconciler's rows do.
	extra func(t *testing.T, db store.DB, now int64)
}

type missingExec int

const (
	missingDue missingExec = iota
	missingNotDue
	missingImpossible
)

func execOf(t *testing.T, db store.DB, p int16, ns, tag string) string {
	if ns == "" {
		return fftest.NewUUID()
	}
	e := fftest.Exec{Partition: p, Namespace: ns}
	if tag != "" {
		e.Tags = map[string]string{"cairn.instance_id": tag}
	}
	return fftest.InsertExec(t, db, e)
}

func keyOf(r store.DueRow) string {
	if r.ID2 != "" {
		return r.ID + "/" + r.ID2
	}
	return r.ID
}

var dueCases = []dueCase{
	{
		// A cancel backlog header passes the filter through its members'
		// executions; one whose only member's execution is missing is due
		// and passes no filter.
		name: "CancelBacklogHeaders", due: store.CancelBacklogHeaders,
		seed: func(t *testing.T, db store.DB, p int16, at int64, ns, tag string) string {
			flow := fftest.NewUUID()
			fftest.InsertBacklog(t, db, fftest.Backlog{Partition: p, FlowID: flow, RequestedAtMs: at,
				Members: []string{fftest.WireID(p, execOf(t, db, p, ns, tag))}})
			return flow
		},
		missing: missingDue,
		extra: func(t *testing.T, db store.DB, now int64) {
			// Two members of the filter's tenant, a bad member id and one of
			// another partition: the header is one row, and the bad ids
			// neither fail the scan nor pass the filter.
			flow := fftest.NewUUID()
			fftest.InsertBacklog(t, db, fftest.Backlog{Partition: 150, FlowID: flow, RequestedAtMs: now - 5,
				Members: []string{fftest.WireID(150, execOf(t, db, 150, "a", "")), fftest.WireID(150, execOf(t, db, 150, "a", "")),
					"junk", fftest.WireID(151, execOf(t, db, 151, "b", ""))}})
			got := scan(t, db, store.CancelBacklogHeaders, 150, now, nil, 10, store.Filter{Namespace: "a"})
			if len(got) != 1 || got[0].ID != flow {
				t.Fatalf("scan = %+v; want the header once", got)
			}
			if got := scan(t, db, store.CancelBacklogHeaders, 150, now, nil, 10, store.Filter{Namespace: "b"}); len(got) != 0 {
				t.Fatalf("scan for the tenant of a member of another partition = %+v; want none", got)
			}
		},
	},
	{
		name: "ExpiredLeases", due: store.ExpiredLeases,
		seed: func(t *testing.T, db store.DB, p int16, at int64, ns, tag string) string {
			id := execOf(t, db, p, ns, tag)
			fftest.InsertAttempt(t, db, p, id, 0, fftest.Ms(at))
			return id
		},
		extra: func(t *testing.T, db store.DB, now int64) {
			// Another attempt of one execution: the attempt index breaks
			// the tie, and a released attempt (NULL lease) is never due.
			id := execOf(t, db, 150, "a", "")
			fftest.InsertAttempt(t, db, 150, id, 1, fftest.Ms(now-5))
			fftest.InsertAttempt(t, db, 150, id, 0, fftest.Ms(now-5))
			fftest.InsertAttempt(t, db, 150, id, 2, nil)
			got := scan(t, db, store.ExpiredLeases, 150, now, nil, 10, store.Filter{})
			if len(got) != 2 || got[0].N != 0 || got[1].N != 1 {
				t.Fatalf("scan = %+v; want attempts 0 and 1 of one execution, in that order", got)
			}
		},
	},
	{
		// Lease expiry's share when attempt timeout also runs: an execution
		// without a retry policy, or not active, or missing, is its own.
		name: "ExpiredLeasesShare", due: store.ExpiredLeasesShare,
		seed: func(t *testing.T, db store.DB, p int16, at int64, ns, tag string) string {
			id := execOf(t, db, p, ns, tag)
			fftest.InsertAttempt(t, db, p, id, 0, fftest.Ms(at))
			return id
		},
		extra: func(t *testing.T, db store.DB, now int64) {
			// An active execution declaring retries is attempt timeout's; a
			// terminal one declaring them, or an active one declaring 0, is
			// lease expiry's.
			retries := map[string]any{"retry_policy": map[string]any{"max_retries": 2}}
			id := fftest.InsertExec(t, db, fftest.Exec{Partition: 150, Policy: retries})
			fftest.InsertAttempt(t, db, 150, id, 0, fftest.Ms(now-5))
			terminal := fftest.InsertExec(t, db, fftest.Exec{Partition: 150, LifecyclePhase: "terminal", Policy: retries})
			fftest.InsertAttempt(t, db, 150, terminal, 0, fftest.Ms(now-4))
			none := fftest.InsertExec(t, db, fftest.Exec{Partition: 150,
				Policy: map[string]any{"retry_policy": map[string]any{"max_retries": 0}}})
			fftest.InsertAttempt(t, db, 150, none, 0, fftest.Ms(now-3))
			got := scan(t, db, store.ExpiredLeasesShare, 150, now, nil, 10, store.Filter{})
			if len(got) != 2 || got[0].ID != terminal || got[1].ID != none {
				t.Fatalf("scan = %+v; want the terminal execution's lease and the one declaring 0 retries, not %s's", got, id)
			}
		},
	},
	{
		name: "TimedOutSuspensions", due: store.TimedOutSuspensions,
		seed: func(t *testing.T, db store.DB, p int16, at int64, ns, tag string) string {
			id := execOf(t, db, p, ns, tag)
			fftest.InsertSuspension(t, db, fftest.Suspension{Partition: p, ExecutionID: id, TimeoutAtMs: fftest.Ms(at)})
			return id
		},
		extra: func(t *testing.T, db store.DB, now int64) {
			id := execOf(t, db, 150, "a", "")
			fftest.InsertSuspension(t, db, fftest.Suspension{Partition: 150, ExecutionID: id}) // no timeout
			if got := scan(t, db, store.TimedOutSuspensions, 150, now, nil, 10, store.Filter{}); len(got) != 0 {
				t.Fatalf("a suspension without a timeout was scanned: %+v", got)
			}
		},
	},
	{
		name: "DelayedExecutions", due: store.DelayedExecutions, missing: missingImpossible,
		seed: func(t *testing.T, db store.DB, p int16, at int64, ns, tag string) string {
			e := fftest.Delayed(p, at)
			e.Namespace = ns
			if tag != "" {
				e.Tags = map[string]string{"cairn.instance_id": tag}
			}
			return fftest.InsertExec(t, db, e)
		},
		extra: func(t *testing.T, db store.DB, now int64) {
			// Due at exactly now (the seed's <=); never an active execution
			// past its execution deadline, nor one already promoted.
			due := fftest.InsertExec(t, db, fftest.Delayed(150, now))
			fftest.InsertExec(t, db, fftest.Exec{Partition: 150, EligibilityState: "not_eligible_until_time", DeadlineAtMs: fftest.Ms(now - 500)})
			e := fftest.Delayed(150, now-400)
			e.EligibilityState = "eligible_now"
			fftest.InsertExec(t, db, e)
			got := scan(t, db, store.DelayedExecutions, 150, now, nil, 10, store.Filter{})
			if len(got) != 1 || got[0].ID != due || got[0].AtMs != now {
				t.Fatalf("scan = %+v; want only %s, due at %d", got, due, now)
			}
		},
	},
	{
		name: "PendingCancelGroups", due: store.PendingCancelGroups,
		seed: func(t *testing.T, db store.DB, p int16, at int64, ns, tag string) string {
			flow, downstream := fftest.NewUUID(), execOf(t, db, p, ns, tag)
			fftest.InsertPendingCancel(t, db, p, flow, downstream, at)
			return flow + "/" + downstream
		},
		extra: func(t *testing.T, db store.DB, now int64) {
			// Enqueued at the same time, groups are ordered by flow id.
			flowA, flowB := "00000000-0000-4000-8000-00000000000a", "00000000-0000-4000-8000-00000000000b"
			b, a := execOf(t, db, 150, "a", ""), execOf(t, db, 150, "a", "")
			fftest.InsertPendingCancel(t, db, 150, flowB, b, 10)
			fftest.InsertPendingCancel(t, db, 150, flowA, a, 10)
			got := scan(t, db, store.PendingCancelGroups, 150, now, nil, 10, store.Filter{})
			if len(got) != 2 || got[0].ID != flowA || got[1].ID != flowB {
				t.Fatalf("scan = %+v; want flow a then flow b", got)
			}
			got = scan(t, db, store.PendingCancelGroups, 150, now, &got[0], 10, store.Filter{})
			if len(got) != 1 || got[0].ID != flowB {
				t.Fatalf("scan after the first of a tie = %+v; want flow b", got)
			}
		},
	},
	{
		// The dispatcher's pending groups: the seed's have no edge group
		// (orphans, which it deletes); a group with its flag set is due,
		// one with its flag clear is left to the reconciler.
		name: "DispatchableCancelGroups", due: store.DispatchableCancelGroups,
		seed: func(t *testing.T, db store.DB, p int16, at int64, ns, tag string) string {
			flow, downstream := fftest.NewUUID(), execOf(t, db, p, ns, tag)
			fftest.InsertPendingCancel(t, db, p, flow, downstream, at)
			return flow + "/" + downstream
		},
		extra: func(t *testing.T, db store.DB, now int64) {
			set, clear := fftest.NewUUID(), fftest.NewUUID()
			a, b := execOf(t, db, 150, "a", ""), execOf(t, db, 150, "a", "")
			fftest.InsertEdgeGroup(t, db, fftest.EdgeGroup{Partition: 150, FlowID: set, DownstreamEID: a, Flag: true})
			fftest.InsertEdgeGroup(t, db, fftest.EdgeGroup{Partition: 150, FlowID: clear, DownstreamEID: b})
			fftest.InsertPendingCancel(t, db, 150, clear, b, 10)
			fftest.InsertPendingCancel(t, db, 150, set, a, 20)
			got := scan(t, db, store.DispatchableCancelGroups, 150, now, nil, 10, store.Filter{})
			if len(got) != 1 || got[0].ID != set {
				t.Fatalf("scan = %+v; want the flag-set group %s only", got, set)
			}
			if all := scan(t, db, store.PendingCancelGroups, 150, now, nil, 10, store.Filter{}); len(all) != 2 {
				t.Fatalf("the reconciler's scan = %+v; want both groups", all)
			}
		},
	},
	{
		name: "TimedOutAttempts", due: store.TimedOutAttempts, missing: missingNotDue,
		seed: func(t *testing.T, db store.DB, p int16, at int64, ns, tag string) string {
			id := execOf(t, db, p, ns, tag)
			fftest.InsertAttempt(t, db, p, id, 0, fftest.Ms(at))
			return id
		},
		extra: func(t *testing.T, db store.DB, now int64) {
			// An expired lease of an execution no longer active is lease
			// expiry's alone.
			id := fftest.InsertExec(t, db, fftest.Exec{Partition: 150, LifecyclePhase: "runnable", OwnershipState: "unowned"})
			fftest.InsertAttempt(t, db, 150, id, 0, fftest.Ms(now-5))
			if got := scan(t, db, store.TimedOutAttempts, 150, now, nil, 10, store.Filter{}); len(got) != 0 {
				t.Fatalf("an attempt of a runnable execution was scanned: %+v", got)
			}
		},
	},
	{
		// Attempt timeout's share when lease expiry also runs: attempts of
		// active executions declaring retries.
		name: "TimedOutAttemptsShare", due: store.TimedOutAttemptsShare, missing: missingNotDue,
		seed: func(t *testing.T, db store.DB, p int16, at int64, ns, tag string) string {
			if ns == "" {
				id := fftest.NewUUID()
				fftest.InsertAttempt(t, db, p, id, 0, fftest.Ms(at))
				return id
			}
			e := fftest.Exec{Partition: p, Namespace: ns, Policy: map[string]any{"retry_policy": map[string]any{"max_retries": 1}}}
			if tag != "" {
				e.Tags = map[string]string{"cairn.instance_id": tag}
			}
			id := fftest.InsertExec(t, db, e)
			fftest.InsertAttempt(t, db, p, id, 0, fftest.Ms(at))
			return id
		},
		extra: func(t *testing.T, db store.DB, now int64) {
			// No retry policy, or an execution no longer active: lease
			// expiry's.
			id := fftest.InsertExec(t, db, fftest.Exec{Partition: 150})
			fftest.InsertAttempt(t, db, 150, id, 0, fftest.Ms(now-5))
			id = fftest.InsertExec(t, db, fftest.Exec{Partition: 150, LifecyclePhase: "runnable", OwnershipState: "unowned",
				Policy: map[string]any{"retry_policy": map[string]any{"max_retries": 3}}})
			fftest.InsertAttempt(t, db, 150, id, 0, fftest.Ms(now-5))
			if got := scan(t, db, store.TimedOutAttemptsShare, 150, now, nil, 10, store.Filter{}); len(got) != 0 {
				t.Fatalf("an attempt without retries, or of a runnable execution, was scanned: %+v", got)
			}
		},
	},
	{
		name: "PastDeadlineExecutions", due: store.PastDeadlineExecutions, missing: missingImpossible,
		seed: func(t *testing.T, db store.DB, p int16, at int64, ns, tag string) string {
			e := fftest.Exec{Partition: p, Namespace: ns, DeadlineAtMs: fftest.Ms(at)}
			if tag != "" {
				e.Tags = map[string]string{"cairn.instance_id": tag}
			}
			return fftest.InsertExec(t, db, e)
		},
		extra: func(t *testing.T, db store.DB, now int64) {
			// deadline_at_ms also holds delay-untils, and terminal rows keep
			// theirs: only active executions are due.
			fftest.InsertExec(t, db, fftest.Delayed(150, now-10))
			fftest.InsertExec(t, db, fftest.Exec{Partition: 150, LifecyclePhase: "terminal", DeadlineAtMs: fftest.Ms(now - 10)})
			fftest.InsertExec(t, db, fftest.Exec{Partition: 150})
			if got := scan(t, db, store.PastDeadlineExecutions, 150, now, nil, 10, store.Filter{}); len(got) != 0 {
				t.Fatalf("a delayed, terminal or deadline-less execution was scanned: %+v", got)
			}
		},
	},
	{
		name: "ExpiredWaitpoints", due: store.ExpiredWaitpoints,
		seed: func(t *testing.T, db store.DB, p int16, at int64, ns, tag string) string {
			return fftest.InsertWaitpoint(t, db, fftest.Waitpoint{Partition: p, ExecutionID: execOf(t, db, p, ns, tag), ExpiresAtMs: fftest.Ms(at)})
		},
		extra: func(t *testing.T, db store.DB, now int64) {
			exec := execOf(t, db, 150, "a", "")
			active := fftest.InsertWaitpoint(t, db, fftest.Waitpoint{Partition: 150, ExecutionID: exec, State: "active", ExpiresAtMs: fftest.Ms(now - 5)})
			fftest.InsertWaitpoint(t, db, fftest.Waitpoint{Partition: 150, ExecutionID: exec})
			got := scan(t, db, store.ExpiredWaitpoints, 150, now, nil, 10, store.Filter{})
			if len(got) != 1 || got[0].ID != active {
				t.Fatalf("scan = %+v; want the active waitpoint only (one without an expiry never is)", got)
			}
		},
	},
	{
		name: "DueBudgetResets", due: store.DueBudgetResets, missing: missingImpossible,
		seed: func(t *testing.T, db store.DB, p int16, at int64, _, _ string) string {
			return fftest.InsertBudget(t, db, fftest.Budget{Partition: p, NextResetAtMs: fftest.Ms(at)})
		},
		extra: func(t *testing.T, db store.DB, now int64) {
			// Due at exactly now (FlowFabric's <=); a budget partition beyond
			// the budget partition count is never walked.
			id := fftest.InsertBudget(t, db, fftest.Budget{Partition: 150, NextResetAtMs: fftest.Ms(now)})
			fftest.InsertBudget(t, db, fftest.Budget{Partition: 150})
			got := scan(t, db, store.DueBudgetResets, 150, now, nil, 10, store.Filter{})
			if len(got) != 1 || got[0].ID != id {
				t.Fatalf("scan = %+v; want the budget due at now only", got)
			}
			parts, err := store.DueBudgetResets.Partitions(context.Background(), db, store.NoLowerBound, now, 32, store.Filter{})
			if err != nil || slices.Contains(parts, 150) {
				t.Fatalf("partitions of 0..31 = %v, %v; want no 150", parts, err)
			}
		},
	},
	{
		name: "ExpiredClaimGrants", due: store.ExpiredClaimGrants,
		seed: func(t *testing.T, db store.DB, p int16, at int64, ns, tag string) string {
			return fftest.InsertGrant(t, db, fftest.Grant{Partition: p, ExecutionID: execOf(t, db, p, ns, tag), ExpiresAtMs: at})
		},
		extra: func(t *testing.T, db store.DB, now int64) {
			// Expired strictly before now (claim_execution still takes a
			// grant at now); expiry 0 never expires.
			exec := execOf(t, db, 150, "a", "")
			old := fftest.InsertGrant(t, db, fftest.Grant{Partition: 150, ExecutionID: exec, Kind: "reclaim", ExpiresAtMs: now - 1})
			fftest.InsertGrant(t, db, fftest.Grant{Partition: 150, ExecutionID: exec, ExpiresAtMs: now})
			fftest.InsertGrant(t, db, fftest.Grant{Partition: 150, ExecutionID: exec, ExpiresAtMs: 0})
			got := scan(t, db, store.ExpiredClaimGrants, 150, now, nil, 10, store.Filter{})
			if len(got) != 1 || got[0].ID != old {
				t.Fatalf("scan = %+v; want the grant expired before now only", got)
			}
		},
	},
	{
		name: "ExpiredQuotaAdmissions", due: store.ExpiredQuotaAdmissions, missing: missingImpossible,
		seed: func(t *testing.T, db store.DB, p int16, at int64, _, _ string) string {
			ex := "{fp:1}:" + fftest.NewUUID()
			fftest.InsertQuotaAdmitted(t, db, p, "qp-"+strconv.FormatInt(at, 10), ex, at)
			return "qp-" + strconv.FormatInt(at, 10) + "/" + ex
		},
		extra: func(t *testing.T, db store.DB, now int64) {
			// Expired at exactly now (check_admission's guard is live while
			// expires_at_ms > now).
			fftest.InsertQuotaAdmitted(t, db, 150, "qp", "{fp:1}:x", now)
			fftest.InsertQuotaAdmitted(t, db, 150, "qp", "{fp:1}:y", now+1)
			got := scan(t, db, store.ExpiredQuotaAdmissions, 150, now, nil, 10, store.Filter{})
			if len(got) != 1 || keyOf(got[0]) != "qp/{fp:1}:x" {
				t.Fatalf("scan = %+v; want the admission expiring at now only", got)
			}
		},
	},
	{
		name: "ExpiredBudgetDedupKeys", due: store.ExpiredBudgetDedupKeys, missing: missingImpossible,
		seed: func(t *testing.T, db store.DB, p int16, at int64, _, _ string) string {
			key := "dedup-" + fftest.NewUUID()
			fftest.InsertBudgetDedup(t, db, p, key, at)
			return key
		},
		extra: func(t *testing.T, db store.DB, now int64) {
			fftest.InsertBudgetDedup(t, db, 150, "k-now", now)
			old := "k-old"
			fftest.InsertBudgetDedup(t, db, 150, old, now-1)
			got := scan(t, db, store.ExpiredBudgetDedupKeys, 150, now, nil, 10, store.Filter{})
			if len(got) != 1 || got[0].ID != old {
				t.Fatalf("scan = %+v; want the key expired before now only", got)
			}
		},
	},
	{
		name: "StaleWorkers", due: store.StaleWorkers, missing: missingImpossible,
		seed: func(t *testing.T, db store.DB, p int16, at int64, ns, _ string) string {
			if ns == "" {
				ns = "default"
			}
			id := fftest.InsertWorker(t, db, fftest.Worker{Partition: p, Namespace: ns, LastHeartbeatMs: at - 30_000, TTLMs: 30_000})
			return ns + "/" + id
		},
		extra: func(t *testing.T, db store.DB, now int64) {
			// The TTL is the row's own; a sum of exactly now is not stale
			// (strict <); a sum past the bigint range is never stale and
			// fails nothing.
			stale := fftest.InsertWorker(t, db, fftest.Worker{Partition: 150, LastHeartbeatMs: now - 2_000, TTLMs: 1_000})
			fftest.InsertWorker(t, db, fftest.Worker{Partition: 150, LastHeartbeatMs: now - 2_000, TTLMs: 60_000})
			fftest.InsertWorker(t, db, fftest.Worker{Partition: 150, LastHeartbeatMs: now - 1_000, TTLMs: 1_000})
			fftest.InsertWorker(t, db, fftest.Worker{Partition: 150, LastHeartbeatMs: 9_223_372_036_854_775_000, TTLMs: 10_000})
			got := scan(t, db, store.StaleWorkers, 150, now, nil, 10, store.Filter{})
			if len(got) != 1 || got[0].ID2 != stale {
				t.Fatalf("scan = %+v; want %s only", got, stale)
			}
		},
	},
	{
		// A completion event carries its tenant in its own columns: with no
		// namespace ("" ns) it passes no filter but is due.
		name: "CompletionEvents", due: store.CompletionEvents, missing: missingDue,
		seed: func(t *testing.T, db store.DB, p int16, at int64, ns, tag string) string {
			c := fftest.Completion{Partition: p, ExecutionID: fftest.NewUUID(), Outcome: "success", CommittedAtMs: at}
			if ns != "" {
				c.Namespace = fftest.Str(ns)
			}
			if tag != "" {
				c.InstanceTag = fftest.Str(tag)
			}
			return strconv.FormatInt(fftest.InsertCompletion(t, db, c), 10)
		},
		extra: func(t *testing.T, db store.DB, now int64) {
			// A dispatched event is never due again.
			due := fftest.InsertCompletion(t, db, fftest.Completion{Partition: 150, ExecutionID: fftest.NewUUID(), Outcome: "success", CommittedAtMs: now - 5})
			done := fftest.InsertCompletion(t, db, fftest.Completion{Partition: 150, ExecutionID: fftest.NewUUID(), Outcome: "failed", CommittedAtMs: now - 6})
			if _, err := db.Exec(context.Background(), `UPDATE ff_completion_event SET dispatched_at_ms = 1 WHERE event_id = $1`, done); err != nil {
				t.Fatal(err)
			}
			got := scan(t, db, store.CompletionEvents, 150, now, nil, 10, store.Filter{})
			if len(got) != 1 || got[0].ID != strconv.FormatInt(due, 10) {
				t.Fatalf("scan = %+v; want only event %d (event %d is dispatched)", got, due, done)
			}
		},
	},
	{
		name: "TerminalExecutions", due: store.TerminalExecutions, missing: missingImpossible,
		seed: func(t *testing.T, db store.DB, p int16, at int64, ns, tag string) string {
			e := fftest.Terminal(p, at)
			e.Namespace = ns
			if tag != "" {
				e.Tags = map[string]string{"cairn.instance_id": tag}
			}
			return fftest.InsertExec(t, db, e)
		},
		extra: func(t *testing.T, db store.DB, now int64) {
			// Only terminal executions, ended at or before the cutoff.
			at := fftest.InsertExec(t, db, fftest.Terminal(150, now))
			fftest.InsertExec(t, db, fftest.Exec{Partition: 150, TerminalAtMs: fftest.Ms(now - 100)})
			got := scan(t, db, store.TerminalExecutions, 150, now, nil, 10, store.Filter{})
			if len(got) != 1 || got[0].ID != at {
				t.Fatalf("scan = %+v; want only %s", got, at)
			}
		},
	},
}

// TestDueCasesCoverTheRegistry: every registered reconciler's due rows have a
// case above, so a new reconciler cannot skip TestDueScans and
// TestCountDueAndTopPartitions by being left out of a hand list.
func TestDueCasesCoverTheRegistry(t *testing.T) {
	t.Parallel()
	for _, r := range workers.All() {
		if r.HasDue() && !slices.ContainsFunc(dueCases, func(c dueCase) bool { return c.due == r.Due }) {
			t.Errorf("reconciler %s: its due rows (%s) have no case in dueCases", r.Name, r.Due.What)
		}
	}
}

func scan(t *testing.T, db store.DB, due *store.Due, p int16, now int64, after *store.DueRow, limit int, f store.Filter) []store.DueRow {
	t.Helper()
	got, err := due.Scan(context.Background(), db, p, now, after, limit, f)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestDueScans: for every reconciler's due rows, a partition scan returns the
// due rows oldest first, up to its limit, after a cursor, and only those of
// the tenant the filter names (a row without an execution passes no filter);
// the tick's probe finds exactly the partitions holding such rows, within
// the partition count it is given. A regression shows as a row out of order,
// a row not due or of another tenant returned, or a partition missed.
func TestDueScans(t *testing.T) {
	t.Parallel()
	for _, tc := range dueCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t).Pool
			const now = int64(3_000_000)
			const p = int16(11)
			// Partition 11: due rows of tenant a (tag i1), tenant b and, where
			// rows can lack one, no execution; one not due (unless rows are
			// due as soon as they exist). Partition 12: one due row of
			// tenant a. Partition 13: a row not due.
			a := tc.seed(t, db, p, now-300, "a", "i1")
			b := tc.seed(t, db, p, now-200, "b", "")
			want := []string{a, b}
			switch tc.missing {
			case missingDue:
				want = append(want, tc.seed(t, db, p, now-100, "", ""))
			case missingNotDue:
				tc.seed(t, db, p, now-100, "", "")
			}
			if !tc.due.Always {
				tc.seed(t, db, p, now+100, "a", "i1")
				tc.seed(t, db, 13, now+100, "a", "")
			}
			tc.seed(t, db, 12, now-1, "a", "")
			first := scan(t, db, tc.due, p, now, nil, 1, store.Filter{})

			// Rows of no tenant (budgets, worker registrations) ignore the
			// filter, as FlowFabric does.
			onlyB, onlyA, none := []string{b}, []string{a}, []string(nil)
			inB, inA, inNone := []int16{11}, []int16{11}, []int16{}
			if !tc.due.Tenant {
				onlyB, onlyA, none = want, want, want
				inB, inA, inNone = []int16{11, 12}, []int16{11, 12}, []int16{11, 12}
			}
			tests := []struct {
				name   string
				filter store.Filter
				after  *store.DueRow
				limit  int
				want   []string
				parts  []int16
			}{
				{name: "OldestFirst", limit: 10, want: want, parts: []int16{11, 12}},
				{name: "Limit", limit: 2, want: want[:2], parts: []int16{11, 12}},
				{name: "After", limit: 10, after: &first[0], want: want[1:], parts: []int16{11, 12}},
				{name: "Namespace", filter: store.Filter{Namespace: "b"}, limit: 10, want: onlyB, parts: inB},
				{name: "Tag", filter: store.Filter{TagKey: "cairn.instance_id", TagValue: "i1"}, limit: 10, want: onlyA, parts: inA},
				{name: "NamespaceAndTag", filter: store.Filter{Namespace: "a", TagKey: "cairn.instance_id", TagValue: "i1"}, limit: 10, want: onlyA, parts: inA},
				{name: "NamespaceAndTagMismatch", filter: store.Filter{Namespace: "b", TagKey: "cairn.instance_id", TagValue: "i1"}, limit: 10, want: none, parts: inNone},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					var got []string
					for _, r := range scan(t, db, tc.due, p, now, tt.after, tt.limit, tt.filter) {
						got = append(got, keyOf(r))
					}
					if !slices.Equal(got, tt.want) {
						t.Fatalf("scan = %v; want %v", got, tt.want)
					}
					parts, err := tc.due.Partitions(ctx, db, store.NoLowerBound, now, 256, tt.filter)
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(parts, tt.parts) {
						t.Fatalf("due partitions = %v; want %v", parts, tt.parts)
					}
				})
			}
			t.Run("ReportsDeadlines", func(t *testing.T) {
				if first[0].AtMs != now-300 {
					t.Fatalf("first row due at %d; want %d", first[0].AtMs, now-300)
				}
			})
			// Oldest: the age gauge's deadline is the oldest due row's that
			// passes the filter, over the partitions asked for. A regression
			// (a probe that reads the newest row, ignores the filter or the
			// partition count) reports a stall where there is none or hides
			// one.
			oldestB := now - 200
			if !tc.due.Tenant {
				oldestB = now - 300
			}
			oldest := []struct {
				name   string
				filter store.Filter
				parts  int
				want   int64
				found  bool
			}{
				{"All", store.Filter{}, 256, now - 300, true},
				{"Namespace", store.Filter{Namespace: "b"}, 256, oldestB, true},
				{"NamespaceAndTagMismatch", store.Filter{Namespace: "b", TagKey: "cairn.instance_id", TagValue: "i1"}, 256, now - 300, !tc.due.Tenant},
				{"PartitionCountLimitsIt", store.Filter{}, 11, 0, false},
			}
			for _, tt := range oldest {
				t.Run("Oldest"+tt.name, func(t *testing.T) {
					got, found, err := tc.due.Oldest(ctx, db, now, tt.parts, tt.filter)
					if err != nil {
						t.Fatal(err)
					}
					if found != tt.found || (found && got != tt.want) {
						t.Fatalf("Oldest = %d, %v; want %d, %v", got, found, tt.want, tt.found)
					}
				})
			}
			t.Run("PartitionCountLimitsTheProbe", func(t *testing.T) {
				parts, err := tc.due.Partitions(ctx, db, store.NoLowerBound, now, 12, store.Filter{})
				if err != nil || !slices.Equal(parts, []int16{11}) {
					t.Fatalf("due partitions of 0..11 = %v, %v; want [11]", parts, err)
				}
			})
			if tc.extra != nil {
				t.Run("Own", func(t *testing.T) { tc.extra(t, db, now) })
			}
		})
	}
}

// TestDuePartitionsHorizon checks the horizon ticks pass (now plus the
// lookahead): a partition whose earliest row falls due before it is found,
// one whose rows all fall due after it is not, and partitions come out in
// partition order, the order their scans are enqueued in. A lower bound (the
// tick's probe for rows not yet due) leaves out partitions holding only
// older rows. The counts a tick takes of its busy partitions count the rows
// due at now, with the filter applied.
func TestDuePartitionsHorizon(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	const now = int64(7_000_000)
	// Partitions 40, 7 (two rows), 3 and 12 hold rows already due; 20 only
	// a row due at now+200 (inside a 500 ms lookahead); 30 only one due at
	// now+900 (outside it).
	rows := []struct {
		p  int16
		at int64
	}{{7, now - 50}, {12, now - 100}, {3, now - 100}, {7, now - 200}, {40, now - 300}, {20, now + 200}, {30, now + 900}}
	for _, r := range rows {
		e := fftest.Delayed(r.p, r.at)
		e.Namespace = "a"
		id := fftest.InsertExec(t, db.Pool, e)
		fftest.InsertAttempt(t, db.Pool, r.p, id, 0, fftest.Ms(r.at))
		fftest.InsertSuspension(t, db.Pool, fftest.Suspension{Partition: r.p, ExecutionID: id, TimeoutAtMs: fftest.Ms(r.at)})
	}
	tests := []struct {
		name          string
		from, horizon int64
		filter        store.Filter
		want          []int16
	}{
		{"Now", store.NoLowerBound, now, store.Filter{}, []int16{3, 7, 12, 40}},
		{"Lookahead", store.NoLowerBound, now + 500, store.Filter{}, []int16{3, 7, 12, 20, 40}},
		// From is inclusive: 7's row at now-50 is in; 3, 12 and 40 hold
		// only rows older than from.
		{"From", now - 50, now + 500, store.Filter{}, []int16{7, 20}},
		{"NotYetDue", now, now + 1000, store.Filter{}, []int16{20, 30}},
		{"Filtered", store.NoLowerBound, now + 500, store.Filter{Namespace: "a"}, []int16{3, 7, 12, 20, 40}},
		{"NothingOutsideFilter", store.NoLowerBound, now + 500, store.Filter{Namespace: "other"}, []int16{}},
	}
	parts := []int16{3, 7, 12, 20, 40, 99}
	counts := []struct {
		name   string
		filter store.Filter
		want   map[int16]int
	}{
		{"All", store.Filter{}, map[int16]int{3: 1, 7: 2, 12: 1, 20: 0, 40: 1, 99: 0}},
		{"NothingOutsideFilter", store.Filter{Namespace: "other"}, map[int16]int{3: 0, 7: 0, 12: 0, 20: 0, 40: 0, 99: 0}},
	}
	for _, due := range []*store.Due{store.ExpiredLeases, store.TimedOutSuspensions, store.DelayedExecutions} {
		for _, tt := range tests {
			t.Run(due.What+"/"+tt.name, func(t *testing.T) {
				got, err := due.Partitions(ctx, db.Pool, tt.from, tt.horizon, 256, tt.filter)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, tt.want) {
					t.Fatalf("due partitions = %v; want %v", got, tt.want)
				}
			})
		}
		for _, tt := range counts {
			t.Run(due.What+"/Count"+tt.name, func(t *testing.T) {
				got, err := due.Counts(ctx, db.Pool, now, parts, tt.filter)
				if err != nil {
					t.Fatal(err)
				}
				if !maps.Equal(got, tt.want) {
					t.Fatalf("due counts = %v; want %v", got, tt.want)
				}
			})
		}
	}
}

// TestCountDueAndTopPartitions: the gauge's count stops at its cap, counts
// the rows a filter leaves to other fleets apart (a row without an execution
// is outside every filter), and the ranking puts the fullest partition first.
func TestCountDueAndTopPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	const now = int64(5_000_000)
	// Partition 3: three due (two of tenant a); partition 8: one due of
	// tenant a; one not due; one orphan attempt (no execution row).
	for i, ns := range []string{"a", "a", "b"} {
		id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: 3, Namespace: ns})
		fftest.InsertAttempt(t, db.Pool, 3, id, 0, fftest.Ms(now-int64(10+i)))
	}
	id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: 8, Namespace: "a"})
	fftest.InsertAttempt(t, db.Pool, 8, id, 0, fftest.Ms(now-1))
	id = fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: 8, Namespace: "a"})
	fftest.InsertAttempt(t, db.Pool, 8, id, 0, fftest.Ms(now+1))
	fftest.InsertAttempt(t, db.Pool, 9, fftest.NewUUID(), 0, fftest.Ms(now-1))

	tests := []struct {
		name    string
		filter  store.Filter
		cap     int
		want    store.DueCount
		wantTop []store.PartitionDue
	}{
		{"All", store.Filter{}, 100, store.DueCount{Due: 5}, []store.PartitionDue{{3, 3}, {8, 1}}},
		{"Capped", store.Filter{}, 2, store.DueCount{Due: 2, Capped: true}, nil},
		{"Tenant", store.Filter{Namespace: "a"}, 100, store.DueCount{Due: 3, OutsideFilter: 2}, []store.PartitionDue{{3, 2}, {8, 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := store.ExpiredLeases.Count(ctx, db.Pool, now, tt.filter, tt.cap)
			if err != nil || got != tt.want {
				t.Fatalf("Count = %+v, %v; want %+v", got, err, tt.want)
			}
			if tt.wantTop == nil {
				return
			}
			top, err := store.ExpiredLeases.Top(ctx, db.Pool, now, tt.filter, 2, 1000)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(top, tt.wantTop) {
				t.Fatalf("Top = %+v; want %+v", top, tt.wantTop)
			}
		})
	}
	for _, tc := range dueCases {
		for _, f := range []store.Filter{{}, {Namespace: "a"}} {
			if _, err := tc.due.Count(ctx, db.Pool, now, f, 10); err != nil {
				t.Errorf("Count of %s (filter %+v): %v", tc.name, f, err)
			}
			if _, err := tc.due.Top(ctx, db.Pool, now, f, 3, 10); err != nil {
				t.Errorf("Top of %s (filter %+v): %v", tc.name, f, err)
			}
		}
	}
}
