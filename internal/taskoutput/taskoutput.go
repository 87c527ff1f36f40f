// Package taskoutput carries the output a task's Work records
// (leasehold.RecordOutput) from Work to whoever ran it: the client's
// workers, or a test's leaseholdtest.Work.
package taskoutput

import (
	"context"
	"encoding/json"
)

type key struct{}

// Slot holds the output recorded so far.
type Slot struct{ Out json.RawMessage }

// With returns ctx with a new slot, and the slot.
func With(ctx context.Context) (context.Context, *Slot) {
	s := &Slot{}
	return context.WithValue(ctx, key{}, s), s
}

// From returns ctx's slot, if it has one.
func From(ctx context.Context) (*Slot, bool) {
	s, ok := ctx.Value(key{}).(*Slot)
	return s, ok
}
