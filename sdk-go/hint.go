package reach

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// MatchesHint says whether an instance's metadata has every hinted label with exactly the hinted value:
// context.routing_hint, the caller's hard filter, as the router applies it (agent_reach.hint).
func MatchesHint(metadata, routingHint map[string]any) bool {
	for label, wanted := range routingHint {
		value, present := metadata[label]
		if !present || !sameValue(value, wanted) {
			return false
		}
	}
	return true
}

// sameValue compares two scalar JSON values as the router does: numbers by value (1 is 1.0), strings and
// booleans exactly; anything else (an object, a list) matches no metadata value.
func sameValue(a, b any) bool {
	if x, ok := number(a); ok {
		y, ok := number(b)
		return ok && x == y
	}
	switch x := a.(type) {
	case string:
		y, ok := b.(string)
		return ok && x == y
	case bool:
		y, ok := b.(bool)
		return ok && x == y
	case nil:
		return b == nil
	}
	return false
}

func number(value any) (float64, bool) {
	switch x := value.(type) {
	case json.Number:
		parsed, err := x.Float64()
		return parsed, err == nil
	case float64:
		return x, true
	case float32:
		return float64(x), true
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	case int32:
		return float64(x), true
	}
	return 0, false
}

// unsatisfiedHint is the reason given with ROUTING_HINT_UNSATISFIABLE when no instance matches.
func unsatisfiedHint(routingHint map[string]any) string {
	labels := make([]string, 0, len(routingHint))
	for label, value := range routingHint {
		labels = append(labels, fmt.Sprintf("%s=%v", label, value))
	}
	sort.Strings(labels)
	return "no instance has metadata matching routing_hint " + strings.Join(labels, ", ")
}
