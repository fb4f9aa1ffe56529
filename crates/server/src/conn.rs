//! The connections: an accept loop over hyper's HTTP/1 connections with the deadlines
//! and the cap that keep slow, idle or numerous clients from holding the server.
//!
//! - A request head must arrive whole within `header_timeout`: from the connect for a
//!   connection's first request, from its first byte for a later one (a client that
//!   trickles a byte a second is cut at the deadline, whatever each read takes).
//! - A kept-alive connection waiting for its next request is closed after `idle_timeout`.
//! - A client that stops taking its answer for `body_timeout` is cut (the body's own
//!   deadline is `read_body`'s, which answers 408).
//! - Past `max_connections`, a new connection makes room by closing the connection that
//!   has waited longest without a request in progress; when every connection is serving
//!   a request it gets a quick 503 instead. A fresh client is thus always let in while
//!   idle or slow sockets fill the cap.
//! - A client that half-closes after a complete request still gets its answer: the end
//!   of its stream is held back from hyper (which would take it as a hang-up) while a
//!   request is served, and the handler is told instead ([`PeerEof`]), so it can find
//!   out by writing whether the client is still there. (A body cut short by the end of
//!   stream thus ends at the body deadline, with a 408.)
//! - At shutdown, connections with no request in progress, or still sending one, are
//!   closed at once; the others finish their answer, and whatever is still open when
//!   `serve_connections`' drain deadline passes is dropped.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use hyper::body::{Body as _, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower_service::Service;

/// How long connections may take, and how many there may be.
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// Open connections beyond which the longest-idle one is closed for a new one (or the
    /// new one gets a 503 when none is idle).
    pub max_connections: usize,
    /// The whole request head, from the connect (first request) or its first byte.
    pub header_timeout: Duration,
    /// The whole request body (`read_body`), and any stall of a client taking its answer.
    pub body_timeout: Duration,
    /// A kept-alive connection's wait for its next request.
    pub idle_timeout: Duration,
}

impl Default for ConnLimits {
    fn default() -> ConnLimits {
        ConnLimits {
            max_connections: 512,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// The address a connection came in on (a request extension): a Host naming this
/// address is this server.
#[derive(Clone, Copy, Debug)]
pub struct LocalAddr(pub SocketAddr);

/// Where one connection is.
struct Phase {
    /// A request's head has been read and its answer is not yet all handed to hyper.
    busy: bool,
    /// That request's body has been read to its end.
    body_done: bool,
    /// No request has been served on this connection yet.
    first: bool,
    /// Since when the connection waits for its next request.
    since: Instant,
    /// When the first byte of the next request's head arrived.
    first_byte: Option<Instant>,
    /// Since when a write has been waiting for the client to take bytes.
    write_stalled: Option<Instant>,
    /// The client's end of stream, held back from hyper while a request is served.
    eof_held: bool,
    /// hyper's read, parked while the end of stream is held.
    read_waker: Option<Waker>,
}

/// One connection's state, shared by its task, its IO, and the request it serves.
struct Tracker {
    phase: Mutex<Phase>,
    /// Wakes the connection's task to look at its deadline again.
    changed: Notify,
    evicted: AtomicBool,
    peer_eof: AtomicBool,
    peer_eof_seen: Notify,
}

impl Tracker {
    fn new() -> Tracker {
        Tracker {
            phase: Mutex::new(Phase {
                busy: false,
                body_done: false,
                first: true,
                since: Instant::now(),
                first_byte: None,
                write_stalled: None,
                eof_held: false,
                read_waker: None,
            }),
            changed: Notify::new(),
            evicted: AtomicBool::new(false),
            peer_eof: AtomicBool::new(false),
            peer_eof_seen: Notify::new(),
        }
    }

    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// When the connection is over its time, as things stand (`None`: no deadline).
    fn deadline(&self, l: &ConnLimits) -> Option<Instant> {
        let p = self.phase();
        if p.busy {
            return p.write_stalled.map(|t| t + l.body_timeout);
        }
        Some(match (p.first, p.first_byte) {
            (true, _) => p.since + l.header_timeout,
            (false, Some(t)) => t + l.header_timeout,
            (false, None) => p.since + l.idle_timeout,
        })
    }

    /// A request's head has been read.
    fn begin_request(&self, body_done: bool) {
        let mut p = self.phase();
        p.busy = true;
        p.body_done = body_done;
        p.first_byte = None;
        p.write_stalled = None;
    }

    /// Its answer has been handed over (or dropped).
    fn end_request(&self) {
        let waker = {
            let mut p = self.phase();
            p.busy = false;
            p.body_done = false;
            p.first = false;
            p.since = Instant::now();
            p.first_byte = None;
            p.write_stalled = None;
            p.read_waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
        self.changed.notify_one();
    }

    /// Nothing in progress that shutdown should wait for: no request, or one whose
    /// body is still coming.
    fn stalled_or_idle(&self) -> bool {
        let p = self.phase();
        !p.busy || !p.body_done
    }

    fn evict(&self) {
        self.evicted.store(true, Ordering::SeqCst);
        self.changed.notify_one();
    }
}

/// Tells a handler that its client has ended its side of the connection after sending
/// its request: either it half-closed and still reads, or it is gone, which only a write
/// can tell (a request extension).
#[derive(Clone)]
pub struct PeerEof(Arc<Tracker>);

impl PeerEof {
    /// Resolves once the client's end of stream has arrived.
    pub async fn ended(&self) {
        loop {
            let seen = self.0.peer_eof_seen.notified();
            tokio::pin!(seen);
            seen.as_mut().enable();
            if self.0.peer_eof.load(Ordering::SeqCst) {
                return;
            }
            seen.await;
        }
    }
}

/// The socket, watched: the first byte of a head, writes the client does not take,
/// and its end of stream.
struct TrackedIo {
    inner: TcpStream,
    t: Arc<Tracker>,
}

impl AsyncRead for TrackedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        {
            let mut p = self.t.phase();
            if p.eof_held {
                if p.busy {
                    p.read_waker = Some(cx.waker().clone());
                    return Poll::Pending;
                }
                // the answer is out: now hyper may see the end and close
                return Poll::Ready(Ok(()));
            }
        }
        let before = buf.filled().len();
        let res = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = res {
            let n = buf.filled().len() - before;
            let mut p = self.t.phase();
            // held even before the handler has read the body to its end: hyper may
            // hold all of it unread, and a body cut short ends at the body deadline
            if n == 0 && p.busy {
                p.eof_held = true;
                p.read_waker = Some(cx.waker().clone());
                drop(p);
                self.t.peer_eof.store(true, Ordering::SeqCst);
                self.t.peer_eof_seen.notify_waiters();
                return Poll::Pending;
            }
            if n > 0 && !p.busy && p.first_byte.is_none() {
                p.first_byte = Some(Instant::now());
            }
        }
        res
    }
}

impl TrackedIo {
    fn note_write<T>(&self, res: &Poll<io::Result<T>>) {
        let mut p = self.t.phase();
        match res {
            Poll::Pending if p.write_stalled.is_none() => {
                p.write_stalled = Some(Instant::now());
                drop(p);
                self.t.changed.notify_one();
            }
            Poll::Pending => {}
            Poll::Ready(_) => p.write_stalled = None,
        }
    }
}

impl AsyncWrite for TrackedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let res = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.note_write(&res);
        res
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let res = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.note_write(&res);
        res
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A request body that says when it has been read to its end.
struct TrackedBody {
    inner: Incoming,
    t: Arc<Tracker>,
}

impl hyper::body::Body for TrackedBody {
    type Data = hyper::body::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let res = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(res, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.t.phase().body_done = true;
        }
        res
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// An answer's body that ends its request's busy time when hyper is done with it.
struct TrackedAnswer {
    inner: Body,
    _served: Served,
}

/// Ends the request when dropped (the answer handed over, or the handler dropped).
struct Served(Arc<Tracker>);

impl Drop for Served {
    fn drop(&mut self) {
        self.0.end_request();
    }
}

impl hyper::body::Body for TrackedAnswer {
    type Data = hyper::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The open connections.
#[derive(Default)]
struct Registry {
    conns: Mutex<HashMap<u64, Arc<Tracker>>>,
    next_id: AtomicU64,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Tracker>>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes room for one more connection: true if there is (or now will be) room.
    fn make_room(&self, max: usize) -> bool {
        let conns = self.lock();
        if conns.len() < max {
            return true;
        }
        let victim = conns
            .values()
            .filter(|t| !t.evicted.load(Ordering::SeqCst))
            .filter_map(|t| {
                let p = t.phase();
                (!p.busy).then_some((p.since, t))
            })
            .min_by_key(|(since, _)| *since);
        match victim {
            Some((_, t)) => {
                t.evict();
                true
            }
            None => false,
        }
    }

    fn add(self: &Arc<Self>, t: Arc<Tracker>) -> Registered {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, t);
        Registered {
            id,
            registry: self.clone(),
        }
    }

    fn all(&self) -> Vec<Arc<Tracker>> {
        self.lock().values().cloned().collect()
    }
}

/// A connection's place in the registry, given up when its task ends (or is aborted).
struct Registered {
    id: u64,
    registry: Arc<Registry>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.id);
    }
}

/// hyper's read buffer per connection, the most a request head may take.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Quick refusals in flight at most; past them a connection is closed unanswered.
const MAX_REFUSING: usize = 64;

/// Serves `app` on `listener` until `shutdown` resolves; then stops accepting, closes the
/// connections with no request in progress, lets the others finish for at most `drain`,
/// and returns.
pub async fn serve_connections(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    shutdown: impl std::future::Future<Output = ()>,
    drain: Duration,
) -> io::Result<()> {
    let registry = Arc::new(Registry::default());
    let refusing = Arc::new(AtomicUsize::new(0));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    if registry.make_room(limits.max_connections) {
                        let t = Arc::new(Tracker::new());
                        let registered = registry.add(t.clone());
                        let app = app.clone();
                        let stop = stop_rx.clone();
                        tasks.spawn(async move {
                            let _registered = registered;
                            connection(stream, t, app, limits, stop).await;
                        });
                    } else if refusing.load(Ordering::SeqCst) < MAX_REFUSING {
                        refusing.fetch_add(1, Ordering::SeqCst);
                        let refusing = refusing.clone();
                        let max = limits.max_connections;
                        tokio::spawn(async move {
                            refuse(stream, max).await;
                            refusing.fetch_sub(1, Ordering::SeqCst);
                        });
                    }
                }
                Err(e) => {
                    // out of descriptors (EMFILE, ENFILE on Linux): free the longest-idle
                    // connection; whatever failed, let the loop breathe rather than spin
                    tracing::warn!("accepting a connection: {e}");
                    if matches!(e.raw_os_error(), Some(23 | 24)) {
                        registry.make_room(0);
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    for t in registry.all() {
        t.changed.notify_one();
    }
    let deadline = Instant::now() + drain;
    loop {
        tokio::select! {
            next = tasks.join_next() => if next.is_none() { break },
            _ = tokio::time::sleep_until(deadline) => {
                tracing::warn!("{} connection(s) still open at the end of the shutdown: closed", tasks.len());
                tasks.abort_all();
                while tasks.join_next().await.is_some() {}
                break;
            }
        }
    }
    Ok(())
}

/// One connection, from its accept to its close.
async fn connection(
    stream: TcpStream,
    t: Arc<Tracker>,
    app: Router,
    limits: ConnLimits,
    mut stop: watch::Receiver<bool>,
) {
    let local = stream.local_addr().ok();
    let _ = stream.set_nodelay(true);
    let io = TokioIo::new(TrackedIo {
        inner: stream,
        t: t.clone(),
    });
    let tracker = t.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let t = tracker.clone();
        let mut app = app.clone();
        // at the call, not at the future's first poll: hyper may read on before that
        t.begin_request(req.body().is_end_stream());
        let served = Served(t.clone());
        async move {
            let mut req = req.map(|inner| {
                Body::new(TrackedBody {
                    inner,
                    t: t.clone(),
                })
            });
            req.extensions_mut().insert(PeerEof(t.clone()));
            if let Some(addr) = local {
                req.extensions_mut().insert(LocalAddr(addr));
            }
            let resp = match app.call(req).await {
                Ok(r) => r,
                Err(never) => match never {},
            };
            Ok::<_, Infallible>(resp.map(|inner| TrackedAnswer {
                inner,
                _served: served,
            }))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    // the head's deadline is ours (it must also cover the wait before a first request)
    builder.timer(TokioTimer::new()).header_read_timeout(None);
    // a head over 64 KiB is refused (431) rather than buffered: hyper's default of about
    // 400 KiB per connection would let a full cap of slow heads hold 200 MiB
    builder.max_buf_size(MAX_HEAD_BYTES);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let mut draining = false;
    loop {
        if t.evicted.load(Ordering::SeqCst) {
            return;
        }
        if draining && t.stalled_or_idle() {
            return;
        }
        let deadline = t.deadline(&limits);
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = t.changed.notified() => {}
            _ = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            } => {
                // the deadline may have moved since it was read
                if t.deadline(&limits).is_some_and(|d| d <= Instant::now()) {
                    return;
                }
            }
            _ = stop.changed(), if !draining => {
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// The answer to a connection past the cap when every connection is serving a request:
/// a 503, the request read for at most a second so that the close does not reset the
/// answer away.
async fn refuse(mut stream: TcpStream, max: usize) {
    let body = serde_json::json!({"error": {
        "message": format!("the server has {max} connections serving requests (--max-connections): retry later"),
        "type": "unavailable_error",
        "param": null,
        "code": "server_busy",
    }})
    .to_string();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        loop {
            use tokio::io::AsyncReadExt;
            if stream.read(&mut sink).await? == 0 {
                return Ok::<_, io::Error>(());
            }
        }
    })
    .await;
}
