//go:build race

package harness

// RaceEnabled reports whether the race detector is on. It slows the data paths about
// tenfold, so the largest transfers are scaled down under it; CI also runs the tests
// without it, at full size.
const RaceEnabled = true

// BigBody is the size of the largest transfers: 256 MiB, or 32 MiB under the race
// detector.
const BigBody = 32 << 20
