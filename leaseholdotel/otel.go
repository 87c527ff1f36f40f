// Package leaseholdotel traces leasehold's tasks with OpenTelemetry: a
// span for each insert (a producer's) and one for each attempt a worker
// runs (a consumer's), linked through the task: the insert's trace context
// travels in the task's metadata (W3C traceparent), and the attempt's span
// links to it. It is a module of its own, so that a program that does not
// trace does not import OpenTelemetry.
//
//	client, err := leasehold.NewClient(pool, leasehold.Config{
//		Workers:    workers,
//		Middleware: []leasehold.Middleware{leaseholdotel.Middleware(nil)},
//	})
package leaseholdotel

import (
	"context"
	"errors"
	"strconv"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/worker"
	"github.com/leasehold/leasehold/task"
)

// Options configure Middleware; the zero value takes the global tracer
// provider and the W3C trace context.
type Options struct {
	// TracerProvider makes the spans (nil: otel.GetTracerProvider()).
	TracerProvider trace.TracerProvider
	// Propagator writes and reads the trace context in a task's metadata
	// (nil: propagation.TraceContext{}).
	Propagator propagation.TextMapPropagator
}

// instrumentation is the tracer's name.
const instrumentation = "github.com/leasehold/leasehold/leaseholdotel"

// Attribute keys of the spans, besides OpenTelemetry's messaging ones.
const (
	AttrTaskID      = attribute.Key("leasehold.task.id")
	AttrTaskKind    = attribute.Key("leasehold.task.kind")
	AttrTaskAttempt = attribute.Key("leasehold.task.attempt")
	AttrTaskFence   = attribute.Key("leasehold.task.fence")
	AttrTaskCount   = attribute.Key("leasehold.tasks")
	// AttrOutcome is set on an attempt that snoozed or was cancelled by its
	// worker: neither is a failure.
	AttrOutcome = attribute.Key("leasehold.task.outcome")
)

// Middleware returns the middleware that traces a client's inserts and
// attempts (opts nil: the defaults).
func Middleware(opts *Options) leasehold.Middleware {
	var o Options
	if opts != nil {
		o = *opts
	}
	tp := o.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	prop := o.Propagator
	if prop == nil {
		prop = propagation.TraceContext{}
	}
	tracer := tp.Tracer(instrumentation)
	return leasehold.Middleware{
		Insert: func(ctx context.Context, tasks []*leasehold.InsertingTask, next func(context.Context) error) error {
			name := "leasehold.insert"
			attrs := []attribute.KeyValue{
				attribute.String("messaging.system", "leasehold"), attribute.String("messaging.operation.type", "send"),
				AttrTaskCount.Int(len(tasks)),
			}
			// Named after the batch's kind and queue when it has one of each.
			if kind, queue, one := alike(tasks); one {
				name += " " + kind
				attrs = append(attrs, AttrTaskKind.String(kind), attribute.String("messaging.destination.name", queue))
			}
			ctx, span := tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
			defer span.End()
			for _, t := range tasks {
				prop.Inject(ctx, propagation.MapCarrier(t.Metadata))
			}
			err := next(ctx)
			if err != nil {
				span.RecordError(err)
				span.SetStatus(codes.Error, err.Error())
			}
			return err
		},
		Work: func(ctx context.Context, t *task.Task, next func(context.Context) error) error {
			opts := []trace.SpanStartOption{
				trace.WithSpanKind(trace.SpanKindConsumer),
				trace.WithAttributes(
					attribute.String("messaging.system", "leasehold"), attribute.String("messaging.operation.type", "process"),
					attribute.String("messaging.destination.name", t.Queue), attribute.String("messaging.message.id", strconv.FormatInt(t.ID, 10)),
					AttrTaskID.Int64(t.ID), AttrTaskKind.String(t.Kind), AttrTaskAttempt.Int(int(t.Attempts)), AttrTaskFence.Int64(t.Fence),
				),
			}
			// The insert's span, when the task carries it: a link, since an
			// attempt may run long after the insert's trace ended, and more
			// than once.
			if sc := trace.SpanContextFromContext(prop.Extract(context.Background(), propagation.MapCarrier(t.Metadata))); sc.IsValid() {
				opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
			}
			ctx, span := tracer.Start(ctx, "leasehold.work "+t.Kind, opts...)
			defer span.End()
			err := next(ctx)
			var snooze *worker.SnoozeError
			var cancel *worker.CancelError
			switch {
			case err == nil:
			case errors.As(err, &snooze):
				// Asked to run again later: no failure.
				span.SetAttributes(AttrOutcome.String("snoozed"))
			case errors.As(err, &cancel):
				// Given up on by its worker, on purpose: no failure either.
				span.SetAttributes(AttrOutcome.String("cancelled"))
			default:
				span.RecordError(err)
				span.SetStatus(codes.Error, err.Error())
			}
			return err
		},
	}
}

// alike returns the kind and queue of tasks when they all share them.
func alike(tasks []*leasehold.InsertingTask) (kind, queue string, one bool) {
	if len(tasks) == 0 {
		return "", "", false
	}
	for _, t := range tasks[1:] {
		if t.Kind != tasks[0].Kind || t.Queue != tasks[0].Queue {
			return "", "", false
		}
	}
	return tasks[0].Kind, tasks[0].Queue, true
}
