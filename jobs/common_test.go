package jobs_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/flowfabric/ffreconcile/internal/testdb"
)

// testUUID is a valid execution id.
const testUUID = "6f1c0b1e-2d3a-4b5c-8d9e-0a1b2c3d4e5f"

func partition(p int16) *int16 { return &p }

// insertOnlyClient is what another service runs: a River client with no
// workers or queues, inserting jobs.
func insertOnlyClient(t *testing.T, pool *pgxpool.Pool) *river.Client[pgx.Tx] {
	t.Helper()
	c, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: testdb.RiverSchema})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
