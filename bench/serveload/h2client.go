package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"sync"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2conn is a gRPC client connection made of HTTP/2 frames directly, for
// the one unary call serveload makes: what grpc-go's client does per call
// (a client stream, its context, retry and stats machinery, a goroutine
// hand-off each way) costs the load generator as much CPU as a lean
// service spends deciding, on the cores they share. The service sees the
// same frames a gRPC client sends — HEADERS, one DATA frame with the
// length-prefixed message, and it answers with HEADERS, DATA and trailers
// — so what it does per call is unchanged.
//
// Calls add their frames to a buffer under one lock, and a writer
// goroutine writes whatever has gathered when it gets to run, in one
// system call: the callers the reader has just answered all add theirs
// before it does, so that they share a write, as grpc-go's writer
// goroutine makes them share. One goroutine reads the frames, answers the
// server's SETTINGS and PINGs, keeps the connection's receive window open,
// and hands each stream's answer to its caller.
//
// It speaks only what serveload needs and checks what it gets: a frame it
// cannot use, a GOAWAY or a broken connection fails every call in flight
// and every later one.
type h2conn struct {
	nc        net.Conn
	authority string

	wmu      sync.Mutex
	wcond    sync.Cond    // the send window grows, or the connection fails
	out      appendWriter // frames not yet written
	spare    []byte       // the buffer being written, then out's next
	kicked   bool         // the writer has been told of what is in out
	kick     chan struct{}
	fr       *http2.Framer // writes into out
	henc     *hpack.Encoder
	hbuf     bytes.Buffer
	hdrs     [6]hpack.HeaderField
	nextID   uint32
	sendWin  int64 // the connection's send window, in DATA bytes
	streamWn int64 // each new stream's send window (the server's SETTINGS)

	mu      sync.Mutex
	streams map[uint32]*h2call
	err     error // set once, when the connection is done for
}

// appendWriter gathers what the framer writes.
type appendWriter struct{ b []byte }

func (w *appendWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}

// h2call is one caller's way back from the reading goroutine, reused
// call after call: the reader signals done once per call.
type h2call struct {
	done   chan struct{} // buffered, one
	frame  []byte        // the response's gRPC frame: 5-byte prefix, message
	msg    []byte        // the message, in frame
	status int           // grpc-status of the trailers; -1 until they come
	gmsg   string        // grpc-message
	err    error
}

func newH2call() *h2call { return &h2call{done: make(chan struct{}, 1)} }

// connWindow is the receive window the client gives the connection, and
// refills when half of it is spent: few WINDOW_UPDATE frames, for
// responses of a few hundred bytes.
const connWindow = 1 << 30

func dialH2(addr string) (*h2conn, error) {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &h2conn{nc: nc, authority: addr, nextID: 1, sendWin: 65535, streamWn: 65535, streams: map[uint32]*h2call{}, kick: make(chan struct{}, 1)}
	c.wcond.L = &c.wmu
	c.fr = http2.NewFramer(&c.out, nil)
	c.henc = hpack.NewEncoder(&c.hbuf)
	c.out.b = append(c.out.b, http2.ClientPreface...)
	// Streams get a window far above any response; the connection's is
	// raised at once and refilled as it is spent.
	if err := c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 24},
		http2.Setting{ID: http2.SettingEnablePush, Val: 0}); err != nil {
		nc.Close()
		return nil, err
	}
	if err := c.fr.WriteWindowUpdate(0, connWindow-65535); err != nil {
		nc.Close()
		return nil, err
	}
	if _, err := nc.Write(c.out.b); err != nil {
		nc.Close()
		return nil, err
	}
	c.out.b = c.out.b[:0]
	go c.read()
	go c.write()
	return c, nil
}

// Close closes the connection; calls in flight fail.
func (c *h2conn) Close() error { return c.nc.Close() }

// kickLocked tells the writer that out has frames to write, unless it has
// been told already. Called with wmu held.
func (c *h2conn) kickLocked() {
	if !c.kicked {
		c.kicked = true
		c.kick <- struct{}{}
	}
}

// write writes what gathers in out until the connection fails.
func (c *h2conn) write() {
	for range c.kick {
		// The caller that kicked ran first, readied last by the reader;
		// the others it readied are queued behind the writer. Letting
		// them run first puts their frames in the same write.
		runtime.Gosched()
		c.wmu.Lock()
		buf := c.out.b
		c.out.b, c.kicked = c.spare, false
		c.wmu.Unlock()
		_, err := c.nc.Write(buf)
		c.wmu.Lock()
		c.spare = buf[:0]
		c.wmu.Unlock()
		if err != nil {
			c.fail(err)
			return
		}
	}
}

// grpcFrame returns msg as the body of a gRPC call: a 5-byte prefix (not
// compressed, the length) and the message.
func grpcFrame(msg []byte) []byte {
	b := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

// call sends one request, body (grpcFrame), on a new stream to path and
// waits for the answer, into cl: cl.msg is the response's message.
func (c *h2conn) call(path string, body []byte, cl *h2call) error {
	cl.frame, cl.msg, cl.status, cl.gmsg, cl.err = cl.frame[:0], nil, -1, "", nil
	n := int64(len(body))

	c.wmu.Lock()
	for c.sendWin < n {
		if err := c.failed(); err != nil {
			c.wmu.Unlock()
			return err
		}
		c.wcond.Wait()
	}
	c.sendWin -= n
	if n > c.streamWn {
		c.wmu.Unlock()
		return errors.New("serveload: request larger than the server's stream window")
	}
	id := c.nextID
	c.nextID += 2
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		c.wmu.Unlock()
		return err
	}
	c.streams[id] = cl
	c.mu.Unlock()

	c.hbuf.Reset()
	c.hdrs = [...]hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
		{Name: ":path", Value: path}, {Name: ":authority", Value: c.authority},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
	}
	for _, f := range c.hdrs {
		c.henc.WriteField(f)
	}
	err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true})
	if err == nil {
		err = c.fr.WriteData(id, true, body) // copied into out
	}
	if err == nil {
		c.kickLocked()
	}
	c.wmu.Unlock()
	if err != nil {
		c.fail(err)
	}
	<-cl.done
	if cl.err != nil {
		return cl.err
	}
	if cl.status != 0 {
		return fmt.Errorf("serveload: grpc-status %d: %s", cl.status, cl.gmsg)
	}
	return nil
}

// failed returns why the connection is done for, or nil.
func (c *h2conn) failed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// fail ends the connection with err: every call in flight gets it.
func (c *h2conn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	for id, cl := range c.streams {
		cl.err = c.err
		delete(c.streams, id)
		cl.done <- struct{}{}
	}
	c.mu.Unlock()
	c.nc.Close()
	c.wmu.Lock()
	c.wcond.Broadcast()
	c.wmu.Unlock()
}

// read reads the server's frames until the connection ends.
func (c *h2conn) read() {
	fr := http2.NewFramer(nil, bufio.NewReaderSize(c.nc, 64<<10))
	fr.SetReuseFrames()
	// The decoder's emit function writes into the stream being decoded.
	var cur *h2call
	dec := hpack.NewDecoder(4096, func(f hpack.HeaderField) {
		if cur == nil {
			return
		}
		switch f.Name {
		case "grpc-status":
			if s, err := strconv.Atoi(f.Value); err == nil {
				cur.status = s
			}
		case "grpc-message":
			cur.gmsg = f.Value
		}
	})
	var unacked int64 // DATA bytes received since the last WINDOW_UPDATE
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				err = errors.New("serveload: connection closed")
			}
			c.fail(err)
			return
		}
		if err := c.frame(f, dec, &cur, &unacked); err != nil {
			c.fail(err)
			return
		}
	}
}

// frame handles one frame from the server.
func (c *h2conn) frame(f http2.Frame, dec *hpack.Decoder, cur **h2call, unacked *int64) error {
	switch f := f.(type) {
	case *http2.HeadersFrame:
		if !f.HeadersEnded() {
			return errors.New("serveload: CONTINUATION frames are not supported")
		}
		cl := c.stream(f.StreamID, false)
		*cur = cl
		_, err := dec.Write(f.HeaderBlockFragment())
		*cur = nil
		if err != nil {
			return fmt.Errorf("serveload: response headers: %w", err)
		}
		if f.StreamEnded() && cl != nil {
			c.finish(f.StreamID)
		}
	case *http2.DataFrame:
		if n := int64(f.Length); n > 0 {
			*unacked += n
			if *unacked >= connWindow/2 {
				if err := c.control(func() error { return c.fr.WriteWindowUpdate(0, uint32(*unacked)) }); err != nil {
					return err
				}
				*unacked = 0
			}
		}
		if cl := c.stream(f.StreamID, false); cl != nil {
			cl.frame = append(cl.frame, f.Data()...)
			if f.StreamEnded() {
				c.finish(f.StreamID)
			}
		}
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
			c.wmu.Lock()
			c.streamWn = int64(v)
			c.wmu.Unlock()
		}
		return c.control(c.fr.WriteSettingsAck)
	case *http2.PingFrame:
		if !f.IsAck() {
			data := f.Data
			return c.control(func() error { return c.fr.WritePing(true, data) })
		}
	case *http2.WindowUpdateFrame:
		if f.StreamID == 0 {
			c.wmu.Lock()
			c.sendWin += int64(f.Increment)
			c.wcond.Broadcast()
			c.wmu.Unlock()
		}
	case *http2.RSTStreamFrame:
		if cl := c.stream(f.StreamID, true); cl != nil {
			cl.err = fmt.Errorf("serveload: stream reset: %v", f.ErrCode)
			cl.done <- struct{}{}
		}
	case *http2.GoAwayFrame:
		return fmt.Errorf("serveload: GOAWAY: %v", f.ErrCode)
	}
	return nil
}

// control writes a frame of the connection's own (an ACK, a window
// update) with the calls' frames.
func (c *h2conn) control(write func() error) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := write(); err != nil {
		return err
	}
	c.kickLocked()
	return nil
}

// stream returns the call waiting on stream id, or nil; remove takes it
// out.
func (c *h2conn) stream(id uint32, remove bool) *h2call {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl := c.streams[id]
	if remove {
		delete(c.streams, id)
	}
	return cl
}

// finish hands stream id's answer to its caller: the message, with its
// 5-byte prefix checked and cut, and the trailers' status.
func (c *h2conn) finish(id uint32) {
	cl := c.stream(id, true)
	if cl == nil {
		return
	}
	switch {
	case cl.status < 0:
		cl.err = errors.New("serveload: stream ended without grpc-status")
	case cl.status != 0:
	case len(cl.frame) < 5 || cl.frame[0] != 0 || int(binary.BigEndian.Uint32(cl.frame[1:5])) != len(cl.frame)-5:
		cl.err = errors.New("serveload: response is not one uncompressed gRPC message")
	default:
		cl.msg = cl.frame[5:]
	}
	cl.done <- struct{}{}
}
