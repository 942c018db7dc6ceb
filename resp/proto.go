package resp

import (
	"bufio"
	"errors"
	"io"
	"strconv"
	"strings"

	"github.com/llmhedge/llmhedge/core/fleetstore"
)

// Reader limits: a reply beyond them is a protocol error (the connection is
// then dropped) rather than an allocation the size of a corrupt length.
const (
	maxBulkBytes     = 512 << 20 // Redis' own proto-max-bulk-len default
	maxArrayElements = 1 << 24
	maxNesting       = 64
)

// Error is a Redis error reply ("WRONGTYPE Operation against a key ...").
// Its text is the server's, which starts with the error code.
type Error struct {
	msg string
}

func (e *Error) Error() string { return e.msg }

// Code is the error's first word ("NOSCRIPT", "WRONGPASS", "ERR").
func (e *Error) Code() string {
	i := strings.IndexByte(e.msg, ' ')
	if i < 0 {
		return e.msg
	}
	return e.msg[:i]
}

// errProtocol marks a reply the reader cannot parse: the stream is out of
// step, so the connection is dropped.
var errProtocol = errors.New("resp: protocol error in reply")

// appendCommand appends args as a RESP array of bulk strings.
func appendCommand(buf []byte, args []string) []byte {
	buf = append(buf, '*')
	buf = strconv.AppendInt(buf, int64(len(args)), 10)
	buf = append(buf, '\r', '\n')
	for _, a := range args {
		buf = append(buf, '$')
		buf = strconv.AppendInt(buf, int64(len(a)), 10)
		buf = append(buf, '\r', '\n')
		buf = append(buf, a...)
		buf = append(buf, '\r', '\n')
	}
	return buf
}

// readLine reads one CRLF-terminated line without its terminator.
func readLine(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return "", errProtocol
	}
	return line[:len(line)-2], nil
}

// readReply reads one complete reply. A Redis error reply (at the top or
// nested in an array) is returned as replyErr after the whole reply has been
// read, so the connection stays in step; ioErr is a network or protocol
// failure after which the connection is unusable.
func readReply(r *bufio.Reader) (fleetstore.RedisValue, error, error) {
	var firstErr error
	v, ioErr := readValue(r, 0, &firstErr)
	return v, firstErr, ioErr
}

func readValue(r *bufio.Reader, depth int, replyErr *error) (fleetstore.RedisValue, error) {
	var v fleetstore.RedisValue
	if depth > maxNesting {
		return v, errProtocol
	}
	line, err := readLine(r)
	if err != nil {
		return v, err
	}
	if line == "" {
		return v, errProtocol
	}
	body := line[1:]
	switch line[0] {
	case '+': // simple string
		v.Kind = fleetstore.RedisString
		v.Str = body
		return v, nil
	case '-': // error
		noteError(replyErr, body)
		return v, nil
	case ':': // integer
		n, err := strconv.ParseInt(body, 10, 64)
		if err != nil {
			return v, errProtocol
		}
		v.Kind = fleetstore.RedisInt
		v.Int = n
		return v, nil
	case '$', '=': // bulk string; RESP3 verbatim string ("txt:" prefix)
		s, isNil, err := readBulk(r, body)
		if err != nil || isNil {
			return v, err
		}
		if line[0] == '=' && len(s) >= 4 && s[3] == ':' {
			s = s[4:]
		}
		v.Kind = fleetstore.RedisString
		v.Str = s
		return v, nil
	case '!': // RESP3 bulk error
		s, isNil, err := readBulk(r, body)
		if err != nil {
			return v, err
		}
		if !isNil {
			noteError(replyErr, s)
		}
		return v, nil
	case '*', '~', '>': // array; RESP3 set and push
		return readArray(r, body, 1, depth, replyErr)
	case '%': // RESP3 map: flattened to key, value, key, value
		return readArray(r, body, 2, depth, replyErr)
	case '|': // RESP3 attribute: metadata before the real reply, skipped
		if _, err := readArray(r, body, 2, depth, replyErr); err != nil {
			return v, err
		}
		return readValue(r, depth, replyErr)
	case '_': // RESP3 null
		return v, nil
	case '#': // RESP3 boolean, as integer 1 or 0
		v.Kind = fleetstore.RedisInt
		if body == "t" {
			v.Int = 1
			return v, nil
		}
		if body != "f" {
			return v, errProtocol
		}
		return v, nil
	case ',', '(': // RESP3 double and big number, as their text
		v.Kind = fleetstore.RedisString
		v.Str = body
		return v, nil
	}
	return v, errProtocol
}

// noteError keeps the first error reply met in one reply.
func noteError(replyErr *error, msg string) {
	if *replyErr == nil {
		*replyErr = &Error{msg: msg}
	}
}

// readBulk reads the payload of a bulk reply whose header text is header.
func readBulk(r *bufio.Reader, header string) (string, bool, error) {
	n, err := strconv.Atoi(header)
	if err != nil || n < -1 || n > maxBulkBytes {
		return "", false, errProtocol
	}
	if n == -1 {
		return "", true, nil
	}
	buf := make([]byte, n+2)
	if _, err := io.ReadFull(r, buf); err != nil {
		return "", false, err
	}
	if buf[n] != '\r' || buf[n+1] != '\n' {
		return "", false, errProtocol
	}
	return string(buf[:n]), false, nil
}

// readArray reads count × per elements (per is 2 for a map).
func readArray(r *bufio.Reader, header string, per int, depth int, replyErr *error) (fleetstore.RedisValue, error) {
	var v fleetstore.RedisValue
	n, err := strconv.Atoi(header)
	if err != nil || n < -1 || n > maxArrayElements {
		return v, errProtocol
	}
	if n == -1 {
		return v, nil
	}
	n = n * per
	elems := make([]fleetstore.RedisValue, n)
	for i := 0; i < n; i++ {
		elem, err := readValue(r, depth+1, replyErr)
		if err != nil {
			return v, err
		}
		elems[i] = elem
	}
	v.Kind = fleetstore.RedisArray
	v.Array = elems
	return v, nil
}
