package tracing_test

import (
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// TestJobAndSQLSpans: with tracing on, a release job produces a River span
// whose SQL statements are its children.
func TestJobAndSQLSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))

	db := testdb.New(t)
	id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: 5})
	fftest.InsertAttempt(t, db.Pool, 5, id, 0, fftest.Ms(store.NowMs()-1000))
	fleettest.Start(t, db, fleet.Config{Reconcilers: fleettest.Fast(workers.LeaseExpiry), Tracing: true})
	fleettest.WaitFor(t, fleettest.Patient, "lease released", func() (bool, string) {
		return fftest.ReadAttempt(t, db.Pool, 5, id, 0).LeaseExpiresAtMs == nil, "leased"
	})

	var jobSpan sdktrace.ReadOnlySpan
	fleettest.WaitFor(t, fleettest.Patient, "release job span", func() (bool, string) {
		for _, s := range rec.Ended() {
			for _, a := range s.Attributes() {
				if a.Value.AsString() == jobs.KindLeaseRelease && strings.Contains(s.Name(), "work") {
					jobSpan = s
					return true, ""
				}
			}
		}
		return false, fleettest.Statusf("%d spans", len(rec.Ended()))
	})
	var sqlChildren int
	for _, s := range rec.Ended() {
		if s.Parent().SpanID() == jobSpan.SpanContext().SpanID() && s.SpanContext().TraceID() == jobSpan.SpanContext().TraceID() {
			sqlChildren++
		}
	}
	if sqlChildren == 0 {
		t.Fatalf("the release job span %q has no SQL child spans", jobSpan.Name())
	}
}
