package harness

import (
	"context"
	"errors"
	"net"
	"testing"
	"testing/synctest"
)

func TestMain(m *testing.M) { VerifyTestMain(m) }

// TestRequireClosedWaitsForDials: the Env's end-of-test check waits for a dial still in
// progress (http.Transport leaves dials running) before it looks at the connections, so
// a connection that appears after the test body returned is still checked. In a
// synctest bubble, "still waiting" is decided by synctest.Wait, not by a sleep.
func TestRequireClosedWaitsForDials(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := Transport{Name: "tcp"}.Env(t)
		release := make(chan struct{})
		dial := env.RecordDials(func(context.Context, string, string) (net.Conn, error) {
			<-release
			return nil, errors.New("refused")
		})
		dialed := make(chan error, 1)
		go func() {
			_, err := dial(context.Background(), "tcp", "192.0.2.1:1")
			dialed <- err
		}()
		synctest.Wait() // the dial is in progress

		checked := make(chan struct{})
		go func() {
			env.requireClosed(t)
			close(checked)
		}()
		synctest.Wait()
		select {
		case <-checked:
			t.Fatal("the check ended while a dial was in progress")
		default:
		}
		close(release)
		<-checked
		if err := <-dialed; err == nil {
			t.Fatal("the dial succeeded")
		}
	})
}
