package jobs

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/google/uuid"
)

// PartitionCount is the number of FlowFabric flow partitions; valid
// partitions are 0 through PartitionCount-1.
const PartitionCount = 256

// ValidatePartition reports whether p is a FlowFabric partition.
func ValidatePartition(p int) error {
	if p < 0 || p >= PartitionCount {
		return fmt.Errorf("partition %d is out of range 0..%d", p, PartitionCount-1)
	}
	return nil
}

// ParseUUID checks that s is a UUID in its canonical 36-character form
// (8-4-4-4-12 hex digits, either case) and returns it in lower case, the form
// Postgres prints. Job args take that form only; stored data is read with
// uuid.Parse, which also takes the braced, urn: and 32-digit forms, as
// FlowFabric's Uuid::parse_str does.
func ParseUUID(s string) (string, error) {
	u, err := uuid.Parse(s)
	if err != nil || len(s) != 36 {
		return "", fmt.Errorf("%q is not a UUID (want 8-4-4-4-12 hex digits)", s)
	}
	return u.String(), nil
}

// ExecutionID is a FlowFabric execution: its flow partition and UUID.
type ExecutionID struct {
	Partition int16
	UUID      string // canonical lower-case form
}

// String returns FlowFabric's form, `{fp:N}:<uuid>`.
func (e ExecutionID) String() string {
	return "{fp:" + strconv.Itoa(int(e.Partition)) + "}:" + e.UUID
}

// ParseExecutionID parses FlowFabric's execution id form `{fp:N}:<uuid>`.
func ParseExecutionID(s string) (ExecutionID, error) {
	rest, ok := strings.CutPrefix(s, "{fp:")
	if !ok {
		return ExecutionID{}, fmt.Errorf("execution id %q: want the form {fp:N}:<uuid>", s)
	}
	num, id, ok := strings.Cut(rest, "}:")
	if !ok {
		return ExecutionID{}, fmt.Errorf("execution id %q: want the form {fp:N}:<uuid>", s)
	}
	if num == "" || len(num) > 3 || strings.TrimLeft(num, "0123456789") != "" {
		return ExecutionID{}, fmt.Errorf("execution id %q: partition %q is not a number", s, num)
	}
	p, _ := strconv.Atoi(num)
	if err := ValidatePartition(p); err != nil {
		return ExecutionID{}, fmt.Errorf("execution id %q: %w", s, err)
	}
	u, err := ParseUUID(id)
	if err != nil {
		return ExecutionID{}, fmt.Errorf("execution id %q: %w", s, err)
	}
	return ExecutionID{Partition: int16(p), UUID: u}, nil
}
