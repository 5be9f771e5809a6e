package shm

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/verbstest"
)

// agentEnv, set in a re-executed test binary's environment, makes it the peer process of
// the two-process tests: it serves one verbstest agent session on a shm provider, on the
// loopback TCP address it prints on its first line of output.
const agentEnv = "RSOCK_SHM_AGENT"

// runAgentIfAsked runs the agent and reports true if this process was started as one.
func runAgentIfAsked() bool {
	if os.Getenv(agentEnv) == "" {
		return false
	}
	if err := runAgent(); err != nil {
		fmt.Fprintln(os.Stderr, "shm agent:", err)
		os.Exit(1)
	}
	return true
}

func runAgent() error {
	p, err := New(Options{})
	if err != nil {
		return err
	}
	defer p.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Println(ln.Addr())
	return verbstest.ServeAgent(ln, p)
}

// peerProcess is a re-executed test binary serving a shm provider as an agent.
type peerProcess struct {
	cmd  *exec.Cmd
	prov *verbstest.RemoteProvider
}

// startPeer starts a peer process and connects to its agent. It is killed, if still
// running, when the test ends.
func startPeer(t *testing.T) *peerProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), agentEnv+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start peer process: %v", err)
	}
	pp := &peerProcess{cmd: cmd}
	t.Cleanup(func() {
		if pp.prov != nil {
			pp.prov.Close()
		}
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("read the peer's address: %v", err)
	}
	pp.prov, err = verbstest.DialAgent(context.Background(), strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("dial the peer's agent: %v", err)
	}
	return pp
}

// TestConformancePeerProcess runs the conformance suite with side b of every pair in
// another process: the two processes share only the memory of the regions they pass each
// other and the sockets of their devices.
func TestConformancePeerProcess(t *testing.T) {
	verbstest.Suite{Providers: func(t *testing.T) (a, b verbs.Provider) {
		return newProvider(t, 1), startPeer(t).prov
	}}.Run(t)
}
