package store_test

import (
	"context"
	"slices"
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
			must2(db.Pool.Exec(ctx, `UPDATE ff_exec_core SET lifecycle_phase = 'suspended', public_state = 'suspended'
				WHERE partition_key = $1 AND execution_id = $2`, p, id))
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

// TestTagFilterMatchesOnlyStringTags: the tag filter matches what
// FlowFabric's scanners match, a tag that is the JSON string given
// (as_str()); a tag stored as the number 7 or the boolean true never passes
// --instance-tag k=7 or k=true, in the scans (rows and partitions), the
// gauge's count, Due.Outside and the row statements' re-checks (on the
// execution itself and through its join). Retention is the deliberate
// exception: FlowFabric's trim compares the tag's text (->>), so the number
// 7 is trimmed with the string "7". A regression to text comparison shows
// as a number or boolean tag scanned, counted or acted on.
func TestTagFilterMatchesOnlyStringTags(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	now := store.NowMs()
	const p, pt = int16(60), int16(61)
	tagged := func(e fftest.Exec, v any) fftest.Exec {
		e.RawFields = map[string]any{"namespace": "acme", "tags": map[string]any{"k": v}}
		return e
	}
	// One delayed execution with an expired lease per tag value, and one
	// terminal execution past any retention per tag value.
	values := []struct {
		name string
		v    any
	}{{"String7", "7"}, {"Number7", 7}, {"BoolTrue", true}, {"StringTrue", "true"}}
	ids, terminal := map[string]string{}, map[string]string{}
	for _, tv := range values {
		id := fftest.InsertExec(t, db.Pool, tagged(fftest.Delayed(p, now-1000), tv.v))
		fftest.InsertAttempt(t, db.Pool, p, id, 0, fftest.Ms(now-1000))
		ids[tv.name] = id
		terminal[tv.name] = fftest.InsertExec(t, db.Pool, tagged(fftest.Terminal(pt, now-1000), tv.v))
	}
	scanned := func(due *store.Due, part int16, f store.Filter, names map[string]string) []string {
		var got []string
		for _, r := range scan(t, db.Pool, due, part, now, nil, 10, f) {
			for name, id := range names {
				if r.ID == id {
					got = append(got, name)
				}
			}
		}
		slices.Sort(got)
		return got
	}
	tests := []struct {
		name  string
		value string
		// want: the only execution the filter passes; wantTrim: the
		// terminal executions retention's filter passes.
		want     string
		wantTrim []string
	}{
		{name: "Seven", value: "7", want: "String7", wantTrim: []string{"Number7", "String7"}},
		{name: "True", value: "true", want: "StringTrue", wantTrim: []string{"BoolTrue", "StringTrue"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := store.Filter{Namespace: "acme", TagKey: "k", TagValue: tt.value}
			for _, due := range []*store.Due{store.DelayedExecutions, store.ExpiredLeases} {
				if got := scanned(due, p, f, ids); !slices.Equal(got, []string{tt.want}) {
					t.Errorf("%s: scan = %v; want [%s]", due.What, got, tt.want)
				}
				c, err := due.Count(ctx, db.Pool, now, f, 100)
				if err != nil || c.Due != 1 || c.OutsideFilter != 3 {
					t.Errorf("%s: count = %+v, %v; want 1 due, 3 outside", due.What, c, err)
				}
				for name, id := range ids {
					out, err := due.Outside(ctx, db.Pool, p, store.DueRow{ID: id}, f)
					if err != nil || out != (name != tt.want) {
						t.Errorf("%s: Outside(%s) = %v, %v; want %v", due.What, name, out, err, name != tt.want)
					}
				}
			}
			if got := scanned(store.TerminalExecutions, pt, f, terminal); !slices.Equal(got, tt.wantTrim) {
				t.Errorf("retention scan = %v; want %v (FlowFabric's trim compares text)", got, tt.wantTrim)
			}
		})
	}

	// The row statements' re-checks, under the filter k=7: only the string
	// tag's execution is promoted and released.
	f := store.Filter{Namespace: "acme", TagKey: "k", TagValue: "7"}
	for _, tv := range values {
		id := ids[tv.name]
		want := tv.name == "String7"
		res, err := store.PromoteDelayed(ctx, db.Pool, p, id, now, f)
		if err != nil || res.Promoted() != want {
			t.Errorf("PromoteDelayed(%s) promoted = %v, %v; want %v", tv.name, res.Promoted(), err, want)
		}
		rel, err := store.ReleaseExpiredLease(ctx, db.Pool, p, id, 0, now, f)
		if err != nil || rel.Released != want {
			t.Errorf("ReleaseExpiredLease(%s) released = %v, %v; want %v", tv.name, rel.Released, err, want)
		}
	}
	// Retention trims the number 7 with the string "7", as FlowFabric does.
	res, err := store.TrimExecutions(ctx, db.Pool, pt, now, 10, f)
	if err != nil || res.Executions != 2 {
		t.Fatalf("TrimExecutions under k=7 = %+v, %v; want 2 executions (the string and the number)", res, err)
	}
}
