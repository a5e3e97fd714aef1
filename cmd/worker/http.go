package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"riverqueue.com/riverui"

	"github.com/flowfabric/ffreconcile/internal/fleet"
)

// newHTTPHandler serves River UI under /riverui/, liveness at /healthz,
// readiness at /readyz and the reconcilers' counters at /stats.
func newHTTPHandler(ctx context.Context, f *fleet.Fleet, rc *runConfig, logger *slog.Logger, ready *atomic.Bool) (http.Handler, error) {
	mux := http.NewServeMux()

	// /healthz: the process is alive and serving HTTP.
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})

	// /readyz: the River client is started and the database answers.
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !ready.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready: River client not started (or stopping)")
			return
		}
		pingCtx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := f.WorkPool.Ping(pingCtx); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready: database unreachable")
			return
		}
		fmt.Fprintln(w, "ready")
	})

	// /stats: what each reconciler did in this process since it started.
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(f.Workers.Stats().Snapshot())
	})

	if rc.ui {
		ui, err := riverui.NewHandler(&riverui.HandlerOpts{
			Endpoints: riverui.NewEndpoints(f.Client, nil),
			Logger:    logger,
			Prefix:    "/riverui",
		})
		if err != nil {
			return nil, fmt.Errorf("river UI: %w", err)
		}
		if err := ui.Start(ctx); err != nil {
			return nil, fmt.Errorf("start river UI: %w", err)
		}
		mux.Handle("/riverui/", ui)
		mux.Handle("GET /{$}", http.RedirectHandler("/riverui/", http.StatusFound))
	}
	return mux, nil
}
