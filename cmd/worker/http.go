package main

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"riverqueue.com/riverui"

	"github.com/flowfabric/ffreconcile/internal/fleet"
)

// readyzPingCap bounds /readyz's database ping for a prober without a
// timeout of its own.
const readyzPingCap = 10 * time.Second

// newHTTPHandler serves River UI under /riverui/, liveness at /healthz,
// readiness at /readyz, the reconcilers' counters at /stats and Prometheus
// metrics at /metrics.
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
		// The prober's own timeout (Kubernetes' timeoutSeconds) says how
		// slow is too slow: it cancels the request's context. The cap only
		// bounds a prober that never gives up. A tighter limit of ours
		// turned a busy server's slow answer into "unreachable": with every
		// work connection taken, the ping waits for one (a chaos run on a
		// loaded machine saw 2 s pass while the fleet drained).
		pingCtx, cancel := context.WithTimeout(r.Context(), readyzPingCap)
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

	// /metrics: Prometheus.
	mux.Handle("GET /metrics", f.Metrics.Handler())

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
		var h http.Handler = ui
		if rc.uiReadOnly {
			h = readOnly(h)
		}
		if rc.uiUser != "" {
			h = basicAuth(h, rc.uiUser, rc.uiPassword)
		}
		mux.Handle("/riverui/", h)
		mux.Handle("GET /{$}", http.RedirectHandler("/riverui/", http.StatusFound))
	}
	return mux, nil
}

// basicAuth protects River UI and its API: they can cancel, delete and retry
// jobs and pause queues, and River UI has no authentication of its own.
// Comparing hashes in constant time keeps the check from leaking the
// password's length or prefix through timing.
func basicAuth(next http.Handler, user, password string) http.Handler {
	wantUser := sha256.Sum256([]byte(user))
	wantPass := sha256.Sum256([]byte(password))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		gotUser := sha256.Sum256([]byte(u))
		gotPass := sha256.Sum256([]byte(p))
		userOK := subtle.ConstantTimeCompare(gotUser[:], wantUser[:]) == 1
		passOK := subtle.ConstantTimeCompare(gotPass[:], wantPass[:]) == 1
		if !ok || !userOK || !passOK {
			w.Header().Set("WWW-Authenticate", `Basic realm="River UI", charset="UTF-8"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// readOnly refuses every River UI API call that changes something (all of
// them use POST, PUT or PATCH; reads use GET).
func readOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
			next.ServeHTTP(w, r)
			return
		}
		if strings.Contains(r.URL.Path, "/api/") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprintln(w, `{"message":"River UI is read-only on this worker (--ui-read-only)"}`)
			return
		}
		next.ServeHTTP(w, r)
	})
}
