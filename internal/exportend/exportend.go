// Package exportend is the end mark of a workspace export (`sandbox-init export`): after the
// compressed tar on stdout, the export writes on stderr how many bytes it wrote and their
// SHA-256. A reader of the stream that lost its tail (a connection cut, which some paths
// report as a clean end) can tell: the bytes it got do not add up to the mark, or the mark
// never came. A reader that read the export again to get the rest can check with the sum that
// the two attempts' bytes are the same.
package exportend

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
)

const prefix = "sandbox-init export: end "

// Line is the mark for n bytes whose SHA-256 is sum, a line of its own.
func Line(n int64, sum []byte) string {
	return fmt.Sprintf("%s%d %x\n", prefix, n, sum)
}

// Parse finds the last mark in stderr: the byte count and the SHA-256; ok false when there is
// none, or it is malformed.
func Parse(stderr string) (n int64, sum []byte, ok bool) {
	i := strings.LastIndex(stderr, prefix)
	if i < 0 {
		return 0, nil, false
	}
	line, _, found := strings.Cut(stderr[i+len(prefix):], "\n")
	if !found {
		return 0, nil, false // cut off in the middle
	}
	count, hexSum, found := strings.Cut(line, " ")
	if !found {
		return 0, nil, false
	}
	n, err := strconv.ParseInt(count, 10, 64)
	if err != nil || n < 0 {
		return 0, nil, false
	}
	sum, err = hex.DecodeString(hexSum)
	if err != nil || len(sum) != 32 {
		return 0, nil, false
	}
	return n, sum, true
}
