package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/internal/ffread"
	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

// TestExpireClaimGrants: an expired grant is deleted whatever its
// execution's state, and an execution it left runnable in pending_claim with
// no live grant is eligible again (eligible_now, waiting,
// waiting_for_worker), nothing else of it changed; a grant still usable by
// FlowFabric's claim_execution (expiry 0, or not before now) and another
// tenant's are left alone; a second run changes nothing. A regression shows
// as a live grant deleted (a claim then fails), an execution reset while a
// grant of it is live, a claimed execution reset, or a stranded one left
// pending_claim.
func TestExpireClaimGrants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const now, p = int64(4_000_000), int16(21)
	tenantA := store.Filter{Namespace: "a"}

	tests := []struct {
		name    string
		exec    *fftest.Exec // nil: no execution row
		grants  []fftest.Grant
		filter  store.Filter
		deleted bool // the first grant is deleted
		reset   bool
	}{
		{name: "StrandedPendingClaim", exec: ptr(fftest.PendingClaim(p)),
			grants: []fftest.Grant{{ExpiresAtMs: now - 1}}, deleted: true, reset: true},
		{name: "ReclaimGrantStrandsToo", exec: ptr(fftest.PendingClaim(p)),
			grants: []fftest.Grant{{Kind: "reclaim", ExpiresAtMs: now - 1}}, deleted: true, reset: true},
		{name: "AnotherGrantLive", exec: ptr(fftest.PendingClaim(p)),
			grants: []fftest.Grant{{ExpiresAtMs: now - 1}, {ExpiresAtMs: now + 60_000}}, deleted: true},
		{name: "AnotherGrantNeverExpires", exec: ptr(fftest.PendingClaim(p)),
			grants: []fftest.Grant{{ExpiresAtMs: now - 1}, {ExpiresAtMs: 0}}, deleted: true},
		{name: "ClaimedExecution", exec: &fftest.Exec{Partition: p},
			grants: []fftest.Grant{{ExpiresAtMs: now - 1}}, deleted: true},
		{name: "EligibleExecution", exec: &fftest.Exec{Partition: p, LifecyclePhase: "runnable", OwnershipState: "unowned",
			EligibilityState: "eligible_now", PublicState: "waiting"},
			grants: []fftest.Grant{{ExpiresAtMs: now - 1}}, deleted: true},
		{name: "ExpiresNow", exec: ptr(fftest.PendingClaim(p)), grants: []fftest.Grant{{ExpiresAtMs: now}}},
		{name: "NeverExpires", exec: ptr(fftest.PendingClaim(p)), grants: []fftest.Grant{{ExpiresAtMs: 0}}},
		{name: "ExecMissing", grants: []fftest.Grant{{ExpiresAtMs: now - 1}}, deleted: true},
		{name: "ExecMissingUnderFilter", grants: []fftest.Grant{{ExpiresAtMs: now - 1}}, filter: tenantA},
		{name: "OtherTenant", exec: &fftest.Exec{Partition: p, LifecyclePhase: "runnable", OwnershipState: "unowned",
			EligibilityState: "pending_claim", PublicState: "waiting", Namespace: "b"},
			grants: []fftest.Grant{{ExpiresAtMs: now - 1}}, filter: tenantA},
		{name: "SameTenant", exec: &fftest.Exec{Partition: p, LifecyclePhase: "runnable", OwnershipState: "unowned",
			EligibilityState: "pending_claim", PublicState: "waiting", Namespace: "a"},
			grants: []fftest.Grant{{ExpiresAtMs: now - 1}}, filter: tenantA, deleted: true, reset: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := fftest.NewUUID()
			if tt.exec != nil {
				e := *tt.exec
				e.ID = id
				fftest.InsertExec(t, pool, e)
			}
			var grantIDs []string
			for _, g := range tt.grants {
				g.Partition, g.ExecutionID = p, id
				grantIDs = append(grantIDs, fftest.InsertGrant(t, pool, g))
			}
			var before map[string]any
			if tt.exec != nil {
				before = fftest.ExecJSON(t, pool, p, id)
			}
			res, err := store.ExpireClaimGrants(ctx, pool, p, grantIDs[:1], now, tt.filter)
			if err != nil {
				t.Fatal(err)
			}
			want := store.ClaimGrantExpiryResult{}
			if tt.deleted {
				want = store.ClaimGrantExpiryResult{Deleted: true, ExecutionID: id, Kind: tt.grants[0].Kind, Reset: tt.reset,
					ExecMissing: tt.exec == nil, DeadlineMs: tt.grants[0].ExpiresAtMs}
				if want.Kind == "" {
					want.Kind = "claim"
				}
			}
			if res[0] != want {
				t.Fatalf("result = %+v; want %+v", res[0], want)
			}
			wantGrants := len(tt.grants)
			if tt.deleted {
				wantGrants--
			}
			if n := fftest.Grants(t, pool, p, id); n != wantGrants {
				t.Fatalf("%d grants left; want %d", n, wantGrants)
			}
			if tt.exec != nil {
				wantExec := before
				if tt.reset {
					wantExec = withCols(before, map[string]any{"eligibility_state": "eligible_now", "public_state": "waiting",
						"blocking_reason": "waiting_for_worker"})
				}
				if got := fftest.ExecJSON(t, pool, p, id); !jsonEqual(got, wantExec) {
					t.Fatalf("execution:\ngot  %v\nwant %v", got, wantExec)
				}
			}
			again, err := store.ExpireClaimGrants(ctx, pool, p, grantIDs[:1], now, tt.filter)
			if err != nil {
				t.Fatal(err)
			}
			if again[0] != (store.ClaimGrantExpiryResult{}) {
				t.Fatalf("second run = %+v; want no change", again[0])
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestClaimRacingTheGrantReset: the reset re-checks under the execution's
// lock, so a claim holding the execution when the grant expires wins (the
// grant it consumed is gone, the execution stays active), and a reset that
// came first leaves the execution eligible again: the late worker's
// FlowFabric claim_execution finds no grant (never both a claim and a
// reset), and FlowFabric's scheduler can grant it again. On both schemas.
// A regression shows as a claimed execution made eligible (two workers could
// run it) or a stranded one the scheduler cannot pick.
func TestClaimRacingTheGrantReset(t *testing.T) {
	t.Parallel()
	testdb.EachSchema(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		pool := db.Pool
		const p = int16(5)
		now := store.NowMs()
		issued := func() (string, string) {
			t.Helper()
			id := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, LifecyclePhase: "runnable", OwnershipState: "unowned",
				EligibilityState: "eligible_now", PublicState: "waiting", AttemptState: "pending_first_attempt",
				RawFields: map[string]any{"namespace": "a", "last_mutation_at": "1"}})
			ok, _, err := ffread.IssueClaimGrant(ctx, pool, p, id, "w1", "w1-i1", 1000, now-5000)
			if err != nil || !ok {
				t.Fatalf("issue grant: %v %v", ok, err)
			}
			var grant string
			if err := pool.QueryRow(ctx, `SELECT encode(grant_id, 'hex') FROM ff_claim_grant WHERE partition_key = $1 AND execution_id = $2`,
				p, id).Scan(&grant); err != nil {
				t.Fatal(err)
			}
			return id, grant
		}

		t.Run("ClaimHoldingTheExecutionWins", func(t *testing.T) {
			id, grant := issued()
			res := commitWhileBlocked(t, pool, "ff_exec_core", func(ctx context.Context, tx pgx.Tx) error {
				// A claim consuming its grant: the execution locked first,
				// as FlowFabric's claims lock it.
				if _, err := tx.Exec(ctx, `SELECT 1 FROM ff_exec_core WHERE partition_key = $1 AND execution_id = $2 FOR UPDATE`, p, id); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, `DELETE FROM ff_claim_grant WHERE partition_key = $1 AND execution_id = $2`, p, id); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `UPDATE ff_exec_core SET lifecycle_phase = 'active', ownership_state = 'leased',
					eligibility_state = 'not_applicable', public_state = 'active', attempt_state = 'running_attempt'
					WHERE partition_key = $1 AND execution_id = $2`, p, id)
				return err
			}, func(ctx context.Context) (store.ClaimGrantExpiryResult, error) {
				res, err := store.ExpireClaimGrants(ctx, pool, p, []string{grant}, now, store.Filter{})
				if err != nil {
					return store.ClaimGrantExpiryResult{}, err
				}
				return res[0], nil
			})
			if res != (store.ClaimGrantExpiryResult{}) {
				t.Fatalf("result = %+v; want nothing done (the claim consumed the grant)", res)
			}
			info, err := ffread.ReadExecutionInfo(ctx, pool, p, id)
			if err != nil {
				t.Fatal(err)
			}
			if info.StateVector.LifecyclePhase != "active" || info.StateVector.EligibilityState != "not_applicable" {
				t.Fatalf("FlowFabric reads %+v; want the claimed execution active", info.StateVector)
			}
		})

		t.Run("ResetFirstThenTheLateClaimFails", func(t *testing.T) {
			id, grant := issued()
			res, err := store.ExpireClaimGrants(ctx, pool, p, []string{grant}, now, store.Filter{})
			if err != nil {
				t.Fatal(err)
			}
			if !res[0].Deleted || !res[0].Reset {
				t.Fatalf("result = %+v; want the grant deleted and the execution reset", res[0])
			}
			info, err := ffread.ReadExecutionInfo(ctx, pool, p, id)
			if err != nil {
				t.Fatal(err)
			}
			if sv := info.StateVector; sv.EligibilityState != "eligible_now" || sv.PublicState != "waiting" ||
				sv.BlockingReason != "waiting_for_worker" || sv.LifecyclePhase != "runnable" {
				t.Fatalf("FlowFabric reads %+v; want runnable, eligible_now, waiting, waiting_for_worker", sv)
			}
			if _, err := ffread.ClaimExecution(ctx, pool, p, id, "w1", "w1-i1", 0, 30_000, now); !errors.Is(err, ffread.ErrInvalidClaimGrant) {
				t.Fatalf("late claim_execution: %v; want %v", err, ffread.ErrInvalidClaimGrant)
			}
			if ok, _, err := ffread.IssueClaimGrant(ctx, pool, p, id, "w2", "w2-i1", 30_000, now); err != nil || !ok {
				t.Fatalf("the scheduler cannot grant the execution again: %v %v", ok, err)
			}
		})
	})
}

// TestExpireClaimGrantsBatch: a batch gives every grant the result it gets
// alone, in input order, two expired grants of one execution both deleted
// and the execution reset once their last one is gone. A regression shows
// as results shifted between ids or the execution left pending_claim.
func TestExpireClaimGrantsBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const now, p = int64(4_000_000), int16(3)
	stranded := fftest.InsertExec(t, pool, fftest.PendingClaim(p))
	active := fftest.InsertExec(t, pool, fftest.Exec{Partition: p})
	g1 := fftest.InsertGrant(t, pool, fftest.Grant{Partition: p, ExecutionID: stranded, ExpiresAtMs: now - 3})
	live := fftest.InsertGrant(t, pool, fftest.Grant{Partition: p, ExecutionID: active, ExpiresAtMs: now + 1})
	g2 := fftest.InsertGrant(t, pool, fftest.Grant{Partition: p, ExecutionID: stranded, Kind: "reclaim", ExpiresAtMs: now - 2})
	g3 := fftest.InsertGrant(t, pool, fftest.Grant{Partition: p, ExecutionID: active, ExpiresAtMs: now - 1})
	res, err := store.ExpireClaimGrants(ctx, pool, p, []string{g1, live, g2, g3, g1}, now, store.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	want := []store.ClaimGrantExpiryResult{
		{Deleted: true, ExecutionID: stranded, Kind: "claim", Reset: true, DeadlineMs: now - 3},
		{},
		{Deleted: true, ExecutionID: stranded, Kind: "reclaim", Reset: true, DeadlineMs: now - 2},
		{Deleted: true, ExecutionID: active, Kind: "claim", DeadlineMs: now - 1},
		{},
	}
	for i := range want {
		if res[i] != want[i] {
			t.Errorf("result %d = %+v; want %+v", i, res[i], want[i])
		}
	}
	if e := fftest.ReadExec(t, pool, p, stranded); e.EligibilityState != "eligible_now" {
		t.Fatalf("stranded execution is %s; want eligible_now", e.EligibilityState)
	}
}
