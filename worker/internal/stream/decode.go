package stream

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/sockfleet/sockfleet/shared/schema"
)

// errDecodedOverLimit: a frame that inflates past the read limit (a decompression
// bomb, or just a huge message) is a bad message, never a full inflation.
var errDecodedOverLimit = errors.New("decoded frame over the read limit")

// decodeFrame decompresses a binary frame as the spec's decode asks (deflate, gzip
// or zlib), before its sequence is read. A text frame passes as it is (OKX answers a
// text "ping" with a text "pong" on a compressed feed), and so does an over-limit
// frame, which is bad already. The decoded payload reads as text when it is UTF-8,
// so a sequence inside it can be parsed. A frame that does not decompress within
// limit bytes keeps its raw payload and carries the error, for the tracker to treat
// as a bad message.
func decodeFrame(f frame, how string, limit int64) frame {
	if !schema.FrameDecode(how) || !f.binary || f.over {
		return f
	}
	out, err := inflate(f.data, how, limit)
	if err != nil {
		f.decodeErr = fmt.Errorf("%s frame of %d bytes: %w", how, len(f.data), err)
		return f
	}
	f.data, f.decoded, f.binary = out, how, !utf8.Valid(out)
	return f
}

// inflate returns data decompressed, reading at most limit bytes of output.
func inflate(data []byte, how string, limit int64) ([]byte, error) {
	in := bytes.NewReader(data)
	var r io.ReadCloser
	var err error
	switch how {
	case schema.DecodeDeflate:
		r = flate.NewReader(in)
	case schema.DecodeGzip:
		r, err = gzip.NewReader(in)
	case schema.DecodeZlib:
		r, err = zlib.NewReader(in)
	}
	if err != nil {
		return nil, err
	}
	defer r.Close()
	out, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(out)) > limit {
		return nil, fmt.Errorf("%w (%d bytes)", errDecodedOverLimit, limit)
	}
	return out, nil
}
