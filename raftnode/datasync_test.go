package raftnode

import (
	"testing"

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
