package chaos

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// TestPhaseEnds drives the end of a soak's load and faults without a
// cluster: the duration passing with the forced faults in or not, the max
// duration running out, the soak's context ending first, and a forced
// fault begun in time but finished after the max duration.
func TestPhaseEnds(t *testing.T) {
	t.Parallel()
	newSoak := func() *soak {
		return &soak{log: zerolog.Nop(), opts: Options{
			Duration: 10 * time.Millisecond, MaxDuration: 50 * time.Millisecond, Forced: []Kind{KindKill, KindTerm},
		}}
	}
	t.Run("forced in before the duration", func(t *testing.T) {
		t.Parallel()
		s := newSoak()
		phase, end := context.WithTimeout(t.Context(), time.Minute)
		forcedIn := make(chan struct{})
		close(forcedIn)
		if ranOut := s.endPhase(phase, end, forcedIn); ranOut {
			t.Error("ranOut with every forced fault in; want false")
		}
		if phase.Err() == nil {
			t.Error("the phase goes on after endPhase returned; want it ended")
		}
	})
	t.Run("forced in after the duration", func(t *testing.T) {
		t.Parallel()
		s := newSoak()
		phase, end := context.WithTimeout(t.Context(), time.Minute)
		forcedIn := make(chan struct{})
		time.AfterFunc(3*s.opts.Duration, func() { close(forcedIn) })
		if ranOut := s.endPhase(phase, end, forcedIn); ranOut {
			t.Error("ranOut with the forced faults in before the max duration; want false")
		}
		select {
		case <-forcedIn:
		default:
			t.Error("endPhase returned before the forced faults were in")
		}
	})
	t.Run("the max duration runs out", func(t *testing.T) {
		t.Parallel()
		s := newSoak()
		phase, end := context.WithTimeout(t.Context(), s.opts.MaxDuration)
		forcedIn := make(chan struct{})
		if ranOut := s.endPhase(phase, end, forcedIn); !ranOut {
			t.Fatal("not ranOut with the forced faults never in; want true")
		}
		s.forcedMissed(forcedIn)
		if len(s.report.Problems) != 1 || !strings.Contains(s.report.Problems[0], "kill,term") {
			t.Errorf("problems %q; want one naming the forced faults", s.report.Problems)
		}
	})
	t.Run("a forced fault begun in time ends after the max duration", func(t *testing.T) {
		t.Parallel()
		s := newSoak()
		phase, end := context.WithTimeout(t.Context(), s.opts.MaxDuration)
		forcedIn := make(chan struct{})
		if ranOut := s.endPhase(phase, end, forcedIn); !ranOut {
			t.Fatal("not ranOut; want true")
		}
		close(forcedIn) // the fault under way finished: the soak waits for it before judging
		s.forcedMissed(forcedIn)
		if len(s.report.Problems) != 0 {
			t.Errorf("problems %q; want none: the last forced fault began within the max duration", s.report.Problems)
		}
	})
	t.Run("the soak's context ends first", func(t *testing.T) {
		t.Parallel()
		s := newSoak()
		ctx, cancel := context.WithCancel(t.Context())
		phase, end := context.WithTimeout(ctx, time.Minute)
		cancel()
		if ranOut := s.endPhase(phase, end, make(chan struct{})); ranOut {
			t.Error("ranOut after an interruption; want false: nothing ran out")
		}
	})
}
