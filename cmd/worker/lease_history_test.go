package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/internal/testlog"
	"github.com/flowfabric/ffreconcile/leasehistory"
)

var leaseHistoryQuiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestLeaseHistoryJSONAndResume(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := db.Pool.Exec(ctx, `
INSERT INTO ff_lease_event (execution_id, lease_id, event_type, occurred_at_ms, partition_key, namespace, instance_tag)
VALUES ('0b8e5a8e-7c1d-4d2a-9a54-7d1c7e0e0001', NULL, 'acquired', 1700000000123, 7, 'prod', 'i-1'),
       ('0b8e5a8e-7c1d-4d2a-9a54-7d1c7e0e0002', 'l-2', 'renewed', 1700000000456, 9, NULL, NULL),
       ('0b8e5a8e-7c1d-4d2a-9a54-7d1c7e0e0003', NULL, 'expired', 1700000001000, 7, 'prod', NULL),
       ('0b8e5a8e-7c1d-4d2a-9a54-7d1c7e0e0004', NULL, 'revoked', 1700000002000, 200, 'dev', 'i-1')`)
	if err != nil {
		t.Fatal(err)
	}

	run := func(args ...string) ([]map[string]any, string) {
		t.Helper()
		var out, errb bytes.Buffer
		args = append([]string{"--database-url", db.URL, "--format", "json"}, args...)
		if err := leaseHistoryCommand(ctx, args, &out, &errb, leaseHistoryQuiet); err != nil {
			t.Fatalf("lease-history %v: %v", args, err)
		}
		var lines []map[string]any
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			if line == "" {
				continue
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatalf("line %q is not JSON: %v", line, err)
			}
			lines = append(lines, m)
		}
		return lines, errb.String()
	}

	// No cursor, no --follow: the whole history.
	lines, stderr := run()
	if len(lines) != 4 {
		t.Fatalf("got %d lines; want 4: %v", len(lines), lines)
	}
	want := map[string]any{
		"event_id": 1.0, "type": "acquired", "execution_id": "{fp:7}:0b8e5a8e-7c1d-4d2a-9a54-7d1c7e0e0001",
		"partition": 7.0, "occurred_at_ms": 1700000000123.0, "occurred_at": "2023-11-14T22:13:20.123Z",
		"namespace": "prod", "instance_tag": "i-1", "lease_id": nil, "cursor": "020000000000000001",
	}
	for k, v := range want {
		if got, ok := lines[0][k]; !ok || got != v {
			t.Errorf("line 1 %s = %#v; want %#v", k, got, v)
		}
	}
	if len(lines[0]) != len(want) {
		t.Errorf("line 1 has fields %v; want exactly %d", lines[0], len(want))
	}
	if lines[1]["lease_id"] != "l-2" || lines[1]["namespace"] != nil || lines[1]["instance_tag"] != nil {
		t.Errorf("line 2 = %v", lines[1])
	}
	if !strings.Contains(stderr, "--cursor 020000000000000004") {
		t.Errorf("stderr %q lacks the resume cursor", stderr)
	}

	// Resume after the second line's cursor.
	lines, _ = run("--cursor", lines[1]["cursor"].(string))
	if len(lines) != 2 || lines[0]["event_id"] != 3.0 || lines[1]["event_id"] != 4.0 {
		t.Fatalf("after resume got %v; want events 3 and 4", lines)
	}

	// Filters; the final cursor is past the filtered-out tail.
	lines, stderr = run("--partition", "7", "--namespace", "prod")
	if len(lines) != 2 || lines[0]["event_id"] != 1.0 || lines[1]["event_id"] != 3.0 {
		t.Fatalf("partition 7, namespace prod: got %v", lines)
	}
	if !strings.Contains(stderr, "--cursor 020000000000000004") {
		t.Errorf("stderr %q lacks the resume cursor past filtered events", stderr)
	}
	lines, _ = run("--instance-tag", "cairn.instance_id=i-1", "--partition", "9,200")
	if len(lines) != 1 || lines[0]["event_id"] != 4.0 {
		t.Fatalf("instance tag i-1 on partitions 9, 200: got %v", lines)
	}
}

func TestLeaseHistoryTextFollow(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	insert := func(part int) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, `INSERT INTO ff_lease_event (execution_id, event_type, occurred_at_ms, partition_key)
VALUES (gen_random_uuid()::text, 'acquired', 0, $1)`, part); err != nil {
			t.Fatal(err)
		}
	}
	insert(1) // before the command starts: not printed without --cursor

	followCtx, stop := context.WithCancel(ctx)
	var out, errb testlog.Buffer
	done := make(chan error, 1)
	go func() {
		done <- leaseHistoryCommand(followCtx, []string{"--database-url", db.URL, "--follow", "--poll", "--poll-interval", "50ms"},
			&out, &errb, leaseHistoryQuiet)
	}()
	// The command resolves "now" when it subscribes; keep inserting until
	// output appears so the test does not depend on startup time.
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(out.String(), "partition=2") {
		if time.Now().After(deadline) {
			t.Fatalf("no output; stdout %q stderr %q", out.String(), errb.String())
		}
		insert(2)
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("follow ended with %v", err)
	}
	if strings.Contains(out.String(), "partition=1 ") {
		t.Errorf("printed an event from before it started:\n%s", out.String())
	}
	first := strings.SplitN(out.String(), "\n", 2)[0]
	if !strings.Contains(first, "acquired") || !strings.Contains(first, "{fp:2}:") || !strings.Contains(first, "cursor=02") {
		t.Errorf("text line %q", first)
	}
	if !strings.Contains(errb.String(), "resume with --cursor 02") {
		t.Errorf("stderr %q lacks the resume cursor", errb.String())
	}
}

func TestLeaseHistoryBadFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"partition too big", []string{"--partition", "256"}, "--partition 256 is out of range 0..255"},
		{"partition negative", []string{"--partition", "-1"}, "--partition -1 is out of range 0..255"},
		{"partition not a number", []string{"--partition", "seven"}, `--partition "seven" is not a whole number`},
		{"partition and all", []string{"--partition", "3", "--all-partitions"}, "--partition and --all-partitions cannot be used together"},
		{"bad format", []string{"--format", "yaml"}, `--format must be text or json, got "yaml"`},
		{"cursor not hex", []string{"--cursor", "xyz"}, "malformed lease history cursor"},
		{"cursor wrong prefix", []string{"--cursor", "01000000000000002a"}, "prefix byte 0x01, want 0x02"},
		{"cursor wrong length", []string{"--cursor", "0200"}, "2 bytes, want 9"},
		{"cursor negative", []string{"--cursor", "02ffffffffffffffff"}, "negative event id"},
		{"instance tag bare value", []string{"--instance-tag", "i-1"}, `instance tag "i-1": want KEY=VALUE`},
		{"instance tag other key", []string{"--instance-tag", "region=eu"}, "lease events record only the cairn.instance_id tag"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// An unreachable URL: validation must fail before connecting.
			args := append([]string{"--database-url", "postgres://nobody@127.0.0.1:1/none"}, tt.args...)
			err := leaseHistoryCommand(context.Background(), args, io.Discard, io.Discard, leaseHistoryQuiet)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v; want one mentioning %q", err, tt.want)
			}
			if !errors.Is(err, errUsage) {
				t.Errorf("error %v is not a usage error (exit code 2)", err)
			}
			if strings.HasPrefix(tt.name, "cursor") && !errors.Is(err, leasehistory.ErrMalformedCursor) {
				t.Errorf("error %v does not wrap leasehistory.ErrMalformedCursor", err)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error spans lines: %q", err)
			}
		})
	}
	var help bytes.Buffer
	if err := leaseHistoryCommand(context.Background(), []string{"--help"}, &help, io.Discard, leaseHistoryQuiet); err != errHelp {
		t.Fatalf("--help: %v", err)
	}
	for _, want := range []string{"FF_LEASE_HISTORY_FOLLOW", "FF_LEASE_HISTORY_PARTITION", "--instance-tag", "--poll"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("help lacks %q", want)
		}
	}
}
