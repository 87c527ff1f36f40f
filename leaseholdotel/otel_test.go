package leaseholdotel_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/leaseholdotel"
)

type report struct {
	Month string `json:"month"`
}

func (report) Kind() string { return "report" }

// freshDatabase is a migrated database of the test's own on DATABASE_URL's
// server, dropped at the end.
func freshDatabase(t *testing.T) *pgxpool.Pool {
	t.Helper()
	base := os.Getenv("DATABASE_URL")
	if base == "" {
		t.Fatal("these tests need a PostgreSQL: set DATABASE_URL (go run ./cmd/leasehold localdb prints one)")
	}
	admin, err := pgx.Connect(t.Context(), base)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "otel_test_" + hex.EncodeToString(b[:])
	if _, err := admin.Exec(t.Context(), "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	pool, err := pgxpool.New(t.Context(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		if conn, err := pgx.Connect(context.Background(), base); err == nil {
			_, _ = conn.Exec(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)")
			_ = conn.Close(context.Background())
		}
	})
	if _, err := leasehold.Migrate(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	return pool
}

// TestSpansLinkedThroughTheTask: an insert makes a producer span, child of
// the caller's; the attempt a worker runs makes a consumer span that links
// to the insert's, and the worker's context carries it.
func TestSpansLinkedThroughTheTask(t *testing.T) {
	pool := freshDatabase(t)
	recorder := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	workSpan := make(chan trace.SpanContext, 1)
	workers := leasehold.NewWorkers()
	if err := leasehold.AddWorker(workers, leasehold.WorkFunc(func(ctx context.Context, _ *leasehold.Task[report]) error {
		workSpan <- trace.SpanContextFromContext(ctx)
		return nil
	}), leasehold.KindConfig{}); err != nil {
		t.Fatal(err)
	}
	client, err := leasehold.NewClient(pool, leasehold.Config{
		Workers:    workers,
		Middleware: []leasehold.Middleware{leaseholdotel.Middleware(&leaseholdotel.Options{TracerProvider: tp})},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer client.Stop(context.Background()) //nolint:errcheck // the test's end

	ctx, request := tp.Tracer("test").Start(t.Context(), "POST /reports")
	res, err := client.Insert(ctx, report{Month: "2026-11"}, nil)
	request.End()
	if err != nil {
		t.Fatal(err)
	}
	var inWork trace.SpanContext
	select {
	case inWork = <-workSpan:
	case <-time.After(time.Minute):
		t.Fatal("the worker did not run within a minute")
	}
	wctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := client.WaitTask(wctx, res.Task.ID); err != nil {
		t.Fatal(err)
	}
	if err := client.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}

	var insert, work sdktrace.ReadOnlySpan
	for _, s := range recorder.Ended() {
		switch s.Name() {
		case "leasehold.insert report":
			insert = s
		case "leasehold.work report":
			work = s
		}
	}
	if insert == nil || work == nil {
		t.Fatalf("spans ended: %d; want an insert span and a work span", len(recorder.Ended()))
	}
	if insert.SpanKind() != trace.SpanKindProducer || insert.Parent().SpanID() != request.SpanContext().SpanID() {
		t.Errorf("the insert span: kind %s, parent %s; want a producer, child of the request's span", insert.SpanKind(), insert.Parent().SpanID())
	}
	if work.SpanKind() != trace.SpanKindConsumer || len(work.Links()) != 1 || work.Links()[0].SpanContext.SpanID() != insert.SpanContext().SpanID() {
		t.Errorf("the work span: kind %s, links %v; want a consumer linked to the insert's span", work.SpanKind(), work.Links())
	}
	if inWork.SpanID() != work.SpanContext().SpanID() {
		t.Errorf("the worker's context carries span %s; want the work span %s", inWork.SpanID(), work.SpanContext().SpanID())
	}
}
