package store_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/internal/ffread"
	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

// TestReconcileQuotas: an expired admission is deleted, its policy's
// window rows older than the window too, and a capped policy's counter is
// set to its live admissions; an admission renewed meanwhile (a
// re-admission) is kept but its policy still recounted; a policy without a
// cap keeps its counter; a negative window is reported and its rows kept;
// an admission of no policy is deleted alone. A second run changes nothing.
// A regression shows as a live admission deleted, a counter left above its
// live admissions (check_admission then refuses for ever), or a window row
// inside the window deleted.
func TestReconcileQuotas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const now, p = int64(4_000_000), int16(9)

	tests := []struct {
		name   string
		policy *fftest.QuotaPolicy
		// admissions: expiry of each (the first is the one reconciled).
		admissions   []int64
		window       []int64 // admitted_at_ms of window rows
		want         store.QuotaReconcileResult
		wantCounter  int
		wantAdmitted int
		wantWindow   int
	}{
		{name: "ExpiredOneOfTwo", policy: &fftest.QuotaPolicy{WindowSeconds: 60, ConcurrencyCap: 2, ActiveConcurrency: 2},
			admissions: []int64{now, now + 1}, window: []int64{now - 60_001, now - 60_000},
			want:        store.QuotaReconcileResult{Deleted: true, DeadlineMs: now, WindowRowsDeleted: 1, Recounted: true, ConcurrencyBefore: 2, ConcurrencyAfter: 1},
			wantCounter: 1, wantAdmitted: 1, wantWindow: 1},
		{name: "RenewedButCounterHigh", policy: &fftest.QuotaPolicy{WindowSeconds: 60, ConcurrencyCap: 5, ActiveConcurrency: 3},
			admissions:  []int64{now + 10},
			want:        store.QuotaReconcileResult{Recounted: true, ConcurrencyBefore: 3, ConcurrencyAfter: 1},
			wantCounter: 1, wantAdmitted: 1},
		{name: "CounterRight", policy: &fftest.QuotaPolicy{WindowSeconds: 60, ConcurrencyCap: 5, ActiveConcurrency: 1},
			admissions: []int64{now - 5, now + 10},
			want:       store.QuotaReconcileResult{Deleted: true, DeadlineMs: now - 5}, wantCounter: 1, wantAdmitted: 1},
		{name: "NoCap", policy: &fftest.QuotaPolicy{WindowSeconds: 60, ActiveConcurrency: 4},
			admissions: []int64{now - 5},
			want:       store.QuotaReconcileResult{Deleted: true, DeadlineMs: now - 5}, wantCounter: 4},
		{name: "NegativeWindow", policy: &fftest.QuotaPolicy{WindowSeconds: -1, ConcurrencyCap: 1, ActiveConcurrency: 1},
			admissions: []int64{now - 5}, window: []int64{1},
			want: store.QuotaReconcileResult{Deleted: true, DeadlineMs: now - 5, WindowNegative: -1, Recounted: true,
				ConcurrencyBefore: 1}, wantWindow: 1},
		{name: "NoPolicy", admissions: []int64{now - 5},
			want: store.QuotaReconcileResult{Deleted: true, DeadlineMs: now - 5, PolicyMissing: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			policy := "qp-" + tt.name
			if tt.policy != nil {
				pol := *tt.policy
				pol.Partition, pol.ID = p, policy
				fftest.InsertQuotaPolicy(t, pool, pol)
			}
			var first string
			for i, exp := range tt.admissions {
				ex := "{fp:1}:" + fftest.NewUUID()
				if i == 0 {
					first = ex
				}
				fftest.InsertQuotaAdmitted(t, pool, p, policy, ex, exp)
			}
			for _, at := range tt.window {
				fftest.InsertQuotaWindow(t, pool, p, policy, "{fp:1}:"+fftest.NewUUID(), at)
			}
			rows := []store.QuotaAdmission{{PolicyID: policy, ExecutionID: first}}
			res, err := store.ReconcileQuotas(ctx, pool, p, rows, now)
			if err != nil {
				t.Fatal(err)
			}
			if res[0] != tt.want {
				t.Fatalf("result = %+v; want %+v", res[0], tt.want)
			}
			if tt.policy != nil {
				if n := fftest.ActiveConcurrency(t, pool, p, policy); n != tt.wantCounter {
					t.Fatalf("active_concurrency = %d; want %d", n, tt.wantCounter)
				}
			}
			if n := fftest.Count(t, pool, `SELECT count(*) FROM ff_quota_admitted WHERE partition_key = $1 AND quota_policy_id = $2`, p, policy); n != tt.wantAdmitted {
				t.Fatalf("%d admissions left; want %d", n, tt.wantAdmitted)
			}
			if n := fftest.Count(t, pool, `SELECT count(*) FROM ff_quota_window WHERE partition_key = $1 AND quota_policy_id = $2`, p, policy); n != tt.wantWindow {
				t.Fatalf("%d window rows left; want %d", n, tt.wantWindow)
			}
			again, err := store.ReconcileQuotas(ctx, pool, p, rows, now)
			if err != nil {
				t.Fatal(err)
			}
			if again[0].Changed() {
				t.Fatalf("second run = %+v; want no change", again[0])
			}
		})
	}
}

// TestCheckAdmissionAfterQuotaReconcile: FlowFabric's check_admission
// refuses a capped policy once its counter reached the cap, and only the
// reconcile lowers it when the admissions lapse: after it, check_admission
// admits again (and counts the new admission). On both schemas. A
// regression shows as ConcurrencyExceeded after the reconcile.
func TestCheckAdmissionAfterQuotaReconcile(t *testing.T) {
	t.Parallel()
	testdb.EachSchema(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		pool := db.Pool
		const p, policy = int16(4), "qp-1"
		const t0 = int64(1_000_000)
		fftest.InsertQuotaPolicy(t, pool, fftest.QuotaPolicy{Partition: p, ID: policy, WindowSeconds: 10, MaxRequests: 100, ConcurrencyCap: 2})
		admit := func(ex string, now int64) ffread.Admission {
			t.Helper()
			got, err := ffread.CheckAdmission(ctx, pool, p, policy, ffread.AdmissionArgs{ExecutionID: ex, WindowSeconds: 10,
				RateLimit: 100, ConcurrencyCap: 2, NowMs: now})
			if err != nil {
				t.Fatal(err)
			}
			return got
		}
		for i, ex := range []string{"{fp:1}:a", "{fp:1}:b"} {
			if got := admit(ex, t0+int64(i)); got != ffread.Admitted {
				t.Fatalf("admission %d: %s", i, got)
			}
		}
		later := t0 + 20_000 // both guards lapsed
		if got := admit("{fp:1}:c", later); got != ffread.ConcurrencyExceeded {
			t.Fatalf("before the reconcile: %s; want %s (the counter only goes up)", got, ffread.ConcurrencyExceeded)
		}
		res, err := store.ReconcileQuotas(ctx, pool, p, []store.QuotaAdmission{{policy, "{fp:1}:a"}, {policy, "{fp:1}:b"}}, later)
		if err != nil {
			t.Fatal(err)
		}
		if !res[0].Deleted || !res[1].Deleted || !res[0].Recounted || res[0].ConcurrencyAfter != 0 {
			t.Fatalf("reconcile = %+v", res)
		}
		if got := admit("{fp:1}:c", later); got != ffread.Admitted {
			t.Fatalf("after the reconcile: %s; want %s", got, ffread.Admitted)
		}
		if n := fftest.ActiveConcurrency(t, pool, p, policy); n != 1 {
			t.Fatalf("active_concurrency = %d; want 1", n)
		}
	})
}

// TestRecountWaitsForCheckAdmission: the recount takes the policy's row
// lock, as check_admission does, and counts what a check_admission holding
// it committed: the new admission is counted, not overwritten. A
// regression (a count read before the lock) shows as a counter one below
// the live admissions, which lets check_admission admit past the cap.
func TestRecountWaitsForCheckAdmission(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	pool := db.Pool
	const now, p, policy = int64(4_000_000), int16(6), "qp-lock"
	fftest.InsertQuotaPolicy(t, pool, fftest.QuotaPolicy{Partition: p, ID: policy, WindowSeconds: 60, ConcurrencyCap: 5, ActiveConcurrency: 1})
	fftest.InsertQuotaAdmitted(t, pool, p, policy, "{fp:1}:old", now-1)
	got := commitWhileBlocked(t, pool, "ff_quota_policy", func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT 1 FROM ff_quota_policy WHERE partition_key = $1 AND quota_policy_id = $2 FOR UPDATE`, p, policy); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO ff_quota_admitted VALUES ($1, $2, '{fp:1}:new', $3::bigint, $3::bigint + 60000)`, p, policy, now); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE ff_quota_policy SET active_concurrency = active_concurrency + 1 WHERE partition_key = $1 AND quota_policy_id = $2`, p, policy)
		return err
	}, func(ctx context.Context) (store.QuotaReconcileResult, error) {
		res, err := store.ReconcileQuotas(ctx, pool, p, []store.QuotaAdmission{{policy, "{fp:1}:old"}}, now)
		if err != nil {
			return store.QuotaReconcileResult{}, err
		}
		return res[0], nil
	})
	want := store.QuotaReconcileResult{Deleted: true, DeadlineMs: now - 1, Recounted: true, ConcurrencyBefore: 2, ConcurrencyAfter: 1}
	if got != want {
		t.Fatalf("result = %+v; want %+v", got, want)
	}
	if n := fftest.ActiveConcurrency(t, pool, p, policy); n != 1 {
		t.Fatalf("active_concurrency = %d; want 1 (the admission committed while the recount waited)", n)
	}
}
