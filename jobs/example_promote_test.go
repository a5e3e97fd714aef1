package jobs_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/flowfabric/ffreconcile/jobs"
)

// Another service delays an execution and, in the same transaction, enqueues
// its promotion for the delay-until. If the transaction rolls back, neither
// the delay nor the promotion happens. The client is insert-only: it has no
// workers and no queues, and needs nothing but River's schema.
func Example_promoteInTransaction() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: "river"})
	if err != nil {
		log.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit

	delayUntil := time.Now().Add(30 * time.Second)
	// ... the service's own writes, e.g. parking the execution as
	// runnable + not_eligible_until_time with deadline_at_ms = delayUntil ...

	res, err := client.InsertTx(ctx, tx, jobs.PromoteArgs{
		Execution: "{fp:7}:6f1c0b1e-2d3a-4b5c-8d9e-0a1b2c3d4e5f",
		At:        &delayUntil,
	}, nil)
	if err != nil {
		log.Fatal(err) // invalid args are refused here, before reaching the database
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
	if res.UniqueSkippedAsDuplicate {
		fmt.Printf("an identical promotion is already queued (job %d)\n", res.Job.ID)
		return
	}
	fmt.Printf("promotion job %d scheduled at %s\n", res.Job.ID, res.Job.ScheduledAt)
}
