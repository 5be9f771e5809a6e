//go:build !race

package harness

// RaceEnabled reports whether the race detector is on. It slows the data paths about
// tenfold, so the largest transfers are scaled down under it; CI also runs the tests
// without it, at full size.
const RaceEnabled = false

// BigBody is the size of the largest transfers: 64 MiB, or 32 MiB under the race
// detector. 64 MiB is over a hundred times the largest ring and QUIC's largest stream
// window, so every buffer on the way fills and drains many times; the 256 MiB it once
// was repeated that at four times the cost.
const BigBody = 64 << 20
