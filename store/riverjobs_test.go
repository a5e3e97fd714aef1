package store_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// TestQueuedRowJobsAndUnfinishedScans: both tick queries count per partition,
// by state, only their kind and queue, and leave out jobs whose args hold no
// valid partition (inserted by hand; the workers cancel them when they run)
// instead of failing on them.
func TestQueuedRowJobsAndUnfinishedScans(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	insert := func(kind, queue, state, args string) int64 { return db.InsertRawJob(t, kind, queue, state, args) }
	row, scan := jobs.KindLeaseRelease, jobs.KindLeaseExpiryScan
	for _, j := range []struct{ kind, queue, state, args string }{
		{row, jobs.QueueRows, "available", `{"partition": 1}`},
		{row, jobs.QueueRows, "available", `{"partition": 1}`},
		{row, jobs.QueueRows, "running", `{"partition": 1}`},
		{row, jobs.QueueRows, "running", `{"partition": "2"}`},
		{row, jobs.QueueRows, "available", `{"partition": 2.0}`},
		{row, jobs.QueueRows, "running", `{"partition": 2}`},
		{row, jobs.QueueRows, "retryable", `{"partition": 3}`}, // not counted: neither available nor running
		{row, jobs.QueueRows, "available", `{"partition": "abc"}`},
		{row, jobs.QueueRows, "available", `{"partition": null}`},
		{row, jobs.QueueRows, "available", `{"partition": 99999}`},
		{row, jobs.QueueRows, "available", `{"partition": 1.5}`},
		{row, jobs.QueueRows, "available", `{}`},
		{row, "other", "available", `{"partition": 1}`},
		{jobs.KindPromote, jobs.QueueRows, "available", `{"partition": 1}`},
		{scan, jobs.QueueControl, "available", `{"partition": 4}`},
		{scan, jobs.QueueControl, "completed", `{"partition": 4}`},
		{scan, jobs.QueueControl, "available", `{"partition": "x"}`},
	} {
		insert(j.kind, j.queue, j.state, j.args)
	}
	running := insert(scan, jobs.QueueControl, "running", `{"partition": 5}`)
	retryable := insert(scan, jobs.QueueControl, "retryable", `{"partition": 5, "follows": 1}`)
	insert(scan, jobs.QueueControl, "completed", `{"partition": 6}`)
	bothID := insert(scan, jobs.QueueControl, "running", `{"partition": 7}`)
	insert(scan, jobs.QueueControl, "available", `{"partition": 7, "follows": 1}`)

	queued, err := store.QueuedRowJobs(ctx, db.Pool, testdb.RiverSchema, jobs.QueueRows, row, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	wantQueued := map[int16]store.QueuedRows{1: {Available: 2, Running: 1}, 2: {Running: 1}}
	if !maps.Equal(queued, wantQueued) {
		t.Errorf("QueuedRowJobs = %+v; want %+v", queued, wantQueued)
	}

	scans, err := store.UnfinishedScans(ctx, db.Pool, testdb.RiverSchema, jobs.QueueControl, scan)
	if err != nil {
		t.Fatal(err)
	}
	wantScans := map[int16]store.PartitionScans{
		4: {Waiting: true},
		5: {Started: max(running, retryable)},
		7: {Waiting: true, Started: bothID},
	}
	if !maps.Equal(scans, wantScans) {
		t.Errorf("UnfinishedScans = %+v; want %+v", scans, wantScans)
	}
}
