package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/internal/testlog"
)

// startRun runs `worker run args...` in-process until the test ends and
// returns its HTTP address and everything it logs (at debug level).
func startRun(t *testing.T, args ...string) (string, *testlog.Buffer) {
	t.Helper()
	rc, err := parseRunFlags(append([]string{"--http-addr", "127.0.0.1:0"}, args...), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	logs := &testlog.Buffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, rc, logger, started) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("run did not stop")
		}
	})
	select {
	case addr := <-started:
		return addr, logs
	case err := <-done:
		t.Fatalf("run: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("run did not start")
	}
	return "", nil
}

func TestRiverUIAuthAndReadOnly(t *testing.T) {
	db := testdb.New(t)
	// The server trusts local connections, so a password in the URL is
	// accepted and ignored: it lets the test look for it in the output.
	dsn := strings.Replace(db.URL, "postgres@", "postgres:db-hunter2@", 1)
	addr, logs := startRun(t, "--database-url", dsn, "--ui-auth", "admin:ui-s3cret", "--ui-read-only")

	do := func(method, path, user, pass string) int {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(`{"job_ids":["1"]}`))
		if err != nil {
			t.Fatal(err)
		}
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	tests := []struct {
		name, method, path, user, pass string
		want                           int
	}{
		{"HealthOpen", "GET", "/healthz", "", "", 200},
		{"ReadyOpen", "GET", "/readyz", "", "", 200},
		{"UINeedsAuth", "GET", "/riverui/", "", "", 401},
		{"UIWrongPassword", "GET", "/riverui/", "admin", "nope", 401},
		{"UIWrongUser", "GET", "/riverui/", "root", "ui-s3cret", 401},
		{"UIWithAuth", "GET", "/riverui/", "admin", "ui-s3cret", 200},
		{"APIReadWithAuth", "GET", "/riverui/api/jobs?state=completed", "admin", "ui-s3cret", 200},
		{"APIWriteNeedsAuthFirst", "POST", "/riverui/api/jobs/cancel", "", "", 401},
		{"APICancelRefused", "POST", "/riverui/api/jobs/cancel", "admin", "ui-s3cret", 403},
		{"APIDeleteRefused", "POST", "/riverui/api/jobs/delete", "admin", "ui-s3cret", 403},
		{"APIRetryRefused", "POST", "/riverui/api/jobs/retry", "admin", "ui-s3cret", 403},
		{"APIPauseRefused", "PUT", "/riverui/api/queues/ff_rows/pause", "admin", "ui-s3cret", 403},
		{"APIPatchRefused", "PATCH", "/riverui/api/queues/ff_rows", "admin", "ui-s3cret", 403},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := do(tt.method, tt.path, tt.user, tt.pass); got != tt.want {
				t.Fatalf("%s %s = %d; want %d", tt.method, tt.path, got, tt.want)
			}
		})
	}
	out := logs.String()
	if !strings.Contains(out, "starting worker") || !strings.Contains(out, "xxxxx") {
		t.Fatalf("expected the redacted database URL in the logs; got:\n%s", out)
	}
	for _, secret := range []string{"db-hunter2", "ui-s3cret"} {
		if strings.Contains(out, secret) {
			t.Errorf("logs contain the secret %q", secret)
		}
	}
}

func TestRiverUIWritableWithoutReadOnly(t *testing.T) {
	db := testdb.New(t)
	addr, _ := startRun(t, "--database-url", db.URL)
	resp, err := http.Post("http://"+addr+"/riverui/api/jobs/cancel", "application/json", strings.NewReader(`{"job_ids":["123456"]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusUnauthorized {
		t.Fatalf("cancel without --ui-read-only = %d; want it let through", resp.StatusCode)
	}
}

func TestSecretsNeverPrinted(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://u:env-pw-1@127.0.0.1:1/x?connect_timeout=1")
	t.Setenv("FF_UI_AUTH", "admin:env-ui-pw")
	for _, args := range [][]string{
		{"run", "--help"},
		{"migrate", "--help"},
		{"migrate"},
		{"run", "--http-addr", ""},
		{"run", "--database-url", "host=127.0.0.1 port=1 user=u password=kv-pw-2 connect_timeout=1", "--http-addr", ""},
	} {
		code, out, errOut := runMain(t, context.Background(), args...)
		all := out + errOut
		for _, secret := range []string{"env-pw-1", "env-ui-pw", "kv-pw-2"} {
			if strings.Contains(all, secret) {
				t.Errorf("worker %v (exit %d) printed %q:\n%s", args, code, secret, all)
			}
		}
	}
}
