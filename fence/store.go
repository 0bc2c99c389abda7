package fence

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
)

// Store remembers the highest token accepted per lease for Monotonic.
// Implementations must be safe for concurrent use.
type Store interface {
	// Observe atomically compares token with the highest token stored
	// for lease ("namespace/name", or "etcd:" and a lock for
	// MonotonicKey; 0 when never seen): when token is at
	// least the highest, it stores token and returns it; otherwise it
	// changes nothing and returns the highest. It returns only when the
	// stored token is as durable as the store promises; after an error
	// the token counts as not accepted.
	Observe(lease string, token int64) (highest int64, err error)
}

var (
	_ Store = (*MemoryStore)(nil)
	_ Store = (*FileStore)(nil)
)

// MemoryStore is a Store in memory: fast, and forgotten when the process
// exits. After a restart a Monotonic policy on a fresh MemoryStore
// accepts any token once, the stale ones included, so use it where the
// resource's own state resets with the process, or behind Validate. It
// holds one entry per lease ever seen.
type MemoryStore struct {
	mu      sync.Mutex // guards highest
	highest map[string]int64
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore { return &MemoryStore{highest: map[string]int64{}} }

// Observe implements Store; it never fails.
func (s *MemoryStore) Observe(lease string, token int64) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.highest[lease]; h > token {
		return h, nil
	}
	s.highest[lease] = token
	return token, nil
}

// FileStore is a Store kept in one file, so that a restarted resource
// never accepts a token lower than one it accepted before the restart.
//
// Each increase of a lease's highest token rewrites the whole file:
// write a temporary file, fsync it, rename it over the old one and fsync
// the directory. Observe returns — and the request is accepted — only
// after that, so a token is acknowledged only once it is on disk and a
// crash at any moment leaves either the old or the new file. The cost is
// two fsyncs per increase (about a millisecond on an SSD, tens on a
// spinning disk or network volume) plus writing every lease's entry;
// increases are serialized across leases, while a repeat of the highest
// token, a holder's usual request, costs only a map lookup. It suits a
// resource with up to thousands of leases whose holders change now and
// then; beyond that, keep the highest token in the resource's own
// database and compare it in the same transaction as the write.
//
// A FileStore holds an exclusive lock on path+".lock" (on Unix) so that
// two stores, in this process or another, cannot share the file. The
// caller should call Close when finished.
type FileStore struct {
	path string
	lock *os.File

	mu      sync.Mutex // guards highest and closed, and serializes writes of the file
	highest map[string]int64
	closed  bool
}

// fileRecord is the file's content. CRC32 (Castagnoli) is over the JSON
// encoding of Highest, whose keys encoding/json sorts.
type fileRecord struct {
	Format  string           `json:"format"`
	Highest map[string]int64 `json:"highest"`
	CRC32   uint32           `json:"crc32"`
}

const fileFormat = "tenure-fence-store/v1"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// NewFileStore opens the store kept at path, creating it empty when the
// file does not exist (its directory must). It fails with an error
// matching ErrCorrupt when the file is not a store it wrote, and when
// another FileStore has path open.
func NewFileStore(path string) (*FileStore, error) {
	lock, err := lockFile(path + ".lock")
	if err != nil {
		return nil, fmt.Errorf("fence: opening store %s: %w", path, err)
	}
	s := &FileStore{path: path, lock: lock, highest: map[string]int64{}}
	if err := s.load(); err != nil {
		unlockFile(lock)
		return nil, err
	}
	// Temporary files of writes cut short by a crash; never renamed, so
	// never acknowledged.
	if tmps, err := filepath.Glob(s.path + ".tmp-*"); err == nil {
		for _, tmp := range tmps {
			os.Remove(tmp)
		}
	}
	return s, nil
}

func (s *FileStore) load() error {
	data, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("fence: opening store: %w", err)
	}
	corrupt := func(why string, args ...any) error {
		return fmt.Errorf("%w: %s: %s (it records the highest fencing token accepted per lease; restore it from a backup, or remove it only when no stale holder can still write)",
			ErrCorrupt, s.path, fmt.Sprintf(why, args...))
	}
	var rec fileRecord
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rec); err != nil {
		return corrupt("%v", err)
	}
	if dec.More() {
		return corrupt("data after the record")
	}
	if rec.Format != fileFormat {
		return corrupt("format %q, want %q", rec.Format, fileFormat)
	}
	if rec.Highest == nil {
		rec.Highest = map[string]int64{}
	}
	if sum, err := checksum(rec.Highest); err != nil || sum != rec.CRC32 {
		return corrupt("checksum mismatch")
	}
	for lease, token := range rec.Highest {
		if token <= 0 {
			return corrupt("lease %q has token %d, want a positive one", lease, token)
		}
	}
	s.highest = rec.Highest
	return nil
}

func checksum(highest map[string]int64) (uint32, error) {
	b, err := json.Marshal(highest)
	if err != nil {
		return 0, err
	}
	return crc32.Checksum(b, castagnoli), nil
}

// Observe implements Store. An increase returns only after the file is
// durably replaced; when that fails, the error is returned and the
// highest stays as it was.
func (s *FileStore) Observe(lease string, token int64) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, fmt.Errorf("fence: store %s is closed", s.path)
	}
	if token <= 0 {
		return 0, fmt.Errorf("fence: token %d for %s is not a positive fencing token", token, lease)
	}
	if h := s.highest[lease]; h >= token {
		return h, nil
	}
	next := make(map[string]int64, len(s.highest)+1)
	for k, v := range s.highest {
		next[k] = v
	}
	next[lease] = token
	if err := s.write(next); err != nil {
		return 0, err
	}
	s.highest = next
	return token, nil
}

// write replaces the file with highest, durably. s.mu is held.
func (s *FileStore) write(highest map[string]int64) error {
	sum, err := checksum(highest)
	if err != nil {
		return err
	}
	data, err := json.Marshal(fileRecord{Format: fileFormat, Highest: highest, CRC32: sum})
	if err != nil {
		return err
	}
	dir, base := filepath.Split(s.path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, base+".tmp-*")
	if err != nil {
		return fmt.Errorf("fence: writing store: %w", err)
	}
	_, err = tmp.Write(append(data, '\n'))
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), s.path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("fence: writing store: %w", err)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("fence: writing store: syncing %s: %w", dir, err)
	}
	return nil
}

// Close releases the file. Observe fails after Close; Close is safe to
// call twice.
func (s *FileStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return unlockFile(s.lock)
}
