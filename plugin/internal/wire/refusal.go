package wire

import (
	"encoding/binary"
	"fmt"
)

// A refusal is what a listener writes instead of its metadata when it turns a connection down
// on its merits once it has read the hello (never when its gate evicts a silent client: that
// close says nothing and the connector dials again). The connector reads it where the
// metadata would be and fails at once with its reason: dialing again would be refused again.
//
// Layout: magic u32 | version u16 | reason u8 | text length u8 | text [length] (at most
// MaxRefusalText bytes, the listener's own words, for the connector's log). Its first
// RefusalHeadSize bytes line up with the metadata's magic, version and size.
const (
	refusalMagic    = 0x5249504D // "MPIR"
	RefusalHeadSize = 8
	MaxRefusalText  = 200
)

// RefuseReason says why a listener refused a connection.
type RefuseReason uint8

const (
	// RefuseUsed: the listener served a hello already (NCCL connects once per listen: a copied
	// or replayed handle).
	RefuseUsed RefuseReason = 1 + iota
	// RefuseStale: the hello names another listener (a stale or misrouted handle).
	RefuseStale
	// RefusePair: the hello's SUP pair or relay flag does not fit the listener's SUP ports now.
	RefusePair
	// RefuseSetup: the listener could not build its end of the connection (QPs, memory).
	RefuseSetup
	maxRefuseReason = RefuseSetup
)

func (r RefuseReason) String() string {
	switch r {
	case RefuseUsed:
		return "its handle was used already (NCCL connects once per listen: a copied or replayed handle?)"
	case RefuseStale:
		return "our hello names another listener (a stale or misrouted handle)"
	case RefusePair:
		return "the SUP pair or MPIB_SUP_RELAY does not fit its SUP ports"
	case RefuseSetup:
		return "it could not build its end of the connection"
	}
	return fmt.Sprintf("reason %d", uint8(r))
}

// EncodeRefusal is a refusal for reason with text (cut to MaxRefusalText bytes).
func EncodeRefusal(reason RefuseReason, text string) []byte {
	if len(text) > MaxRefusalText {
		text = text[:MaxRefusalText]
	}
	b := binary.LittleEndian.AppendUint32(nil, refusalMagic)
	b = binary.LittleEndian.AppendUint16(b, Version)
	b = append(b, byte(reason), byte(len(text)))
	return append(b, text...)
}

// IsRefusal says whether head (the first RefusalHeadSize bytes where the metadata would be)
// starts a refusal.
func IsRefusal(head []byte) bool {
	return len(head) >= 4 && binary.LittleEndian.Uint32(head) == refusalMagic
}

// DecodeRefusalHead validates a refusal's head and returns its reason and how many bytes of
// text follow.
func DecodeRefusalHead(head []byte) (RefuseReason, int, error) {
	if len(head) != RefusalHeadSize || !IsRefusal(head) {
		return 0, 0, fmt.Errorf("%w: refusal head % x", ErrMalformed, head)
	}
	if v := binary.LittleEndian.Uint16(head[4:]); v != Version {
		return 0, 0, fmt.Errorf("%w: refusal version %d, want %d", ErrVersion, v, Version)
	}
	reason, n := RefuseReason(head[6]), int(head[7])
	if reason == 0 || reason > maxRefuseReason || n > MaxRefusalText {
		return 0, 0, fmt.Errorf("%w: refusal reason %d with %d bytes of text", ErrMalformed, head[6], n)
	}
	return reason, n, nil
}
