package store_test

import (
	"context"
	"encoding/json"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/flowfabric/ffreconcile/internal/ffread"
	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

// insertFlow inserts an ff_flow_core row as FlowFabric's create_flow
// writes it, with raw_fields raw (nil: {}), and returns its id.
func insertFlow(t *testing.T, db store.DB, p int16, raw map[string]any) string {
	t.Helper()
	if raw == nil {
		raw = map[string]any{}
	}
	b, err := json.Marshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	id := fftest.NewUUID()
	if _, err := db.Exec(context.Background(), `INSERT INTO ff_flow_core (partition_key, flow_id, public_flow_state, created_at_ms, raw_fields)
		VALUES ($1, $2, 'open', 1, $3::jsonb)`, p, id, string(b)); err != nil {
		t.Fatal(err)
	}
	return id
}

// member inserts a flow member in public state ps: terminal states with a
// terminal_at_ms of endedMs (a live member gets none).
func member(t *testing.T, db store.DB, p int16, flow, ps string, endedMs int64) string {
	t.Helper()
	e := fftest.Exec{Partition: p, FlowID: flow, PublicState: ps}
	switch ps {
	case "completed", "failed", "expired", "skipped":
		e.LifecyclePhase, e.OwnershipState, e.EligibilityState, e.AttemptState = "terminal", "unowned", "not_applicable", "attempt_terminal"
		e.TerminalAtMs = fftest.Ms(endedMs)
	case "cancelled":
		e.LifecyclePhase, e.OwnershipState, e.EligibilityState, e.AttemptState = "cancelled", "unowned", "not_applicable", "cancelled"
		e.TerminalAtMs = fftest.Ms(endedMs)
	case "waiting", "resumable", "delayed", "waiting_children", "rate_limited":
		e.LifecyclePhase, e.OwnershipState, e.EligibilityState, e.AttemptState = "runnable", "unowned", "eligible_now", "pending"
	case "suspended":
		e.LifecyclePhase, e.OwnershipState, e.EligibilityState, e.AttemptState = "suspended", "released", "not_applicable", "attempt_interrupted"
	}
	return fftest.InsertExec(t, db, e)
}

// TestProjectFlowsIsFlowFabricsProjection: ProjectFlows writes, for each
// flow, what FlowFabric's project_flow_summary_impl (transcribed in
// internal/ffread) writes, column for column, on both schemas, but for the
// two states FlowFabric's SQL counts nowhere: its claim's `running`, counted
// as active, and a signal's `resumable`, counted as waiting (a flow of
// running members reads `running`, not FlowFabric's `open`). A flow without
// members, missing from ff_flow_core, or of another tenant gets no row. A
// regression shows as a column differing from FlowFabric's, or as the
// rule's state wrong for a mix of members.
func TestProjectFlowsIsFlowFabricsProjection(t *testing.T) {
	t.Parallel()
	testdb.EachSchema(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		pool := db.Pool
		const now = int64(9_000_000)
		tests := []struct {
			name    string
			members []string
			state   string
			// active and waiting where FlowFabric's differ (-1: same).
			active, waiting int32
		}{
			{name: "AllCompleted", members: []string{"completed", "completed", "skipped"}, state: "completed", active: -1, waiting: -1},
			{name: "EndedWithAFailure", members: []string{"completed", "failed", "cancelled", "expired"}, state: "failed", active: -1, waiting: -1},
			{name: "Active", members: []string{"active", "waiting", "completed"}, state: "running", active: -1, waiting: -1},
			{name: "ClaimedRunning", members: []string{"running", "waiting"}, state: "running", active: 1, waiting: -1},
			{name: "Blocked", members: []string{"suspended", "waiting", "delayed", "waiting_children"}, state: "blocked", active: -1, waiting: -1},
			{name: "Open", members: []string{"waiting", "waiting"}, state: "open", active: -1, waiting: -1},
			{name: "Resumable", members: []string{"resumable", "completed"}, state: "open", active: -1, waiting: 1},
		}
		for i, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				p := int16(20 + i)
				ours, theirs := insertFlow(t, pool, p, nil), insertFlow(t, pool, p, nil)
				for _, ps := range tt.members {
					member(t, pool, p, ours, ps, now-10)
					member(t, pool, p, theirs, ps, now-10)
				}
				if n, err := store.ProjectFlows(ctx, pool, p, []string{ours}, now, store.Filter{}); err != nil || n != 1 {
					t.Fatalf("ProjectFlows = %d, %v; want 1 flow", n, err)
				}
				if ok, err := ffread.ProjectFlowSummary(ctx, pool, p, theirs, now); err != nil || !ok {
					t.Fatalf("FlowFabric's projection = %v, %v", ok, err)
				}
				got, ok, err := ffread.ReadFlowSummary(ctx, pool, p, ours)
				if err != nil || !ok {
					t.Fatalf("read ours: %v, %v", ok, err)
				}
				want, _, err := ffread.ReadFlowSummary(ctx, pool, p, theirs)
				if err != nil {
					t.Fatal(err)
				}
				want.FlowID = got.FlowID
				if tt.active >= 0 {
					want.MembersActive = tt.active
				}
				if tt.waiting >= 0 {
					want.MembersWaiting = tt.waiting
				}
				want.PublicFlowState = tt.state
				if got != want {
					t.Fatalf("summary:\ngot  %+v\nwant %+v (FlowFabric's, but for running and resumable)", got, want)
				}
			})
		}

		t.Run("NoRowForFlowsItCannotProject", func(t *testing.T) {
			const p = int16(40)
			empty := insertFlow(t, pool, p, nil)
			orphan := fftest.NewUUID() // members, no ff_flow_core row
			member(t, pool, p, orphan, "waiting", 0)
			other := insertFlow(t, pool, p, map[string]any{"namespace": "other"})
			member(t, pool, p, other, "waiting", 0)
			dflt := insertFlow(t, pool, p, nil) // FlowFabric's namespace: "default"
			member(t, pool, p, dflt, "waiting", 0)
			n, err := store.ProjectFlows(ctx, pool, p, []string{empty, orphan, other, dflt}, now, store.Filter{Namespace: "default"})
			if err != nil || n != 1 {
				t.Fatalf("ProjectFlows = %d, %v; want the default namespace's flow only", n, err)
			}
			for _, id := range []string{empty, orphan, other} {
				if _, ok, _ := ffread.ReadFlowSummary(ctx, pool, p, id); ok {
					t.Errorf("flow %s got a summary", id)
				}
			}
		})

		t.Run("TagIsTopLevelOnAFlow", func(t *testing.T) {
			const p = int16(41)
			f := store.Filter{TagKey: "cairn.instance_id", TagValue: "i-1"}
			top := insertFlow(t, pool, p, map[string]any{"cairn.instance_id": "i-1"})
			nested := insertFlow(t, pool, p, map[string]any{"tags": map[string]any{"cairn.instance_id": "i-1"}})
			number := insertFlow(t, pool, p, map[string]any{"cairn.instance_id": 1})
			for _, id := range []string{top, nested, number} {
				member(t, pool, p, id, "waiting", 0)
			}
			if n, err := store.ProjectFlows(ctx, pool, p, []string{top, nested, number}, now, f); err != nil || n != 1 {
				t.Fatalf("ProjectFlows = %d, %v; want only the flow tagged at the top level with the string", n, err)
			}
			if _, ok, _ := ffread.ReadFlowSummary(ctx, pool, p, top); !ok {
				t.Fatal("the tenant's flow has no summary")
			}
		})
	})
}

// TestFlowSummaryPassesReadOnlyWhatChanged: the partitions a tick finds and
// the members a pass reads are those that changed: live flow members, and
// flow members ended after the partition's mark for the fleet's filter. A
// mark moved past every ended member leaves the partition to its live flows
// alone; a member ended later makes it due again; each filter keeps its
// own mark; a mark never moves back. A regression shows as a partition of
// finished flows found at every tick (idle cost growing with finished
// flows), or as one with a newly ended member not found.
func TestFlowSummaryPassesReadOnlyWhatChanged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const now = int64(9_000_000)
	parts := func(f store.Filter) []int16 {
		t.Helper()
		ps, err := store.FlowSummaryPartitions(ctx, pool, 64, f)
		if err != nil {
			t.Fatal(err)
		}
		return ps
	}
	live, ended := insertFlow(t, pool, 3, nil), insertFlow(t, pool, 5, map[string]any{"namespace": "acme"})
	member(t, pool, 3, live, "waiting", 0)
	var endedIDs []string
	for i := range 3 {
		endedIDs = append(endedIDs, member(t, pool, 5, ended, "completed", now-int64(100*(3-i))))
	}
	member(t, pool, 7, "", "completed", now) // not a flow member: never read
	if got := parts(store.Filter{}); !slices.Equal(got, []int16{3, 5}) {
		t.Fatalf("partitions = %v; want [3 5]: live and ended members, no mark yet", got)
	}
	if got := parts(store.Filter{Namespace: "acme"}); !slices.Equal(got, []int16{5}) {
		t.Fatalf("acme's partitions = %v; want [5]: partition 3's live flow is another tenant's", got)
	}

	mark, err := store.ReadFlowSummaryMark(ctx, pool, 5, store.Filter{})
	if err != nil || mark.Found {
		t.Fatalf("mark = %+v, %v; want none yet", mark, err)
	}
	members, err := store.EndedFlowMembers(ctx, pool, 5, mark.ThroughMs, mark.ThroughID, 2)
	if err != nil || len(members) != 2 || members[0].ExecutionID != endedIDs[0] || members[1].ExecutionID != endedIDs[1] {
		t.Fatalf("first batch = %+v, %v; want the two oldest", members, err)
	}
	last := members[1]
	if err := store.AdvanceFlowSummaryMark(ctx, pool, 5, store.Filter{}, last.TerminalAtMs, last.ExecutionID); err != nil {
		t.Fatal(err)
	}
	members, err = store.EndedFlowMembers(ctx, pool, 5, last.TerminalAtMs, last.ExecutionID, 2)
	if err != nil || len(members) != 1 || members[0].ExecutionID != endedIDs[2] {
		t.Fatalf("after the mark = %+v, %v; want the third", members, err)
	}
	if err := store.AdvanceFlowSummaryMark(ctx, pool, 5, store.Filter{}, now, store.MaxExecutionID); err != nil {
		t.Fatal(err)
	}
	if got := parts(store.Filter{}); !slices.Equal(got, []int16{3}) {
		t.Fatalf("partitions after the mark = %v; want [3] (partition 5's flow has ended and been passed)", got)
	}
	if got := parts(store.Filter{Namespace: "acme"}); !slices.Equal(got, []int16{5}) {
		t.Fatalf("acme's partitions = %v; want [5]: its own mark has not moved", got)
	}
	// Never back.
	if err := store.AdvanceFlowSummaryMark(ctx, pool, 5, store.Filter{}, 1, store.MaxExecutionID); err != nil {
		t.Fatal(err)
	}
	if m, _ := store.ReadFlowSummaryMark(ctx, pool, 5, store.Filter{}); m.ThroughMs != now {
		t.Fatalf("mark moved back to %d", m.ThroughMs)
	}
	// A replayed member (live again) and a member ended later.
	if _, err := pool.Exec(ctx, `UPDATE ff_exec_core SET lifecycle_phase = 'runnable', public_state = 'waiting', terminal_at_ms = NULL
		WHERE partition_key = 5 AND execution_id = $1`, endedIDs[0]); err != nil {
		t.Fatal(err)
	}
	late := insertFlow(t, pool, 9, nil)
	member(t, pool, 9, late, "failed", now+5)
	if err := store.AdvanceFlowSummaryMark(ctx, pool, 9, store.Filter{}, now, store.MaxExecutionID); err != nil {
		t.Fatal(err)
	}
	if got := parts(store.Filter{}); !slices.Equal(got, []int16{3, 5, 9}) {
		t.Fatalf("partitions = %v; want [3 5 9]: a replayed member, a member ended after the mark", got)
	}
	flows, err := store.LiveFlows(ctx, pool, 5, "", 10)
	if err != nil || !slices.Equal(flows, []string{ended}) {
		t.Fatalf("live flows of partition 5 = %v, %v; want the replayed member's flow", flows, err)
	}
	if flows, err := store.LiveFlows(ctx, pool, 5, ended, 10); err != nil || len(flows) != 0 {
		t.Fatalf("live flows after the last = %v, %v; want none", flows, err)
	}
}

// TestFlowSummaryReadsByIndex pins the plans of a pass's reads on a
// partition of many finished flows: the probe, the ended members after a
// mark and the live flows read their partial index from the mark or the
// cursor, never the partition's finished members. A regression (a
// predicate the partial index does not imply, a cast on a key) reads every
// finished member at every tick: idle cost growing with finished flows.
func TestFlowSummaryReadsByIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const p, now, finished = int16(11), int64(9_000_000), 5000
	if _, err := pool.Exec(ctx, `
		INSERT INTO ff_exec_core (partition_key, execution_id, flow_id, lane_id, lifecycle_phase, ownership_state,
		       eligibility_state, public_state, attempt_state, created_at_ms, terminal_at_ms, raw_fields)
		SELECT $1, gen_random_uuid(), gen_random_uuid(), 'l', 'terminal', 'unowned', 'not_applicable', 'completed',
		       'attempt_terminal', 1, $2 - g, '{}'::jsonb
		  FROM generate_series(1, $3::int) AS g`, p, now, finished); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE ff_exec_core`); err != nil {
		t.Fatal(err)
	}
	if err := store.AdvanceFlowSummaryMark(ctx, pool, p, store.Filter{}, now, store.MaxExecutionID); err != nil {
		t.Fatal(err)
	}
	explain := &explainDB{DB: pool}
	if _, err := store.FlowSummaryPartitions(ctx, explain, 256, store.Filter{}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.EndedFlowMembers(ctx, explain, p, now, store.MaxExecutionID, 100); err != nil {
		t.Fatal(err)
	}
	if _, err := store.LiveFlows(ctx, explain, p, "", 100); err != nil {
		t.Fatal(err)
	}
	if len(explain.plans) != 3 {
		t.Fatalf("%d plans; want 3", len(explain.plans))
	}
	for i, plan := range explain.plans {
		if n := rowsReadOfFF(plan); n > 10 {
			t.Errorf("statement %d read %d rows of a partition of %d finished flows:\n%s", i, n, finished, plan)
		}
	}
}

// planNodeRE matches a text plan's scan of an ff_ table with its actual
// rows and loops; removedRE a count of rows a node filtered out.
var (
	planNodeRE = regexp.MustCompile(`Scan.* on ff_\S+.*actual rows=(\d+) loops=(\d+)`)
	removedRE  = regexp.MustCompile(`Rows Removed by (?:Filter|Index Recheck): (\d+)`)
)

// rowsReadOfFF sums, over a text EXPLAIN ANALYZE, the rows every scan of an
// ff_ table returned or filtered out, over all its loops.
func rowsReadOfFF(plan string) int {
	total, loops, inFF := 0, 1, false
	for _, line := range strings.Split(plan, "\n") {
		if strings.Contains(line, "->") || strings.HasPrefix(strings.TrimSpace(line), "Seq Scan") || strings.Contains(line, "Scan") {
			inFF = false
			if m := planNodeRE.FindStringSubmatch(line); m != nil {
				rows, _ := strconv.Atoi(m[1])
				loops, _ = strconv.Atoi(m[2])
				total += rows * loops
				inFF = true
			}
			continue
		}
		if m := removedRE.FindStringSubmatch(line); m != nil && inFF {
			n, _ := strconv.Atoi(m[1])
			total += n * loops
		}
	}
	return total
}
