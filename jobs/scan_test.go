package jobs_test

import (
	"context"
	"testing"

	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/jobs"
)

// oldScanArgs is the shape every scan args type had before they embedded
// jobs.ScanArgs (one struct per reconciler, fields of its own), kept here to
// pin that the change kept their JSON and River's unique key.
type oldScanArgs struct {
	kind      string
	Partition int16            `json:"partition" river:"unique"`
	After     *jobs.ScanCursor `json:"after,omitempty"`
	Follows   int64            `json:"follows,omitempty" river:"unique"`
}

func (a oldScanArgs) Kind() string { return a.kind }

func (a oldScanArgs) InsertOpts() river.InsertOpts {
	return jobs.LeaseExpiryScanArgs{}.InsertOpts()
}

// TestScanArgsKeepTheirJSONAndUniqueKey: for every scan kind, args built the
// old way and the new way encode to the same bytes, and River takes them for
// the same job: the new one, inserted while the old one waits, is skipped
// as its duplicate. A regression (a renamed field, a tag lost in the
// embedding) would let a fleet of the new version enqueue a second scan
// next to a queued scan of the old one, or change what other clients see.
func TestScanArgsKeepTheirJSONAndUniqueKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	client := insertOnlyClient(t, db.Pool)

	newArgs := map[string]func(jobs.ScanArgs) river.JobArgs{
		jobs.KindLeaseExpiryScan:       func(a jobs.ScanArgs) river.JobArgs { return jobs.LeaseExpiryScanArgs{ScanArgs: a} },
		jobs.KindSuspensionTimeoutScan: func(a jobs.ScanArgs) river.JobArgs { return jobs.SuspensionTimeoutScanArgs{ScanArgs: a} },
		jobs.KindDelayedPromotionScan:  func(a jobs.ScanArgs) river.JobArgs { return jobs.DelayedPromotionScanArgs{ScanArgs: a} },
		jobs.KindCancelDispatchScan:    func(a jobs.ScanArgs) river.JobArgs { return jobs.CancelDispatchScanArgs{ScanArgs: a} },
		jobs.KindCancelReconcileScan:   func(a jobs.ScanArgs) river.JobArgs { return jobs.CancelReconcileScanArgs{ScanArgs: a} },
	}
	variants := []jobs.ScanArgs{
		{Partition: 0},
		{Partition: 7, Follows: 42},
		{Partition: 9, After: &jobs.ScanCursor{AtMs: 123, ID: testUUID, ID2: testUUID, N: 2}},
	}
	for kind, build := range newArgs {
		for _, v := range variants {
			old := oldScanArgs{kind: kind, Partition: v.Partition, After: v.After, Follows: v.Follows}
			fresh := build(v)
			if got, want := string(marshal(t, fresh)), string(marshal(t, old)); got != want {
				t.Errorf("%s: JSON %s; before the change %s", kind, got, want)
			}
			res, err := client.Insert(ctx, old, nil)
			if err != nil || res.UniqueSkippedAsDuplicate {
				t.Fatalf("%s: insert the old shape: %+v, %v", kind, res, err)
			}
			res, err = client.Insert(ctx, fresh, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !res.UniqueSkippedAsDuplicate {
				t.Errorf("%s %+v: the new args got a job of their own; want the old one's unique key", kind, v)
			}
		}
	}
}
