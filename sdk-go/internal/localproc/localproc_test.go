package localproc

import (
	"net"
	"strconv"
	"testing"
)

func TestFreePortsLieOutsideTheEphemeralRangeAndAreNeverRepeated(t *testing.T) {
	low, high := EphemeralPorts()
	seen := map[int]bool{}
	for range 200 {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if port < 10_000 || port > 65_535 || (port >= low && port <= high) || seen[port] {
			t.Fatalf("port %d (ephemeral %d-%d, seen before: %v)", port, low, high, seen[port])
		}
		seen[port] = true
		listener, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatalf("port %d cannot be bound once handed out: %v", port, err)
		}
		_ = listener.Close()
	}
}
