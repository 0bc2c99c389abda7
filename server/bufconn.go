package server

import (
	"bufio"
	"net"
)

// connReadBuffer is the read buffer of each accepted connection: about
// 150 heartbeat frames, and the size net/http gives HTTP/1.1 connections.
const connReadBuffer = 4 << 10

// bufferedListener gives every accepted connection a read buffer. net/http's
// HTTP/2 server reads frames straight from the connection, a frame header
// and then its payload, so each small frame (a unary request is at least
// two; a heartbeat on a KeepAlive stream is one) costs two read system
// calls. Through the buffer, the frames that have arrived are read with
// one.
type bufferedListener struct {
	net.Listener
}

func (l bufferedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &bufferedConn{Conn: c, r: bufio.NewReaderSize(c, connReadBuffer)}, nil
}

// bufferedConn reads through r and writes straight to the connection.
// Like any net.Conn, it allows one reader and one writer at a time.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite keeps net/http's half-close on HTTP/1.1 connections working:
// it finds the method with a type assertion on the connection.
func (c *bufferedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
