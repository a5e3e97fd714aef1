package jobs

import "fmt"

// Sibling-cancel dispatch and its reconciler both act on pending cancel
// groups, so their row jobs share one args shape.

// CancelGroupArgs identifies one pending cancel group (an edge group): the
// args of both the dispatch and the reconcile row jobs.
type CancelGroupArgs struct {
	Partition     int16  `json:"partition" river:"unique"`
	FlowID        string `json:"flow_id" river:"unique"`
	DownstreamEID string `json:"downstream_eid" river:"unique"`
}

// Validate implements Validator.
func (a CancelGroupArgs) Validate() error {
	if err := validateRow(a.Partition, "flow_id", a.FlowID); err != nil {
		return err
	}
	if _, err := ParseUUID(a.DownstreamEID); err != nil {
		return fmt.Errorf("downstream_eid: %w", err)
	}
	return nil
}
