package server_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/leasestore"

	"github.com/rs/zerolog"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
	"github.com/leasehold/leasehold/internal/server"
)

// BenchmarkAcquireReleaseREST runs acquire+release cycles over REST, each
// client on a resource of its own: one op is one cycle (two commits).
// -cpu sets the concurrency with GOMAXPROCS; the clients number 4 × that.
//
//	go test -run '^$' -bench AcquireReleaseREST -cpu 2 ./internal/server/   # 8 clients
func BenchmarkAcquireReleaseREST(b *testing.B) {
	tdb := pgtest.New(b)
	srv := httptest.NewServer(server.NewServer(server.Deps{
		Leases:     leasestore.NewStore(tdb.Pool),
		DefaultTTL: 30 * time.Second,
		Log:        zerolog.Nop(),
		Metrics:    server.NewMetrics(func() bool { return true }, func() int64 { return 0 }),
		Ready:      func(context.Context) error { return nil },
	}))
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	do := func(method, body string, want int) error {
		req, err := http.NewRequest(method, srv.URL+map[string]string{"POST": "/api/leases", "DELETE": "/api/leases/release"}[method], bytes.NewBufferString(body))
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			return fmt.Errorf("%s: status %d, want %d", method, resp.StatusCode, want)
		}
		return nil
	}
	var next atomic.Int64
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		body := fmt.Sprintf(`{"resource":"bench:%d","holder":"h"}`, next.Add(1))
		for pb.Next() {
			if err := do("POST", body, http.StatusCreated); err != nil {
				b.Error(err)
				return
			}
			if err := do("DELETE", body, http.StatusOK); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
}
