// Package tracing sets up OpenTelemetry tracing for `worker run --otel`:
// River job spans (otelriver) and SQL spans (otelpgx) exported over OTLP as
// configured by the standard OTEL_* environment variables
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL,
// OTEL_TRACES_EXPORTER, OTEL_SERVICE_NAME, …).
package tracing

import (
	"context"
	"errors"
	"fmt"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river/rivertype"
	"github.com/riverqueue/rivercontrib/otelriver"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
)

// Setup installs a global tracer provider whose exporter autoexport picks
// from the environment (OTLP by default; OTEL_TRACES_EXPORTER=none turns it
// off, console prints spans). The returned function flushes and stops it.
func Setup(ctx context.Context, serviceName string) (func(context.Context) error, error) {
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, fmt.Errorf("OpenTelemetry span exporter (check the OTEL_* variables): %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(serviceName)))
	if err != nil && !errors.Is(err, resource.ErrSchemaURLConflict) {
		return nil, fmt.Errorf("OpenTelemetry resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return tp.Shutdown, nil
}

// QueryTracer traces every SQL statement of a pool as a child of the span in
// its context (a River job's span).
func QueryTracer() pgx.QueryTracer {
	return otelpgx.NewTracer(otelpgx.WithTrimSQLInSpanName())
}

// RiverMiddleware creates a span around each job's insert and work.
func RiverMiddleware() rivertype.Middleware {
	return otelriver.NewMiddleware(nil)
}
