package ffread_test

import (
	"context"
	"testing"

	"github.com/flowfabric/ffreconcile/internal/ffread"
	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
)

// member is one flow member to insert: its raw public_state and, when
// set, its lifecycle phase.
type member struct{ public, phase string }

// TestProjectFlowSummary: the members are counted by raw public_state into
// FlowFabric's eleven buckets and the flow state follows its rule (all
// terminal: failed if any failed/cancelled/expired, else completed; else
// running if any 'active'; else blocked if any suspended, delayed,
// rate_limited or waiting_children; else open), including its known gap:
// 'running' and 'resumable' members are in no bucket, so a flow of running
// members is open and a flow with a member terminalised under a stale
// public_state never completes. A regression shows as a different bucket
// or state for any of these member sets (our fleet's rows would then
// summarise differently in FlowFabric's dashboard than we claim).
func TestProjectFlowSummary(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.NewFlowFabric(t)
	const p = int16(15)
	const now = int64(9_000_000)

	tests := []struct {
		name    string
		members []member
		state   string
		// counts: completed, failed, cancelled, expired, skipped, active,
		// suspended, waiting, delayed, rate_limited, waiting_children.
		counts [11]int32
	}{
		{name: "AllCompleted", members: []member{{public: "completed"}, {public: "skipped"}},
			state: "completed", counts: [11]int32{1, 0, 0, 0, 1}},
		{name: "FailedMember", members: []member{{public: "completed"}, {public: "failed"}},
			state: "failed", counts: [11]int32{1, 1}},
		{name: "CancelledMember", members: []member{{public: "completed"}, {public: "cancelled"}},
			state: "failed", counts: [11]int32{1, 0, 1}},
		{name: "ExpiredMember", members: []member{{public: "expired"}},
			state: "failed", counts: [11]int32{0, 0, 0, 1}},
		{name: "Active", members: []member{{public: "active"}, {public: "waiting"}, {public: "suspended"}},
			state: "running", counts: [11]int32{5: 1, 6: 1, 7: 1}},
		{name: "RunningIsNotCounted", members: []member{{public: "running"}, {public: "running"}},
			state: "open"},
		{name: "ResumableIsNotCounted", members: []member{{public: "resumable"}, {public: "completed"}},
			state: "open", counts: [11]int32{1}},
		{name: "StaleTerminalNeverCompletes", members: []member{{public: "completed"}, {public: "running", phase: "terminal"}},
			state: "open", counts: [11]int32{1}},
		{name: "BlockedSuspended", members: []member{{public: "suspended"}, {public: "waiting"}},
			state: "blocked", counts: [11]int32{6: 1, 7: 1}},
		{name: "BlockedDelayed", members: []member{{public: "delayed"}},
			state: "blocked", counts: [11]int32{8: 1}},
		{name: "BlockedRateLimited", members: []member{{public: "rate_limited"}},
			state: "blocked", counts: [11]int32{9: 1}},
		{name: "BlockedWaitingChildren", members: []member{{public: "waiting_children"}, {public: "running"}},
			state: "blocked", counts: [11]int32{10: 1}},
		{name: "Open", members: []member{{public: "waiting"}, {public: "completed"}},
			state: "open", counts: [11]int32{1, 7: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			flow := fftest.NewUUID()
			for _, m := range tt.members {
				fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, FlowID: flow, PublicState: m.public, LifecyclePhase: m.phase})
			}
			// A member of another partition is not this flow's.
			fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p + 1, FlowID: flow, PublicState: "active"})

			wrote, err := ffread.ProjectFlowSummary(ctx, db.Pool, p, flow, now)
			if err != nil || !wrote {
				t.Fatalf("= %v, %v; want written", wrote, err)
			}
			got, ok, err := ffread.ReadFlowSummary(ctx, db.Pool, p, flow)
			if err != nil || !ok {
				t.Fatalf("read summary: %v, %v", ok, err)
			}
			n := int64(len(tt.members))
			c := tt.counts
			want := ffread.FlowSummary{Partition: p, FlowID: flow, TotalMembers: n, SampledMembers: int32(n),
				MembersCompleted: c[0], MembersFailed: c[1], MembersCancelled: c[2], MembersExpired: c[3], MembersSkipped: c[4],
				MembersActive: c[5], MembersSuspended: c[6], MembersWaiting: c[7], MembersDelayed: c[8],
				MembersRateLimited: c[9], MembersWaitingChildren: c[10], PublicFlowState: tt.state, LastSummaryUpdateAt: now}
			if got != want {
				t.Fatalf("summary = %+v\nwant      %+v", got, want)
			}
		})
	}

	t.Run("NoMembers", func(t *testing.T) {
		t.Parallel()
		flow := fftest.NewUUID()
		wrote, err := ffread.ProjectFlowSummary(ctx, db.Pool, p, flow, now)
		if err != nil || wrote {
			t.Fatalf("= %v, %v; want nothing written", wrote, err)
		}
		if _, ok, err := ffread.ReadFlowSummary(ctx, db.Pool, p, flow); ok || err != nil {
			t.Fatalf("summary exists (%v, %v); want none", ok, err)
		}
	})

	t.Run("ReprojectionUpdates", func(t *testing.T) {
		t.Parallel()
		flow := fftest.NewUUID()
		id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, FlowID: flow, PublicState: "active"})
		if _, err := ffread.ProjectFlowSummary(ctx, db.Pool, p, flow, now); err != nil {
			t.Fatal(err)
		}
		setExec(t, db.Pool, p, id, "public_state", "completed")
		if _, err := ffread.ProjectFlowSummary(ctx, db.Pool, p, flow, now+1); err != nil {
			t.Fatal(err)
		}
		got, _, err := ffread.ReadFlowSummary(ctx, db.Pool, p, flow)
		if err != nil || got.PublicFlowState != "completed" || got.MembersActive != 0 || got.MembersCompleted != 1 ||
			got.LastSummaryUpdateAt != now+1 {
			t.Fatalf("summary after re-projection = %+v, %v", got, err)
		}
	})
}
