package api

import (
	"bufio"
	"io"
	"net"
)

// net/http's HTTP/2 server reads each frame from its connection with two
// reads, the 9-byte header and then the payload, straight from the
// net.Conn: two read syscalls per frame, four per call on the session
// stream. Over TLS the record layer already reads what is there; without
// TLS, readBuffered gives each connection a read buffer, so a frame that
// arrived whole (and the frames that arrived with it) costs one read.

// readBufferSize is each plaintext connection's read buffer: a session
// stream frame is a few hundred bytes; larger reads bypass the buffer.
const readBufferSize = 4 << 10

// readBuffered wraps l so that every connection it accepts reads through
// a buffer.
func readBuffered(l net.Listener) net.Listener { return bufListener{l} }

// bufListener is readBuffered's listener.
type bufListener struct{ net.Listener }

// Accept implements net.Listener.
func (l bufListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &bufConn{Conn: c, r: bufio.NewReaderSize(c, readBufferSize)}, nil
}

// bufConn is a connection that reads through r. It keeps the half-close
// and the sendfile path of the connection it wraps, which net/http uses
// when the connection has them.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

// Read implements net.Conn.
func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite half-closes the connection when it can (net/http's graceful
// end of an HTTP/1.1 connection).
func (c *bufConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// ReadFrom lets a large HTTP/1.1 response (a backup download) use the
// connection's own ReadFrom (sendfile) when it has one.
func (c *bufConn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}
