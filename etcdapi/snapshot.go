package etcdapi

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
)

// Maintenance.Snapshot streams Tenure's own snapshot (what
// statemachine.Machine.Snapshot writes, as `tenure snapshot save` saves
// it) in a form etcd's clients take for an etcd database, and that
// `tenure snapshot restore` reads back (OpenSnapshot).
//
// etcd streams its bbolt file and then a sha256 of it, and etcdctl
// `snapshot save` (clientv3/snapshot.Save) refuses a stream whose length
// is not a multiple of 512 plus the 32 bytes of the hash: a bbolt file
// is made of pages. So the stream is:
//
//	snapshotMagic | length of the state, 8 bytes big-endian | the state |
//	zeros up to a multiple of 512 bytes | sha256 of all of the above
//
// The magic begins with 0xff, as Tenure's binary snapshots do, and
// neither a JSON snapshot ('{') nor a binary one ("\xffTSN") begins with
// it, so restore tells the three apart by their first bytes.

// snapshotMagic opens a snapshot streamed by the etcd API.
var snapshotMagic = []byte("\xffTSN+etcd\n")

// snapshotPage is the length the stream's body is padded to a multiple
// of, less the hash: what etcdctl checks.
const snapshotPage = 512

// snapshotHeader is the magic and the state's length.
var snapshotHeader = len(snapshotMagic) + 8

// ErrNotTenureSnapshot is returned by OpenSnapshot for an etcd database
// (a bbolt file, as a real etcd's Snapshot streams it): Tenure restores
// only its own state.
var ErrNotTenureSnapshot = errors.New("an etcd database (bbolt), not a Tenure snapshot: Tenure restores only snapshots of Tenure, saved by tenure snapshot save or by etcdctl snapshot save against Tenure")

// WrapSnapshot returns the stream Maintenance.Snapshot sends for state,
// a Tenure snapshot.
func WrapSnapshot(state []byte) []byte {
	n := snapshotHeader + len(state)
	padded := (n + snapshotPage - 1) / snapshotPage * snapshotPage
	out := make([]byte, padded, padded+sha256.Size)
	copy(out, snapshotMagic)
	binary.BigEndian.PutUint64(out[len(snapshotMagic):], uint64(len(state)))
	copy(out[snapshotHeader:], state)
	sum := sha256.Sum256(out)
	return append(out, sum[:]...)
}

// OpenSnapshot returns the Tenure snapshot in data: data itself when it
// is one, as tenure snapshot save writes it, or the state in a stream
// of Maintenance.Snapshot, as etcdctl snapshot save writes it, once its
// sha256 is checked. It refuses an etcd database with
// ErrNotTenureSnapshot, and a stream whose hash or length is wrong.
func OpenSnapshot(data []byte) ([]byte, error) {
	if isBolt(data) {
		return nil, ErrNotTenureSnapshot
	}
	if !bytes.HasPrefix(data, snapshotMagic) {
		return data, nil
	}
	if len(data)%snapshotPage != sha256.Size || len(data) < snapshotHeader+sha256.Size {
		return nil, fmt.Errorf("snapshot streamed by the etcd API: %d bytes, not a multiple of %d and its %d-byte sha256: cut short?", len(data), snapshotPage, sha256.Size)
	}
	body, sum := data[:len(data)-sha256.Size], data[len(data)-sha256.Size:]
	if got := sha256.Sum256(body); !bytes.Equal(got[:], sum) {
		return nil, errors.New("snapshot streamed by the etcd API: its sha256 does not match its content: the file is damaged")
	}
	n := binary.BigEndian.Uint64(body[len(snapshotMagic):])
	if n > uint64(len(body)-snapshotHeader) {
		return nil, fmt.Errorf("snapshot streamed by the etcd API: names %d bytes of state in %d", n, len(body)-snapshotHeader)
	}
	return body[snapshotHeader : snapshotHeader+int(n)], nil
}

// isBolt reports whether data begins with a bbolt meta page, as an etcd
// database does: a 16-byte page header, then the magic 0xED0CDAED in the
// writer's byte order.
func isBolt(data []byte) bool {
	if len(data) < 20 {
		return false
	}
	m := data[16:20]
	return binary.LittleEndian.Uint32(m) == 0xED0CDAED || binary.BigEndian.Uint32(m) == 0xED0CDAED
}
