package jobs

import "fmt"

// ScanArgs are the args of every partition scan, embedded in each
// reconciler's scan args type (which gives it its kind). Their JSON:
//
//	{"partition": 7, "after": {"at_ms": …, "id": "…", "id2": "…", "n": 0}, "follows": 123}
//
// with after only on continuations and look-ahead scans and follows only on
// follow-ups. A scan is unique by partition and follows among unfinished
// jobs.
type ScanArgs struct {
	// Partition is the partition to scan.
	Partition int16 `json:"partition" river:"unique"`
	// After, when set, starts the scan after this row (see ScanCursor).
	After *ScanCursor `json:"after,omitempty"`
	// Follows is the id of the partition's scan that had already started
	// when a tick wanted the partition scanned again (0: none); see
	// "Follow-up scans" in the package doc.
	Follows int64 `json:"follows,omitempty" river:"unique"`
}

// Validate implements Validator.
func (a ScanArgs) Validate() error {
	if err := ValidatePartition(int(a.Partition)); err != nil {
		return err
	}
	if a.Follows < 0 {
		return fmt.Errorf("follows %d is not a job id", a.Follows)
	}
	return nil
}

// ScanCursor continues a partition scan after the last row of a full batch,
// in the scan's order (deadline, then row key), so a backlog larger than one
// batch drains without waiting for the next tick. A tick also starts the scan
// of a partition whose due rows are all still queued after them (at_ms: the
// tick's now − 1, the largest ids), so it enqueues only rows falling due
// later.
type ScanCursor struct {
	AtMs int64  `json:"at_ms"`         // deadline of the last row
	ID   string `json:"id"`            // the row's id: execution, flow (cancel groups), waitpoint, budget, namespace (workers)
	ID2  string `json:"id2,omitempty"` // the second key column: downstream_eid for cancel groups, worker_instance_id for workers
	N    int32  `json:"n,omitempty"`   // attempt_index for attempts
}
