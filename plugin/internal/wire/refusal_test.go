package wire

import (
	"errors"
	"strings"
	"testing"
)

func TestRefusalRoundTrip(t *testing.T) {
	long := strings.Repeat("x", MaxRefusalText+50)
	tests := []struct {
		reason   RefuseReason
		text     string
		wantText string
	}{
		{RefuseUsed, "client 10.0.0.1:4242", "client 10.0.0.1:4242"},
		{RefuseStale, "", ""},
		{RefusePair, "peer 10.0.0.1: SUP address 10.1.0.2 is not on this port", "peer 10.0.0.1: SUP address 10.1.0.2 is not on this port"},
		{RefuseSetup, long, long[:MaxRefusalText]},
	}
	for _, tt := range tests {
		b := EncodeRefusal(tt.reason, tt.text)
		if !IsRefusal(b) {
			t.Errorf("%v: not a refusal: % x", tt.reason, b[:8])
		}
		reason, n, err := DecodeRefusalHead(b[:RefusalHeadSize])
		if err != nil || reason != tt.reason || n != len(tt.wantText) || string(b[RefusalHeadSize:]) != tt.wantText {
			t.Errorf("%v: decoded %v, %d bytes of text, %v; text %q", tt.reason, reason, n, err, b[RefusalHeadSize:])
		}
	}
}

func TestRefusalHeadRejects(t *testing.T) {
	good := EncodeRefusal(RefusePair, "x")[:RefusalHeadSize]
	set := func(i int, v byte) []byte {
		b := append([]byte(nil), good...)
		b[i] = v
		return b
	}
	tests := []struct {
		name string
		head []byte
		want string
	}{
		{"metadata", EncodeMetadata(Metadata{})[:RefusalHeadSize], "refusal head"},
		{"short", good[:6], "refusal head"},
		{"version", set(4, Version-1), "refusal version"},
		{"reason 0", set(6, 0), "refusal reason 0"},
		{"unknown reason", set(6, byte(maxRefuseReason)+1), "refusal reason"},
		{"text too long", set(7, MaxRefusalText+1), "bytes of text"},
	}
	for _, tt := range tests {
		_, _, err := DecodeRefusalHead(tt.head)
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want ErrMalformed with %q", tt.name, err, tt.want)
		}
	}
	if IsRefusal(EncodeMetadata(Metadata{})) {
		t.Error("metadata taken for a refusal")
	}
}
