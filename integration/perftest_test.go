package integration

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseBWAverage(t *testing.T) {
	out := ` RDMA_Write BW Test
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 65536      500              21.37              20.00              0.000342
---------------------------------------------------------------------------------------
`
	gbps, err := parseBWAverage(out)
	require.NoError(t, err)
	require.InDelta(t, 20*1048576*8/1e9, gbps, 1e-12) // perftest's MB is 2^20 bytes
	_, err = parseBWAverage(" #bytes #iterations BW peak[Gb/sec] BW average[Gb/sec]\n 65536 500 0.17 0.17\n")
	require.ErrorContains(t, err, "no BW average[MB/sec]")
	_, err = parseBWAverage(" #bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]\n 65536 500 inf inf inf\n")
	require.ErrorIs(t, err, errNoFigure)
}
