//go:build race

package rsock

// raceEnabled scales load tests down under the race detector, which also caps a
// process at 8128 live goroutines; CI runs them at full size without it too.
const raceEnabled = true
