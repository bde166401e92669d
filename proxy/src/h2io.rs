//! Bodies in and out of h2 streams, on both sides of the proxy: [`H2Body`]
//! reads a stream (kubelet's request, the runtime's answer) and credits the
//! peer's window as each chunk is taken; [`pipe`] writes a body into a stream
//! (a request to the runtime, an answer to kubelet) as the peer's window allows.
//!
//! One implementation for both directions, so flow control, resets and
//! cancellation behave the same way whichever peer is slow or goes away.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame};

/// A received h2 stream as an HTTP body: its window is credited back as each
/// chunk is taken (so a reader that stops reading stops this stream only).
pub struct H2Body {
    recv: h2::RecvStream,
    data_done: bool,
    done: bool,
    /// Dropped with the body: stops the pump of the request this answers.
    _cancel: Option<tokio::sync::oneshot::Sender<()>>,
}

impl H2Body {
    pub fn new(recv: h2::RecvStream) -> Self {
        Self {
            recv,
            data_done: false,
            done: false,
            _cancel: None,
        }
    }

    /// A body whose drop sends on `cancel` (ends the matching request's pipe).
    pub(crate) fn with_cancel(
        recv: h2::RecvStream,
        cancel: tokio::sync::oneshot::Sender<()>,
    ) -> Self {
        Self {
            _cancel: Some(cancel),
            ..Self::new(recv)
        }
    }
}

impl HttpBody for H2Body {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        if !self.data_done {
            match ready!(self.recv.poll_data(cx)) {
                Some(Ok(b)) => {
                    let _ = self.recv.flow_control().release_capacity(b.len());
                    return Poll::Ready(Some(Ok(Frame::data(b))));
                }
                Some(Err(e)) => {
                    self.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                None => self.data_done = true,
            }
        }
        let t = ready!(self.recv.poll_trailers(cx));
        self.done = true;
        match t {
            Ok(Some(t)) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e))),
        }
    }

    fn is_end_stream(&self) -> bool {
        // h2 knows before the body is polled when the stream was one HEADERS
        // frame with END_STREAM (gRPC's trailers-only error answer): it is then
        // sent on the same way, and the client reads the status from it
        self.done || self.recv.is_end_stream()
    }
}

/// How a [`pipe`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PipeEnd {
    /// The whole body went out (END_STREAM sent, on data or trailers).
    Sent,
    /// `cancel` fired: the stream was reset with CANCEL.
    Cancelled,
    /// The peer reset the stream, or it closed under us.
    PeerGone,
    /// The body failed: the stream was reset with the given reason.
    BodyFailed,
}

/// Writes `body` into `send` until its end, then closes the stream.
///
/// A frame is taken from `body` first and only then is window asked for (one
/// byte of it: h2 raises the claim to the chunk's length as it sends), so a
/// body that has nothing to send pins no connection window; the next frame is
/// taken only once the chunk went to h2. No more is taken than the peer's window
/// (and h2's send buffer) has room for, so a peer that stops reading stops the
/// body's source too (an [`H2Body`] then stops crediting its own peer). A body
/// whose frames are ready (a unary answer: data then trailers) goes out without
/// a wait in between (trailers are not flow-controlled), so h2 writes it with
/// its HEADERS in one write.
///
/// It stops when `cancel` fires (resetting the stream with CANCEL), when the
/// peer resets the stream, or when the body fails: the stream is then reset
/// with the reason of the HTTP/2 error behind the failure (a runtime's
/// REFUSED_STREAM reaches kubelet as REFUSED_STREAM), or `on_error`.
pub async fn pipe<B>(
    mut body: B,
    send: &mut h2::SendStream<Bytes>,
    mut cancel: Option<tokio::sync::oneshot::Receiver<()>>,
    on_error: h2::Reason,
) -> PipeEnd
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<crate::pipeline::BoxError>,
{
    enum Stop {
        Cancelled,
        PeerGone,
    }
    // checked on every wait
    fn stopped(
        send: &mut h2::SendStream<Bytes>,
        cancel: &mut Option<tokio::sync::oneshot::Receiver<()>>,
        cx: &mut Context<'_>,
    ) -> Option<Stop> {
        if let Some(c) = cancel {
            if Pin::new(c).poll(cx).is_ready() {
                return Some(Stop::Cancelled);
            }
        }
        if send.poll_reset(cx).is_ready() {
            return Some(Stop::PeerGone);
        }
        None
    }
    let end = |send: &mut h2::SendStream<Bytes>, why: Stop| match why {
        Stop::Cancelled => {
            send.send_reset(h2::Reason::CANCEL);
            PipeEnd::Cancelled
        }
        Stop::PeerGone => PipeEnd::PeerGone,
    };
    loop {
        let next = poll_fn(|cx| {
            if let Some(why) = stopped(send, &mut cancel, cx) {
                return Poll::Ready(Err(why));
            }
            Pin::new(&mut body).poll_frame(cx).map(Ok)
        })
        .await;
        let frame = match next {
            Err(why) => return end(send, why),
            Ok(None) => {
                return match send.send_data(Bytes::new(), true) {
                    Ok(()) => PipeEnd::Sent,
                    Err(_) => PipeEnd::PeerGone,
                }
            }
            Ok(Some(Ok(f))) => f,
            Ok(Some(Err(e))) => {
                let e: crate::pipeline::BoxError = e.into();
                send.send_reset(reason_behind(&*e).unwrap_or(on_error));
                return PipeEnd::BodyFailed;
            }
        };
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    send.reserve_capacity(0);
                    return match send.send_trailers(t) {
                        Ok(()) => PipeEnd::Sent,
                        Err(_) => {
                            send.send_reset(h2::Reason::INTERNAL_ERROR);
                            PipeEnd::BodyFailed
                        }
                    };
                }
                continue;
            }
        };
        let last = body.is_end_stream();
        if data.is_empty() && !last {
            continue;
        }
        if !data.is_empty() {
            // room for this chunk: at once while the windows are open; what
            // exceeds the window waits in h2 (one chunk at most)
            send.reserve_capacity(1);
            if send.capacity() == 0 {
                let room = poll_fn(|cx| {
                    if let Some(why) = stopped(send, &mut cancel, cx) {
                        return Poll::Ready(Err(why));
                    }
                    match send.poll_capacity(cx) {
                        Poll::Ready(Some(Ok(_))) => Poll::Ready(Ok(true)),
                        // the stream is closed or broken
                        Poll::Ready(_) => Poll::Ready(Ok(false)),
                        Poll::Pending => Poll::Pending,
                    }
                })
                .await;
                match room {
                    Err(why) => return end(send, why),
                    Ok(false) => return PipeEnd::PeerGone,
                    Ok(true) => {}
                }
            }
        }
        if send.send_data(data, last).is_err() {
            return PipeEnd::PeerGone;
        }
        if last {
            return PipeEnd::Sent;
        }
    }
}

/// The reason of the HTTP/2 error somewhere behind `e` (a peer's reset, as h2
/// reports it under a gRPC status or a boxed error).
/// The reset of one stream behind an error, if that is what it is: the
/// runtime's RST_STREAM with its reason, or h2 refusing the runtime's answer
/// on that stream (PROTOCOL_ERROR: the client's own HTTP/2 would have refused
/// it too). Not a dead connection (GOAWAY, I/O).
pub fn reset_behind(e: &(dyn std::error::Error + 'static)) -> Option<h2::Reason> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<h2::Error>() {
            if !h.is_reset() {
                return None;
            }
            return Some(if h.is_remote() {
                h.reason().unwrap_or(h2::Reason::INTERNAL_ERROR)
            } else {
                h2::Reason::PROTOCOL_ERROR
            });
        }
        cur = err.source();
    }
    None
}

fn reason_behind(e: &(dyn std::error::Error + 'static)) -> Option<h2::Reason> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<h2::Error>() {
            return h.reason();
        }
        cur = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::BoxError;
    use http_body_util::StreamBody;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};

    type Frames = tokio::sync::mpsc::Sender<Result<Frame<Bytes>, BoxError>>;
    type TestBody =
        StreamBody<tokio_stream::wrappers::ReceiverStream<Result<Frame<Bytes>, BoxError>>>;

    fn body() -> (Frames, TestBody) {
        body_of(1024)
    }

    fn body_of(buffer: usize) -> (Frames, TestBody) {
        let (tx, rx) = tokio::sync::mpsc::channel(buffer);
        (
            tx,
            StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx)),
        )
    }

    /// The server's side of the wire, counting its writes.
    struct Counting(DuplexStream, Arc<AtomicUsize>);
    impl AsyncRead for Counting {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            b: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.0).poll_read(cx, b)
        }
    }
    impl AsyncWrite for Counting {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            b: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let r = Pin::new(&mut self.0).poll_write(cx, b);
            if matches!(r, Poll::Ready(Ok(_))) {
                self.1.fetch_add(1, Ordering::SeqCst);
            }
            r
        }
        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.0).poll_flush(cx)
        }
        fn poll_shutdown(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.0).poll_shutdown(cx)
        }
    }

    /// A client and a server h2 connection on an in-memory pipe, the client's
    /// windows `window` bytes; returns the client's sender, the server's first
    /// request's responder and the server's write counter.
    async fn pair(
        window: u32,
    ) -> (
        h2::client::SendRequest<Bytes>,
        h2::client::ResponseFuture,
        h2::server::SendResponse<Bytes>,
        Arc<AtomicUsize>,
    ) {
        let (a, b) = tokio::io::duplex(8 << 20);
        let writes = Arc::new(AtomicUsize::new(0));
        let server_io = Counting(b, writes.clone());
        let server = tokio::spawn(async move {
            let mut conn = h2::server::handshake(server_io).await.unwrap();
            let (_req, respond) = conn.accept().await.unwrap().unwrap();
            let (tx, rx) = tokio::sync::oneshot::channel();
            let _ = tx.send(respond);
            tokio::spawn(async move { while conn.accept().await.is_some() {} });
            rx.await.unwrap()
        });
        let (client, conn) = h2::client::Builder::new()
            .initial_window_size(window)
            .initial_connection_window_size(window)
            .handshake::<_, Bytes>(a)
            .await
            .unwrap();
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut client = client.ready().await.unwrap();
        let (answer, _) = client
            .send_request(http::Request::post("http://x/a").body(()).unwrap(), true)
            .unwrap();
        let respond = server.await.unwrap();
        (client, answer, respond, writes)
    }

    #[tokio::test]
    async fn a_ready_answer_leaves_in_one_write_with_its_headers() {
        let (_c, answer, mut respond, writes) = pair(1 << 20).await;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let before = writes.load(Ordering::SeqCst);
        let (tx, b) = body();
        tx.send(Ok(Frame::data(Bytes::from_static(b"hello"))))
            .await
            .unwrap();
        let mut t = http::HeaderMap::new();
        t.insert("grpc-status", "0".parse().unwrap());
        tx.send(Ok(Frame::trailers(t))).await.unwrap();
        drop(tx);
        let mut send = respond
            .send_response(http::Response::new(()), false)
            .unwrap();
        assert_eq!(
            pipe(b, &mut send, None, h2::Reason::INTERNAL_ERROR).await,
            PipeEnd::Sent
        );
        let resp = answer.await.unwrap();
        let mut recv = resp.into_body();
        assert_eq!(
            recv.data().await.unwrap().unwrap(),
            Bytes::from_static(b"hello")
        );
        assert!(recv.data().await.is_none());
        let trailers = recv.trailers().await.unwrap().unwrap();
        assert_eq!(trailers["grpc-status"], "0");
        assert_eq!(
            writes.load(Ordering::SeqCst) - before,
            1,
            "HEADERS, DATA and trailers in one write"
        );
    }

    #[tokio::test]
    async fn a_reader_that_stops_stops_the_source() {
        let (_c, answer, mut respond, _) = pair(65_535).await;
        let (tx, b) = body_of(1);
        let taken = Arc::new(AtomicUsize::new(0));
        let feeder = {
            let taken = taken.clone();
            tokio::spawn(async move {
                for _ in 0..64 {
                    // the channel holds one: each send waits until pipe took the one before
                    if tx
                        .send(Ok(Frame::data(Bytes::from(vec![7u8; 32 << 10]))))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    taken.fetch_add(1, Ordering::SeqCst);
                }
                let mut t = http::HeaderMap::new();
                t.insert("grpc-status", "0".parse().unwrap());
                let _ = tx.send(Ok(Frame::trailers(t))).await;
            })
        };
        let mut send = respond
            .send_response(http::Response::new(()), false)
            .unwrap();
        let piping =
            tokio::spawn(async move { pipe(b, &mut send, None, h2::Reason::INTERNAL_ERROR).await });
        let resp = answer.await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        // 64 KiB of window, one chunk held beyond it, and the channel's buffer
        let stalled = taken.load(Ordering::SeqCst);
        assert!(
            stalled < 64,
            "the source ran on with the reader stopped: {stalled} chunks"
        );
        let mut recv = resp.into_body();
        let mut got = 0usize;
        while let Some(d) = recv.data().await {
            let d = d.unwrap();
            got += d.len();
            recv.flow_control().release_capacity(d.len()).unwrap();
        }
        assert_eq!(got, 64 * (32 << 10));
        assert!(recv.trailers().await.unwrap().is_some());
        assert_eq!(piping.await.unwrap(), PipeEnd::Sent);
        feeder.await.unwrap();
    }

    #[tokio::test]
    async fn a_body_error_resets_with_the_reason_behind_it() {
        let (_c, answer, mut respond, _) = pair(1 << 20).await;
        let (tx, b) = body();
        tx.send(Ok(Frame::data(Bytes::from_static(b"part"))))
            .await
            .unwrap();
        let status =
            tonic::Status::from_error(Box::new(h2::Error::from(h2::Reason::REFUSED_STREAM)));
        tx.send(Err(Box::new(status))).await.unwrap();
        let mut send = respond
            .send_response(http::Response::new(()), false)
            .unwrap();
        assert_eq!(
            pipe(b, &mut send, None, h2::Reason::INTERNAL_ERROR).await,
            PipeEnd::BodyFailed
        );
        // the reset may overtake the answer's HEADERS and data
        let err = match answer.await {
            Err(e) => e,
            Ok(r) => {
                let mut recv = r.into_body();
                loop {
                    match recv.data().await {
                        Some(Ok(_)) => continue,
                        Some(Err(e)) => break e,
                        None => break recv.trailers().await.unwrap_err(),
                    }
                }
            }
        };
        assert_eq!(err.reason(), Some(h2::Reason::REFUSED_STREAM));

        // an error with no HTTP/2 reason behind it: the given one
        let (_c, answer, mut respond, _) = pair(1 << 20).await;
        let (tx, b) = body();
        tx.send(Err("broken".into())).await.unwrap();
        let mut send = respond
            .send_response(http::Response::new(()), false)
            .unwrap();
        pipe(b, &mut send, None, h2::Reason::INTERNAL_ERROR).await;
        let e = match answer.await {
            Err(e) => e,
            Ok(r) => {
                let mut recv = r.into_body();
                match recv.data().await {
                    Some(Err(e)) => e,
                    _ => recv.trailers().await.unwrap_err(),
                }
            }
        };
        assert_eq!(e.reason(), Some(h2::Reason::INTERNAL_ERROR));
    }

    #[tokio::test]
    async fn cancel_resets_the_stream_and_a_peer_reset_ends_the_pipe() {
        let (_c, answer, mut respond, _) = pair(1 << 20).await;
        let (_tx, b) = body();
        let (cancel, cancelled) = tokio::sync::oneshot::channel();
        let mut send = respond
            .send_response(http::Response::new(()), false)
            .unwrap();
        let piping = tokio::spawn(async move {
            pipe(b, &mut send, Some(cancelled), h2::Reason::INTERNAL_ERROR).await
        });
        drop(cancel);
        assert_eq!(piping.await.unwrap(), PipeEnd::Cancelled);
        let e = answer
            .await
            .unwrap()
            .into_body()
            .data()
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(e.reason(), Some(h2::Reason::CANCEL));

        // the reader goes away: the pipe ends (it does not wait on the body forever)
        let (_c, answer, mut respond, _) = pair(1 << 20).await;
        let (_tx, b) = body();
        let mut send = respond
            .send_response(http::Response::new(()), false)
            .unwrap();
        let piping =
            tokio::spawn(async move { pipe(b, &mut send, None, h2::Reason::INTERNAL_ERROR).await });
        drop(answer.await.unwrap());
        let end = tokio::time::timeout(std::time::Duration::from_secs(5), piping).await;
        assert_eq!(end.expect("pipe ended").unwrap(), PipeEnd::PeerGone);
    }
}
