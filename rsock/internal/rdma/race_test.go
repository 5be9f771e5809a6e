//go:build race

package rdma

// raceEnabled scales long tests down under the race detector, which slows the data
// path about tenfold; CI also runs the package without it, at full size.
const raceEnabled = true
