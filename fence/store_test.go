package fence_test

import (
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/tenurehq/tenure/fence"
)

func newFileStore(t *testing.T, path string) *fence.FileStore {
	t.Helper()
	s, err := fence.NewFileStore(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestStores(t *testing.T) {
	stores := []struct {
		name string
		open func(t *testing.T) fence.Store
		// goroutines × observations each
		workers, rounds int
	}{
		{"memory", func(*testing.T) fence.Store { return fence.NewMemoryStore() }, 32, 500},
		{"file", func(t *testing.T) fence.Store { return newFileStore(t, filepath.Join(t.TempDir(), "fence.json")) }, 8, 40},
	}
	for _, st := range stores {
		t.Run(st.name+": a new lease accepts any token and remembers it", func(t *testing.T) {
			s := st.open(t)
			observe(t, s, "default/a", 5, 5)
			observe(t, s, "default/a", 5, 5) // the same holder again
			observe(t, s, "default/a", 3, 5) // lower: refused, highest returned
			observe(t, s, "default/a", 9, 9)
			observe(t, s, "default/b", 1, 1) // leases are independent
		})
		t.Run(st.name+": concurrent observers never see the highest decrease", func(t *testing.T) {
			s := st.open(t)
			leases := []string{"default/a", "default/b", "other/a"}
			var (
				wg     sync.WaitGroup
				mu     sync.Mutex // guards failed and max
				failed []string
				max    = map[string]int64{}
			)
			for w := range st.workers {
				wg.Go(func() {
					last := map[string]int64{}
					for i := range st.rounds {
						lease := leases[(w+i)%len(leases)]
						token := rand.Int64N(1000) + 1
						got, err := s.Observe(lease, token)
						mu.Lock()
						switch {
						case err != nil:
							failed = append(failed, err.Error())
						case got < token:
							failed = append(failed, fmt.Sprintf("Observe(%s, %d) = %d, below the token", lease, token, got))
						case got < last[lease]:
							failed = append(failed, fmt.Sprintf("Observe(%s, %d) = %d, below %d returned before", lease, token, got, last[lease]))
						}
						max[lease] = maxInt(max[lease], token)
						mu.Unlock()
						last[lease] = got
					}
				})
			}
			wg.Wait()
			if len(failed) > 0 {
				t.Fatalf("got = %d failures, first %s, expected: none", len(failed), failed[0])
			}
			for _, lease := range leases {
				observe(t, s, lease, 1, max[lease])
			}
		})
	}
}

func maxInt(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

func observe(t *testing.T, s fence.Store, lease string, token, want int64) {
	t.Helper()
	got, err := s.Observe(lease, token)
	if err != nil || got != want {
		t.Fatalf("Observe(%s, %d): got = %d, %v, expected: %d", lease, token, got, err, want)
	}
}

func TestFileStoreSurvivesReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fence.json")
	s, err := fence.NewFileStore(path)
	if err != nil {
		t.Fatal(err)
	}
	observe(t, s, "default/db-writer", 9, 9)
	observe(t, s, "default/other", 4, 4)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: got = %v, expected: nil", err)
	}
	if _, err := s.Observe("default/db-writer", 10); err == nil {
		t.Fatal("Observe after Close: got = nil, expected: an error")
	}

	s = newFileStore(t, path)
	observe(t, s, "default/db-writer", 7, 9) // lower than before the restart: refused
	observe(t, s, "default/db-writer", 9, 9)
	observe(t, s, "default/other", 3, 4)
	observe(t, s, "default/db-writer", 10, 10)
}

func TestFileStoreIsExclusive(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("FileStore takes no lock on Windows")
	}
	path := filepath.Join(t.TempDir(), "fence.json")
	newFileStore(t, path)
	if s, err := fence.NewFileStore(path); err == nil || !strings.Contains(err.Error(), "locked") {
		if s != nil {
			s.Close()
		}
		t.Fatalf("second open: got = %v, expected: an error saying the store is locked", err)
	}
}

func TestFileStoreRemovesUnfinishedWrites(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "fence.json")
	tmp := path + ".tmp-123"
	if err := os.WriteFile(tmp, []byte("half a reco"), 0o644); err != nil {
		t.Fatal(err)
	}
	newFileStore(t, path)
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("got = %v, expected: %s removed", err, tmp)
	}
}

func TestFileStoreRefusesCorruptFiles(t *testing.T) {
	// A good file to damage.
	good := filepath.Join(t.TempDir(), "fence.json")
	s := newFileStore(t, good)
	observe(t, s, "default/db-writer", 12345, 12345)
	s.Close()
	data, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		data string
		why  string
	}{
		{"garbage is refused", "not json at all", "invalid character"},
		{"a truncated file is refused", string(data[:len(data)/2]), "unexpected EOF"},
		{"a changed token is refused", strings.Replace(string(data), "12345", "12346", 1), "checksum mismatch"},
		{"another format is refused", strings.Replace(string(data), "tenure-fence-store/v1", "tenure-fence-store/v9", 1), `format "tenure-fence-store/v9"`},
		{"data after the record is refused", string(data) + "{}", "data after the record"},
		{"an unknown field is refused", `{"format":"tenure-fence-store/v1","highest":{},"crc32":0,"extra":1}`, "unknown field"},
		{"a non-positive token is refused", fmt.Sprintf(`{"format":"tenure-fence-store/v1","highest":{"default/a":0},"crc32":%d}`,
			crc32.Checksum([]byte(`{"default/a":0}`), crc32.MakeTable(crc32.Castagnoli))), `lease "default/a" has token 0, want a positive one`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "fence.json")
			if err := os.WriteFile(path, []byte(tt.data), 0o644); err != nil {
				t.Fatal(err)
			}
			s, err := fence.NewFileStore(path)
			if err == nil {
				s.Close()
			}
			if !errors.Is(err, fence.ErrCorrupt) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tt.why) {
				t.Fatalf("got = %v, expected: ErrCorrupt naming %s and saying %q", err, path, tt.why)
			}
			// The file is left for the operator to inspect.
			if got, _ := os.ReadFile(path); string(got) != tt.data {
				t.Fatalf("got = file changed to %q, expected: left as it was", got)
			}
			// And the store can be opened once the file is fixed.
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			newFileStore(t, path)
		})
	}
}
