//go:build rdma && linux && cgo

package ibv_test

import (
	"fmt"
	"testing"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/ibv"
	"github.com/rsockio/rsock/verbs/verbstest"
)

// TestConformance runs the verbs conformance suite against the rdma-core provider when
// this machine has a device with an active port, and skips saying why otherwise.
// With two or more devices the suite connects QPs across two of them; with one, both
// ends of each pair are on the same device.
func TestConformance(t *testing.T) {
	p, err := ibv.Open()
	if err == nil {
		err = activePort(p)
	}
	if err != nil {
		t.Skipf("ibv: no RDMA device on this machine: %v", err)
	}
	verbstest.Run(t, func(t *testing.T) verbs.Provider { return p })
}

func activePort(p verbs.Provider) error {
	devs, err := p.Devices()
	if err != nil {
		return err
	}
	for _, d := range devs {
		for _, port := range d.Ports {
			if port.State == verbs.PortActive {
				return nil
			}
		}
	}
	return fmt.Errorf("%d devices, none with an ACTIVE port: %w", len(devs), verbs.ErrNoDevice)
}
