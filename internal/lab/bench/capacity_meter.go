package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// sampleEvery is how often the meter samples pg_stat_activity.
const sampleEvery = 10 * time.Millisecond

// readEvery is how many samples pass between two readings of the CPU time of every
// process the meter attributes to the workload. A process alive at stop is read then, and
// the time of one that exits is counted whole from the postmaster's (stop), so these
// readings only tell, as far as they go, which database an exited process's time was for. Reading each at
// every sample cost the meter's own process a file read per server process: with a
// Client's hundred sessions, a tenth of a 2-core machine, taken from the workload it
// measured.
const readEvery = 100

// startMeter opens every connection of d's pool, so that no window pays for a session's
// start (a fork, PrepareSession), which a running replica paid long ago, and starts a
// meter on d.
func startMeter(ctx context.Context, d *freshDB) (*meter, error) {
	conns := make([]*pgxpool.Conn, 0, d.Pool.Config().MaxConns)
	for range cap(conns) {
		conn, err := d.Pool.Acquire(ctx)
		if err != nil {
			for _, c := range conns {
				c.Release()
			}
			return nil, err
		}
		conns = append(conns, conn)
	}
	for _, conn := range conns {
		conn.Release()
	}
	m, err := newMeter(ctx, d)
	if err != nil {
		return nil, err
	}
	if err := m.start(ctx); err != nil {
		m.close(ctx)
		return nil, err
	}
	return m, nil
}

// meter measures what PostgreSQL spends on a workload between start and stop: the CPU
// time of its processes (when it runs on this machine), the WAL it writes, the transactions
// that wrote, and how many of the scenario's sessions are active at once, sampled every
// sampleEvery on a session of its own, which it leaves out of every figure.
//
// The CPU time is the workload's: that of the processes of the scenario's database (its
// sessions, and autovacuum's workers on it) and of PostgreSQL's shared processes (the WAL
// writer, the checkpointer, the postmaster…), each from its reading at start (or its birth)
// to stop, or to its exit for one that exited (the postmaster's time for the children it
// reaped holds theirs). Other databases' sessions on the same server are left out, and
// their CPU time is reported beside it, as is the whole server's (the postmaster and all
// its children, reaped ones included).
type meter struct {
	conn     *pgx.Conn
	pid      int      // conn's backend
	pg       *pgProcs // nil when not on this machine
	notLocal string   // why pg is nil

	startAt     time.Time
	lsnStart    string
	xidStart    int64
	checkpoints int64
	wholeStart  int64 // ticks of the whole tree
	ownStart    int64 // of the postmaster itself
	reapedStart int64 // of the children the postmaster had reaped
	stopSampler func() samples
}

// procClass is whose work a process of the server does.
type procClass int

const (
	classShared procClass = iota // PostgreSQL's own processes, which every database's work keeps busy
	classOurs                    // a process of the scenario's database
	classOther                   // another database's
)

// tracked is one process of the server as the meter saw it: CPU ticks at its first and
// latest readings.
type tracked struct {
	class       procClass
	first, last int64
}

// samples are what the sampler saw.
type samples struct {
	n           int // samples taken
	peak        int
	sum         int // of the scenario's active sessions over the samples, for the mean
	otherActive int // samples in which another database's session was active
	procs       map[int]*tracked
	err         error
}

// window is what one workload cost.
type window struct {
	elapsed  time.Duration
	notLocal string
	cpu      time.Duration // the workload's; 0 when not measured
	ours     time.Duration // of which the scenario database's processes
	others   time.Duration // other databases' processes, alive at stop (left out of cpu)
	whole    time.Duration // the whole server's
	wal      float64       // bytes
	ckpts    int64         // checkpoints begun meanwhile
	xacts    int64         // transactions that wrote (were given an id) meanwhile
	samples
}

func newMeter(ctx context.Context, d *freshDB) (*meter, error) {
	conn, err := pgx.Connect(ctx, d.URL)
	if err != nil {
		return nil, fmt.Errorf("connect the meter's session: %w", err)
	}
	m := &meter{conn: conn}
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&m.pid); err != nil {
		m.close(ctx)
		return nil, err
	}
	// Superusers and members of pg_read_all_settings may read it; for others the server
	// is found without.
	var dataDir string
	if err := conn.QueryRow(ctx, "SELECT current_setting('data_directory')").Scan(&dataDir); err != nil {
		dataDir = ""
	}
	m.pg, m.notLocal = findServer(m.pid, conn.Config().Database, dataDir)
	return m, nil
}

func (m *meter) close(ctx context.Context) { _ = m.conn.Close(context.WithoutCancel(ctx)) }

// nextXID is the transaction id the server will give next, read without taking one: the
// ids given between two readings are the transactions that wrote (a read-only one gets none).
const nextXID = `pg_snapshot_xmax(pg_current_snapshot())::text::int8`

// start takes the first readings and starts the sampler.
func (m *meter) start(ctx context.Context) error {
	err := m.conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text, `+nextXID+`, checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter`).
		Scan(&m.lsnStart, &m.xidStart, &m.checkpoints)
	if err != nil {
		return fmt.Errorf("read the WAL position (pg_current_wal_lsn): %w", err)
	}
	procs := map[int]*tracked{}
	if m.pg != nil {
		// Every process there is now, read before they are classified: one that starts
		// between the two is then taken as born in the window, a few ticks early.
		children, pm, whole, err := m.pg.tree()
		if err != nil {
			return err
		}
		m.wholeStart = whole
		m.ownStart, m.reapedStart = pm.UTime+pm.STime, pm.CUTime+pm.CSTime
		for pid, ticks := range children {
			procs[pid] = &tracked{class: classShared, first: ticks, last: ticks}
		}
		if _, _, err := m.classify(ctx, procs, 0); err != nil {
			return err
		}
	}
	m.startAt = time.Now()
	m.stopSampler = m.sample(ctx, procs)
	return nil
}

// classify reads pg_stat_activity as sample n: it sets the class of each process of procs
// that it lists (adding those born since, with no ticks before), reads the CPU time of the
// workload's (each one new, and all of them every readEvery samples), and returns how many
// of the scenario's client sessions and of other databases' were active.
func (m *meter) classify(ctx context.Context, procs map[int]*tracked, n int) (ours, others int, err error) {
	// Every column may be NULL: a background process has no database, and a client backend
	// still authenticating has neither a database nor a state yet (other tests connect while the
	// meter samples).
	rows, err := m.conn.Query(ctx, `
		SELECT pid, coalesce(datname = current_database(), false),
		       coalesce(datname <> current_database(), false),
		       coalesce(backend_type = 'client backend' AND state <> 'idle', false)
		FROM pg_stat_activity WHERE pid <> pg_backend_pid()`)
	if err != nil {
		return 0, 0, fmt.Errorf("sample pg_stat_activity: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var pid int
		var mine, other, active bool
		if err := rows.Scan(&pid, &mine, &other, &active); err != nil {
			return 0, 0, err
		}
		switch {
		case mine && active:
			ours++
		case other && active:
			others++
		}
		if m.pg == nil {
			continue
		}
		p := procs[pid]
		fresh := p == nil
		if fresh {
			p = &tracked{} // born since the window opened: all its time is the window's
			procs[pid] = p
		}
		switch {
		case mine:
			p.class = classOurs
		case other:
			p.class = classOther
		}
		if fresh || n%readEvery == 0 {
			m.read(pid, p)
		}
	}
	return ours, others, rows.Err()
}

// read brings p, process pid, up to its CPU time now, unless it is another database's.
func (m *meter) read(pid int, p *tracked) {
	if p.class == classOther {
		return
	}
	if ticks, ok := m.pg.ticksOf(pid); ok {
		p.last = max(p.last, ticks)
	}
}

// sample classifies and counts every sampleEvery until the function it returns is called,
// which returns what it saw. It is stopped between samples, never by cancelling one: pgx
// closes a connection whose query is cancelled, and the meter reads on after.
func (m *meter) sample(ctx context.Context, procs map[int]*tracked) func() samples {
	stop := make(chan struct{})
	done := make(chan samples, 1)
	go func() {
		s := samples{procs: procs}
		t := time.NewTicker(sampleEvery)
		defer t.Stop()
		for {
			ours, others, err := m.classify(ctx, procs, s.n+1)
			if err != nil {
				s.err = err
				done <- s
				return
			}
			s.n++
			s.sum += ours
			s.peak = max(s.peak, ours)
			if others > 0 {
				s.otherActive++
			}
			select {
			case <-stop:
				done <- s
				return
			case <-t.C:
			}
		}
	}()
	return func() samples {
		close(stop)
		return <-done
	}
}

// stop ends the window and returns what it cost.
func (m *meter) stop(ctx context.Context) (window, error) {
	s := m.stopSampler()
	if s.err != nil {
		return window{}, s.err
	}
	w := window{elapsed: time.Since(m.startAt), notLocal: m.notLocal, samples: s}
	if m.pg != nil {
		children, pm, whole, err := m.pg.tree()
		if err != nil {
			return window{}, err
		}
		// A process alive at stop is counted from its first reading to now. The time of
		// those that exited is in the postmaster's reaped time (their whole lives): less
		// what they had used at their first readings, it is the window's, those born and
		// gone between two samples included. Another database's that exited is taken out
		// as far as it was read.
		var cpu, ours, others int64
		for pid, p := range s.procs {
			ticks, alive := children[pid]
			if alive {
				p.last = max(p.last, ticks)
			}
			if pid == m.pid {
				continue
			}
			d := p.last - p.first
			switch {
			case !alive:
				cpu -= p.first
				switch p.class {
				case classOther:
					cpu -= d
				case classOurs:
					ours += d // as far as it was read
				}
			case p.class == classOther:
				others += d
			case p.class == classOurs:
				ours += d
				cpu += d
			default:
				cpu += d
			}
		}
		// The postmaster's own time is shared.
		cpu += pm.UTime + pm.STime - m.ownStart
		cpu += pm.CUTime + pm.CSTime - m.reapedStart
		own := int64(0)
		if p := s.procs[m.pid]; p != nil {
			own = p.last - p.first
		}
		w.cpu, w.ours, w.others = m.pg.dur(cpu), m.pg.dur(ours), m.pg.dur(others)
		w.whole = m.pg.dur(whole - m.wholeStart - own)
	}
	var ckpts, xid int64
	err := m.conn.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8, `+nextXID+`, checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter`,
		m.lsnStart).Scan(&w.wal, &xid, &ckpts)
	if err != nil {
		return window{}, fmt.Errorf("read the WAL position (pg_current_wal_lsn): %w", err)
	}
	w.ckpts, w.xacts = ckpts-m.checkpoints, xid-m.xidStart
	return w, nil
}

// results are the window's figures for ops operations, each called op.
func (w window) results(name, op string, ops, clients int, rateNote string) []Result {
	r := func(what string, v float64, unit, note string) Result {
		return Result{Scenario: "capacity", Case: name + ": " + what, Clients: clients, Value: v, Unit: unit, Note: note}
	}
	per := float64(max(ops, 1))
	out := []Result{r("rate achieved", float64(ops)/w.elapsed.Seconds(), op+"s/s",
		fmt.Sprintf("%d in %s; %s", ops, w.elapsed.Round(time.Millisecond), rateNote))}
	shared := ""
	if w.otherActive > 0 {
		shared = fmt.Sprintf("; other databases' sessions were active in %d of %d samples, and their writes are counted too", w.otherActive, w.n)
	}
	if w.cpu > 0 {
		cpuNote := fmt.Sprintf("%.2f CPU-s in %s (%.2f cores busy): the database's processes %.2f, PostgreSQL's shared ones %.2f; "+
			"the whole server %.2f (the rest is other databases', %.2f of it by sessions alive at the end)",
			w.cpu.Seconds(), w.elapsed.Round(time.Millisecond), w.cpu.Seconds()/w.elapsed.Seconds(),
			w.ours.Seconds(), (w.cpu - w.ours).Seconds(), w.whole.Seconds(), w.others.Seconds())
		out = append(out,
			r("PostgreSQL CPU per "+op, w.cpu.Seconds()*1e6/per, "µs", cpuNote),
			r(op+"s per PostgreSQL core", float64(ops)/w.cpu.Seconds(), op+"s/s", "1 ÷ the CPU per "+op))
	} else {
		note := "not measured: " + w.notLocal
		if w.notLocal == "" {
			note = "no CPU time counted (the clock ticks every 10 ms): run longer"
		}
		out = append(out, r("PostgreSQL CPU per "+op, 0, "", note), r(op+"s per PostgreSQL core", 0, "", note))
	}
	walNote := fmt.Sprintf("%.1f MB in all (pg_current_wal_lsn)%s", w.wal/1e6, shared)
	if w.ckpts > 0 {
		walNote += fmt.Sprintf("; %d checkpoint(s) began meanwhile, whose full-page images are counted", w.ckpts)
	}
	out = append(out, r("WAL per "+op, w.wal/per, "B", walNote))
	if w.wal > 0 {
		out = append(out, r(op+"s per GB of WAL", float64(ops)/(w.wal/1e9), op+"s", "GB = 10⁹ bytes"))
	} else {
		out = append(out, r(op+"s per GB of WAL", 0, "", "no WAL written"))
	}
	out = append(out, r("transactions that wrote, per "+op, float64(w.xacts)/per, "xacts",
		fmt.Sprintf("%d transaction ids given (pg_current_snapshot)%s", w.xacts, shared)))
	return append(out,
		r("active sessions, peak", float64(w.peak), "sessions", fmt.Sprintf("pg_stat_activity every %s, %d samples; state not idle, the meter's left out", sampleEvery, w.n)),
		r("active sessions, mean", float64(w.sum)/float64(max(w.n, 1)), "sessions", "what a transaction-mode pooler's server pool is busy with on average"),
	)
}
