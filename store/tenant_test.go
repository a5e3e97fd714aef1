package store_test

import (
	"context"
	"strings"
	"testing"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

// TestRowActionsRecheckTheTenant: every row action of a tenant-scoped
// reconciler, called with a tenant filter for a due row of another tenant
// (or of an execution with no row), changes nothing, and Due.Outside says
// why; with its own tenant's filter (namespace and tag) the same call acts.
// This is what keeps a filtered fleet off other tenants' rows whoever
// enqueued the job; a regression shows as a change under the wrong filter.
func TestRowActionsRecheckTheTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	now := store.NowMs()
	past := fftest.Ms(now - 1000)
	tags := map[string]string{"cairn.instance_id": "i-1"}
	own := store.Filter{Namespace: "beta", TagKey: "cairn.instance_id", TagValue: "i-1"}
	wrongTag := store.Filter{Namespace: "beta", TagKey: "cairn.instance_id", TagValue: "i-2"}
	other := store.Filter{Namespace: "acme"}

	type action struct {
		due  *store.Due
		row  store.DueRow
		p    int16
		call func(f store.Filter) (changed bool)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name string
		seed func(p int16, exec func() string) action
	}{
		{"LeaseExpiry", func(p int16, exec func() string) action {
			id := exec()
			fftest.InsertAttempt(t, db.Pool, p, id, 0, past)
			return action{store.ExpiredLeases, store.DueRow{ID: id}, p, func(f store.Filter) bool {
				r, err := store.ReleaseExpiredLease(ctx, db.Pool, p, id, 0, now, f)
				must(err)
				return r.Released
			}}
		}},
		{"AttemptTimeout", func(p int16, exec func() string) action {
			id := exec()
			fftest.InsertAttempt(t, db.Pool, p, id, 0, past)
			return action{store.TimedOutAttempts, store.DueRow{ID: id}, p, func(f store.Filter) bool {
				r, err := store.ExpireAttempts(ctx, db.Pool, p, []store.LeaseRef{{ExecutionID: id}}, now, f)
				must(err)
				return r[0].Applied
			}}
		}},
		{"SuspensionTimeout", func(p int16, exec func() string) action {
			id := exec()
			fftest.InsertSuspension(t, db.Pool, fftest.Suspension{Partition: p, ExecutionID: id, TimeoutAtMs: past})
			return action{store.TimedOutSuspensions, store.DueRow{ID: id}, p, func(f store.Filter) bool {
				r, err := store.ExpireSuspension(ctx, db.Pool, p, id, now, f)
				must(err)
				return r.Applied
			}}
		}},
		{"ExecutionDeadline", func(p int16, exec func() string) action {
			id := exec()
			must2(db.Pool.Exec(ctx, `UPDATE ff_exec_core SET deadline_at_ms = $3 WHERE partition_key = $1 AND execution_id = $2`, p, id, *past))
			return action{store.PastDeadlineExecutions, store.DueRow{ID: id}, p, func(f store.Filter) bool {
				r, err := store.ExpireDeadlines(ctx, db.Pool, p, []string{id}, now, f)
				must(err)
				return r[0].Applied
			}}
		}},
		{"WaitpointExpiry", func(p int16, exec func() string) action {
			wp := fftest.InsertWaitpoint(t, db.Pool, fftest.Waitpoint{Partition: p, ExecutionID: exec(), ExpiresAtMs: past})
			return action{store.ExpiredWaitpoints, store.DueRow{ID: wp}, p, func(f store.Filter) bool {
				r, err := store.CloseWaitpoints(ctx, db.Pool, p, []string{wp}, now, f)
				must(err)
				return r[0].Closed
			}}
		}},
		{"DelayedPromotion", func(p int16, exec func() string) action {
			id := exec()
			must2(db.Pool.Exec(ctx, `UPDATE ff_exec_core SET lifecycle_phase = 'runnable', eligibility_state = 'not_eligible_until_time',
				deadline_at_ms = $3 WHERE partition_key = $1 AND execution_id = $2`, p, id, *past))
			return action{store.DelayedExecutions, store.DueRow{ID: id}, p, func(f store.Filter) bool {
				r, err := store.PromoteDelayed(ctx, db.Pool, p, id, now, f)
				must(err)
				return r.Promoted()
			}}
		}},
		{"CancelDispatch", func(p int16, exec func() string) action {
			flow, down := fftest.NewUUID(), exec()
			fftest.InsertEdgeGroup(t, db.Pool, fftest.EdgeGroup{Partition: p, FlowID: flow, DownstreamEID: down, Flag: true,
				Members: []string{fftest.NewUUID()}})
			fftest.InsertPendingCancel(t, db.Pool, p, flow, down, now)
			return action{store.PendingCancelGroups, store.DueRow{ID: flow, ID2: down}, p, func(f store.Filter) bool {
				r, err := store.DispatchCancelGroup(ctx, db.Pool, p, flow, down, now, f)
				must(err)
				return r.Changed()
			}}
		}},
		{"CancelReconcile", func(p int16, exec func() string) action {
			flow, down := fftest.NewUUID(), exec()
			fftest.InsertEdgeGroup(t, db.Pool, fftest.EdgeGroup{Partition: p, FlowID: flow, DownstreamEID: down, Flag: false})
			fftest.InsertPendingCancel(t, db.Pool, p, flow, down, now)
			return action{store.PendingCancelGroups, store.DueRow{ID: flow, ID2: down}, p, func(f store.Filter) bool {
				r, err := store.ReconcileCancelGroup(ctx, db.Pool, p, flow, down, f)
				must(err)
				return r.Changed()
			}}
		}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := int16(40 + i)
			beta := func() string {
				return fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, Namespace: "beta", Tags: tags})
			}
			outside := func(a action, f store.Filter) bool {
				out, err := a.due.Outside(ctx, db.Pool, a.p, a.row, f)
				must(err)
				return out
			}
			a := tt.seed(p, beta)
			for _, f := range []store.Filter{other, wrongTag} {
				if a.call(f) {
					t.Fatalf("acted under filter %s on a row of tenant beta/i-1", f)
				}
				if !outside(a, f) {
					t.Errorf("Outside under %s = false; want true", f)
				}
			}
			if outside(a, own) || outside(a, store.Filter{}) {
				t.Error("Outside under the row's own filter or none = true; want false")
			}
			if !a.call(own) {
				t.Fatal("did not act under the row's own filter")
			}

			// A row whose execution is missing passes no set filter (for
			// rows that are executions themselves there is no such row).
			if strings.HasPrefix(a.due.From, "ff_exec_core ") {
				return
			}
			orphan := tt.seed(p, fftest.NewUUID)
			if orphan.call(own) {
				t.Error("acted under a filter on a row whose execution is missing")
			}
			if !outside(orphan, own) {
				t.Error("Outside of a row whose execution is missing = false; want true")
			}
		})
	}
}

func must2[T any](_ T, err error) {
	if err != nil {
		panic(err)
	}
}
