//go:build race

package server

// raceEnabled: the race detector slows every write several times over,
// so the heaviest tests write less under it (their point is the rule, not
// the volume; the full volume runs without it, e.g. go test ./server/).
const raceEnabled = true
