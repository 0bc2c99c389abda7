//go:build race

package bench

// raceDetector is set in a build with the race detector, whose clients
// run several times slower: the short run sizes its heartbeat workload
// down (sizesFor).
const raceDetector = true
