package raftnode

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft-wal/fs"
)

// A segment created on the real file system syncs by the wrapped Sync
// first (a new segment's directory must be synced once) and by
// fdatasync after, and both succeed; the bytes written read back.
func TestSegmentsSyncTheirDataByFdatasync(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	w, err := osWALFS{fs.New()}.Create(dir, "seg", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ds, ok := w.(*dataSyncFile)
	if haveFdatasync != ok {
		t.Fatalf("got = a %T, expected: fdatasync used exactly where the system has it (%v)", w, haveFdatasync)
	}
	for i, b := range []string{"first", "second"} {
		if _, err := w.WriteAt([]byte(b), int64(i*8)); err != nil {
			t.Fatal(err)
		}
		if err := w.Sync(); err != nil {
			t.Fatalf("got = %v from sync %d, expected: nil", err, i+1)
		}
		if ok && !ds.firstDone.Load() {
			t.Fatalf("got = the first sync not recorded after sync %d, expected: recorded", i+1)
		}
	}
	got := make([]byte, 14)
	if _, err := w.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if string(got[:5]) != "first" || string(got[8:14]) != "second" {
		t.Fatalf("got = %q, expected: both writes", got)
	}
}

// BenchmarkOverlappedSyncs measures whether this disk lets a second
// log write's sync overlap the first's, which is what a contended
// handoff would need to cost one sync rather than two without batching
// (docs/benchmarks.md, "16 contenders"): each iteration writes 100
// bytes and syncs on one goroutine, and 20 µs later writes the next 100
// bytes and syncs on another, as the next holder's release would. It
// reports the median of each sync alone ("serial-µs"), of the first
// and of the second when they overlap ("first-µs", "second-µs", the
// second from its own start). On the 2-vCPU VM of the benchmarks:
// serial 99 µs, first 163 µs, second 166 µs: the second costs almost a
// whole sync of its own, and slows the first.
//
//	go test -run '^$' -bench OverlappedSyncs -benchtime 400x ./raftnode
func BenchmarkOverlappedSyncs(b *testing.B) {
	f, err := os.Create(filepath.Join(b.TempDir(), "seg"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, 64<<20), 0); err != nil { // written, as a used segment is
		b.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	rec := make([]byte, 100)
	var off int64
	next := func() int64 { off += int64(len(rec)); return off - int64(len(rec)) }
	write := func(at int64) error {
		if _, err := f.WriteAt(rec, at); err != nil {
			return err
		}
		if !haveFdatasync {
			return f.Sync()
		}
		return fdatasync(int(f.Fd()))
	}
	median := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds())
	}
	var serial, first, second []time.Duration
	for b.Loop() {
		start := time.Now()
		if err := write(next()); err != nil {
			b.Fatal(err)
		}
		serial = append(serial, time.Since(start))

		at1, at2 := next(), next()
		done := make(chan error, 1)
		start = time.Now()
		go func() {
			err := write(at1)
			first = append(first, time.Since(start))
			done <- err
		}()
		time.Sleep(20 * time.Microsecond)
		start2 := time.Now()
		err := write(at2)
		second = append(second, time.Since(start2))
		if err != nil {
			b.Fatal(err)
		}
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(median(serial), "serial-µs")
	b.ReportMetric(median(first), "first-µs")
	b.ReportMetric(median(second), "second-µs")
}
