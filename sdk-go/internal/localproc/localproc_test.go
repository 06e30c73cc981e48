package localproc

import (
	"net"
	"strconv"
	"testing"
)

func TestFreePortsLieOutsideTheEphemeralRangeAndAreNeverRepeated(t *testing.T) {
	low, high := EphemeralPorts()
	index, count := PortShard()
	seen := map[int]bool{}
	for range 200 {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if port < 10_000 || port > 65_535 || (port >= low && port <= high) || seen[port] || port%count != index {
			t.Fatalf("port %d (ephemeral %d-%d, shard %d/%d, seen before: %v)", port, low, high, index, count,
				seen[port])
		}
		seen[port] = true
		listener, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatalf("port %d cannot be bound once handed out: %v", port, err)
		}
		_ = listener.Close()
	}
}

func TestAShardTakesOnlyItsOwnPorts(t *testing.T) {
	t.Setenv("AGENTREACH_PORT_SHARD", "1/3")
	if index, count := PortShard(); index != 1 || count != 3 {
		t.Fatalf("shard %d/%d, want 1/3", index, count)
	}
	for range 50 {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if port%3 != 1 {
			t.Fatalf("port %d is not shard 1/3's", port)
		}
	}
	for _, malformed := range []string{"", "3/3", "-1/2", "1/0", "x"} {
		t.Setenv("AGENTREACH_PORT_SHARD", malformed)
		if index, count := PortShard(); index != 0 || count != 1 {
			t.Fatalf("%q read as shard %d/%d, want every port (0/1)", malformed, index, count)
		}
	}
}
