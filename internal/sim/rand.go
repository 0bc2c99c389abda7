package sim

// etcd raft draws each node's randomized election timeout from
// crypto/rand (raft.go globalRand), which no seed reaches. Run swaps
// crypto/rand.Reader for a stream drawn from the run's seed while it
// runs, so that elections too are a function of the seed; this is why
// Run must not be called concurrently, and why nothing else in this
// package's tests may use crypto/rand while a run is under way.

import (
	cryptorand "crypto/rand"
	"encoding/binary"
	"io"
	"math/rand/v2"
)

type seededReader struct{ r *rand.Rand }

func (s seededReader) Read(p []byte) (int, error) {
	var b [8]byte
	for i := 0; i < len(p); i += 8 {
		binary.LittleEndian.PutUint64(b[:], s.r.Uint64())
		copy(p[i:], b[:])
	}
	return len(p), nil
}

// seedCryptoRand makes crypto/rand.Reader deterministic from seed until
// the returned function restores it.
func seedCryptoRand(seed uint64) (restore func()) {
	old := cryptorand.Reader
	cryptorand.Reader = io.Reader(seededReader{rand.New(rand.NewPCG(seed, 0x5eed))})
	return func() { cryptorand.Reader = old }
}
