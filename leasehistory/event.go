package leasehistory

import (
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/flowfabric/ffreconcile/store"
)

// EventType is the kind of a lease history event.
type EventType string

// Lease event types, as FlowFabric writes them to ff_lease_event.event_type.
const (
	EventAcquired  EventType = "acquired"
	EventRenewed   EventType = "renewed"
	EventExpired   EventType = "expired"
	EventReclaimed EventType = "reclaimed"
	EventRevoked   EventType = "revoked"

	// EventDisconnected is not a lease event: it tells the consumer that the
	// subscription lost its database connection (Event.Err says why) and is
	// reconnecting. Only Err and Cursor are set; the stream resumes after
	// Cursor, so nothing is lost or repeated.
	EventDisconnected EventType = "disconnected"
)

func parseEventType(s string) (EventType, bool) {
	switch t := EventType(s); t {
	case EventAcquired, EventRenewed, EventExpired, EventReclaimed, EventRevoked:
		return t, true
	}
	return "", false
}

// Event is one lease history event.
type Event struct {
	// Type is the lease event type, or EventDisconnected.
	Type EventType
	// EventID is the ff_lease_event.event_id.
	EventID int64
	// ExecutionID is in FlowFabric form, {fp:N}:<uuid> with N the partition.
	ExecutionID string
	// Partition is the execution's flow partition, 0..255.
	Partition int
	// LeaseID is the lease id, "" when none was recorded (always so on
	// FlowFabric's Postgres backend today).
	LeaseID string
	// OccurredAt is when the event happened; OccurredAtMs is the same in
	// epoch milliseconds, as stored.
	OccurredAt   time.Time
	OccurredAtMs int64
	// Namespace and InstanceTag are the execution's namespace and the value
	// of its cairn.instance_id tag, "" when not recorded (NULL).
	Namespace   string
	InstanceTag string
	// Cursor is the position just after this event: persist it once the
	// event is handled, and subscribe from it to resume.
	Cursor Cursor
	// Err is set on EventDisconnected only.
	Err error
}

// filter is the in-memory form of FlowFabric's ScannerFilter, applied to the
// outbox row's denormalised columns.
type filter struct {
	partitions  *[256]bool // nil: all
	namespace   string     // "": any
	instanceTag string     // "": any
}

// passes mirrors FlowFabric's passes_filter: namespace compares exactly,
// instance_tag compares the tag value, and a NULL column never matches a set
// filter.
func (f *filter) passes(row *store.LeaseEvent) bool {
	if f.partitions != nil && (row.PartitionKey < 0 || row.PartitionKey > 255 || !f.partitions[row.PartitionKey]) {
		return false
	}
	if f.namespace != "" && (row.Namespace == nil || *row.Namespace != f.namespace) {
		return false
	}
	if f.instanceTag != "" && (row.InstanceTag == nil || *row.InstanceTag != f.instanceTag) {
		return false
	}
	return true
}

// toEvent converts a stored row; it fails for rows FlowFabric would skip (an
// unknown event type or an execution id that is not a UUID).
func toEvent(row *store.LeaseEvent) (Event, error) {
	typ, ok := parseEventType(row.EventType)
	if !ok {
		return Event{}, fmt.Errorf("unknown event type %q", row.EventType)
	}
	// Any form FlowFabric's Uuid::parse_str takes: hyphenated, 32 hex
	// digits, braced, urn:uuid:.
	id, err := uuid.Parse(row.ExecutionID)
	if err != nil {
		return Event{}, fmt.Errorf("execution id %q is not a UUID", row.ExecutionID)
	}
	ev := Event{
		Type:         typ,
		EventID:      row.EventID,
		ExecutionID:  fmt.Sprintf("{fp:%d}:%s", row.PartitionKey, id),
		Partition:    int(row.PartitionKey),
		OccurredAt:   time.UnixMilli(row.OccurredAtMs).UTC(),
		OccurredAtMs: row.OccurredAtMs,
		Cursor:       EncodeCursor(row.EventID),
	}
	if row.LeaseID != nil {
		ev.LeaseID = *row.LeaseID
	}
	if row.Namespace != nil {
		ev.Namespace = *row.Namespace
	}
	if row.InstanceTag != nil {
		ev.InstanceTag = *row.InstanceTag
	}
	return ev, nil
}
