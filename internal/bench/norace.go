//go:build !race

package bench

// raceDetector is set in a build with the race detector (race.go).
const raceDetector = false
