package server

import (
	"context"
	"net/http"
)

// generatorStatus is the answer of GET /api/generator: the cluster-wide
// switch, the replica holding the generator lease (null when none does)
// with its fence, and the replica that answered.
type generatorStatus struct {
	Status       string  `json:"status"`
	Holder       *string `json:"holder"`
	Fence        *int64  `json:"fence"`
	ThisInstance string  `json:"this_instance"`
}

func readGeneratorStatus(ctx context.Context, d Deps) (generatorStatus, error) {
	s, err := d.Generator.Get(ctx)
	if err != nil {
		return generatorStatus{}, err
	}
	return generatorStatus{Status: s.Switch(), Holder: s.Holder, Fence: s.Fence, ThisInstance: d.Instance.ID}, nil
}

func handleGeneratorGet(d Deps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g, err := readGeneratorStatus(r.Context(), d)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		encode(w, http.StatusOK, g)
	})
}

// handleGeneratorSet serves POST /api/generator/start and /stop: 202 and
// the status. The switch lives in the database, so every replica's
// generator hears of it (NOTIFY) whichever replica was asked. The body
// says nothing and is ignored, but is held to the 1 MiB of every body.
func handleGeneratorSet(d Deps, started bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := discardBody(w, r); err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		if err := d.Generator.Set(r.Context(), started, d.Instance.ID); err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		g, err := readGeneratorStatus(r.Context(), d)
		if err != nil {
			writeError(w, r, d.Log, err)
			return
		}
		encode(w, http.StatusAccepted, g)
	})
}
