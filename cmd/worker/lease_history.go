package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/flowfabric/ffreconcile/internal/dbconn"
	"github.com/flowfabric/ffreconcile/leasehistory"
	"github.com/flowfabric/ffreconcile/migrations"
	"github.com/flowfabric/ffreconcile/store"
)

const leaseHistorySummary = `Print FlowFabric lease events (acquired, renewed, expired, reclaimed, revoked) from ff_lease_event,
in event id order, each with the cursor to resume after it.

Without --follow it prints the events after --cursor up to the newest one and exits; without --cursor
that is the whole history. With --follow it keeps streaming until interrupted; without --cursor it
starts from now. Either way the cursor to resume from is printed on stderr at the end.
Without --partition, every partition is included (as with --all-partitions).
An event whose transaction is still open holds the stream back until it commits or rolls back
(at most --gap-wait), so no event is skipped. Cursors are 18 hex digits (FlowFabric's 0x02 +
big-endian event id).`

// leaseHistoryCommand implements `worker lease-history`.
func leaseHistoryCommand(ctx context.Context, args []string, stdout, stderr io.Writer, logger *slog.Logger) error {
	var (
		dsn, cursorText, namespace, instanceTag, format string
		partitionArgs                                   []string
		allPartitions, follow, poll, acceptTrimmed      bool
		pollInterval, gapWait                           time.Duration
	)
	f := newFlagSet("lease-history", leaseHistorySummary)
	databaseURLFlag(f, &dsn)
	f.Strings(&partitionArgs, "partition", "FF_LEASE_HISTORY_PARTITION",
		"only this flow partition (0..255); repeatable or comma-separated (default all)")
	f.Bool(&allPartitions, "all-partitions", "FF_LEASE_HISTORY_ALL_PARTITIONS", false, "every partition (the default)")
	f.String(&cursorText, "cursor", "FF_LEASE_HISTORY_CURSOR", "",
		"print events after this cursor (default: the beginning, or now with --follow)")
	f.Bool(&follow, "follow", "FF_LEASE_HISTORY_FOLLOW", false, "keep streaming new events until interrupted")
	f.String(&namespace, "namespace", "FF_LEASE_HISTORY_NAMESPACE", "", "only events of this namespace")
	f.String(&instanceTag, "instance-tag", "FF_LEASE_HISTORY_INSTANCE_TAG", "",
		"only events of executions whose tag KEY equals VALUE, given as KEY=VALUE as for `worker run`; lease events record the cairn.instance_id tag only")
	f.Bool(&acceptTrimmed, "accept-trimmed", "FF_LEASE_HISTORY_ACCEPT_TRIMMED", false,
		"go on when events after --cursor were deleted by outbox retention, saying so on stderr (default: fail naming the gap)")
	f.String(&format, "format", "FF_LEASE_HISTORY_FORMAT", "text", "output format: text or json (one object per line)")
	f.Bool(&poll, "poll", "FF_LEASE_HISTORY_POLL", false, "poll instead of LISTEN/NOTIFY (behind a transaction-mode pooler)")
	f.Duration(&pollInterval, "poll-interval", "FF_LEASE_HISTORY_POLL_INTERVAL", leasehistory.DefaultPollInterval, "how often --poll reads")
	f.Duration(&gapWait, "gap-wait", "FF_LEASE_HISTORY_GAP_WAIT", leasehistory.DefaultGapWait,
		"longest wait at a missing event id whose transaction cannot be shown to have ended")
	if err := f.parse(args, stdout); err != nil {
		return err
	}

	tagValue := ""
	if instanceTag != "" {
		k, v, err := store.ParseInstanceTag(instanceTag)
		if err != nil {
			return usageError{err}
		}
		if k != store.InstanceTagKey {
			return badUsage("--instance-tag %s: lease events record only the %s tag (--instance-tag %s=VALUE)", instanceTag, store.InstanceTagKey, store.InstanceTagKey)
		}
		tagValue = v
	}
	opts := leasehistory.Options{
		Namespace:        namespace,
		InstanceTag:      tagValue,
		Logger:           logger,
		Poll:             poll,
		PollInterval:     pollInterval,
		GapWait:          gapWait,
		StopWhenCaughtUp: !follow,
	}
	partitions, err := parseLeaseHistoryPartitions(partitionArgs)
	if err != nil {
		return err
	}
	if len(partitions) > 0 && allPartitions {
		return badUsage("--partition and --all-partitions cannot be used together")
	}
	opts.Partitions = partitions
	if format != "text" && format != "json" {
		return badUsage("--format must be text or json, got %q", format)
	}
	if pollInterval <= 0 {
		return badUsage("--poll-interval must be positive, got %s", pollInterval)
	}
	if gapWait <= 0 {
		return badUsage("--gap-wait must be positive, got %s", gapWait)
	}
	opts.Cursor, err = leasehistory.ParseCursor(cursorText)
	if err != nil {
		return badUsage("--cursor: %w", err)
	}
	opts.AcceptTrimmed = acceptTrimmed
	if opts.Cursor.IsZero() && !follow {
		// A one-shot read prints the whole history: what outbox retention
		// left of it, said on stderr.
		opts.Cursor = leasehistory.EncodeCursor(0)
		opts.AcceptTrimmed = true
	}
	if dsn == "" {
		dsn = dbconn.DefaultURL
	}
	if err := dbconn.Validate(dsn); err != nil {
		return usageError{err}
	}

	pool, err := dbconn.Open(ctx, dsn, dbconn.Options{MaxConns: 4, AppName: "ffreconcile-lease-history"})
	if err != nil {
		return err
	}
	defer pool.Close()

	// An unmigrated database fails with what to run, as the other
	// commands do, not with the first query's "relation does not exist".
	if err := migrations.Check(ctx, pool, "ff_lease_event"); err != nil {
		return dbconn.Scrub(err, dsn)
	}
	sub, err := leasehistory.Subscribe(ctx, pool, opts)
	if err != nil {
		return dbconn.Scrub(err, dsn)
	}
	defer sub.Close()

	out := bufio.NewWriter(stdout)
	for ev := range sub.Events() {
		if ev.Type == leasehistory.EventDisconnected {
			continue // logged by the subscription, which reconnects by itself
		}
		if ev.Type == leasehistory.EventTrimmed {
			if err := out.Flush(); err != nil {
				return fmt.Errorf("write output: %w", err)
			}
			fmt.Fprintf(stderr, "lease-history: events after cursor %s through event id %d may have been deleted by outbox retention\n", ev.Cursor, ev.EventID)
			continue
		}
		if err := writeLeaseEvent(out, format, &ev); err != nil {
			return fmt.Errorf("write output: %w", err)
		}
		// Following: show each event as it comes. A one-shot read flushes
		// when the buffer fills and at the end.
		if follow {
			if err := out.Flush(); err != nil {
				return fmt.Errorf("write output: %w", err)
			}
		}
	}
	if err := out.Flush(); err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	if err := sub.Err(); err != nil {
		return dbconn.Scrub(err, dsn)
	}
	// The position may be past the last printed event when trailing events
	// were filtered out.
	fmt.Fprintf(stderr, "lease-history: resume with --cursor %s\n", sub.Cursor())
	return nil
}

// parseLeaseHistoryPartitions reads repeatable, comma-separated partition
// numbers; none means all partitions.
func parseLeaseHistoryPartitions(args []string) ([]int, error) {
	var partitions []int
	for _, arg := range args {
		for _, s := range strings.Split(arg, ",") {
			s = strings.TrimSpace(s)
			if s == "" {
				continue
			}
			p, err := strconv.Atoi(s)
			if err != nil {
				return nil, badUsage("--partition %q is not a whole number", s)
			}
			if p < 0 || p >= leasehistory.NumPartitions {
				return nil, badUsage("--partition %d is out of range 0..%d", p, leasehistory.NumPartitions-1)
			}
			partitions = append(partitions, p)
		}
	}
	return partitions, nil
}

// leaseEventJSON is the --format json line. Absent values are null.
type leaseEventJSON struct {
	EventID      int64   `json:"event_id"`
	Type         string  `json:"type"`
	ExecutionID  string  `json:"execution_id"`
	Partition    int     `json:"partition"`
	OccurredAtMs int64   `json:"occurred_at_ms"`
	OccurredAt   string  `json:"occurred_at"`
	Namespace    *string `json:"namespace"`
	InstanceTag  *string `json:"instance_tag"`
	LeaseID      *string `json:"lease_id"`
	Cursor       string  `json:"cursor"`
}

const rfc3339Millis = "2006-01-02T15:04:05.000Z07:00"

func writeLeaseEvent(w io.Writer, format string, ev *leasehistory.Event) error {
	at := ev.OccurredAt.UTC().Format(rfc3339Millis)
	if format == "json" {
		line, err := json.Marshal(leaseEventJSON{
			EventID:      ev.EventID,
			Type:         string(ev.Type),
			ExecutionID:  ev.ExecutionID,
			Partition:    ev.Partition,
			OccurredAtMs: ev.OccurredAtMs,
			OccurredAt:   at,
			Namespace:    nullIfEmpty(ev.Namespace),
			InstanceTag:  nullIfEmpty(ev.InstanceTag),
			LeaseID:      nullIfEmpty(ev.LeaseID),
			Cursor:       ev.Cursor.String(),
		})
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", line)
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s  %-9s  %s  partition=%d event_id=%d", at, ev.Type, ev.ExecutionID, ev.Partition, ev.EventID)
	for _, kv := range []struct{ k, v string }{
		{"namespace", ev.Namespace}, {"instance_tag", ev.InstanceTag}, {"lease_id", ev.LeaseID},
	} {
		if kv.v != "" {
			fmt.Fprintf(&b, " %s=%s", kv.k, strconv.Quote(kv.v))
		}
	}
	fmt.Fprintf(&b, " cursor=%s\n", ev.Cursor)
	_, err := io.WriteString(w, b.String())
	return err
}

func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
