//! A raw HTTP/2 gRPC client over a unix socket: sends exactly the bytes and
//! headers a test gives it and returns exactly what came back.

use std::path::Path;

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, Request};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};

/// One HTTP/2 connection (a clone calls on the same connection).
#[derive(Clone)]
pub struct RawClient {
    sender: SendRequest<Full<Bytes>>,
}

/// Everything a call returned.
#[derive(Debug)]
pub struct RawResponse {
    pub status: http::StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
}

impl RawResponse {
    /// grpc-status and grpc-message, from trailers or (trailers-only) headers.
    pub fn grpc_status(&self) -> Option<(i32, String)> {
        let from = |m: &HeaderMap| {
            let code = m.get("grpc-status")?.to_str().ok()?.parse().ok()?;
            let msg = m
                .get("grpc-message")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            Some((code, msg))
        };
        self.trailers
            .as_ref()
            .and_then(from)
            .or_else(|| from(&self.headers))
    }

    /// The payload of the single gRPC message in the body.
    pub fn message(&self) -> &[u8] {
        assert!(
            self.body.len() >= 5,
            "no message in body ({} bytes)",
            self.body.len()
        );
        &self.body[5..]
    }
}

impl RawClient {
    pub async fn connect(path: impl AsRef<Path>) -> std::io::Result<Self> {
        let io = tokio::net::UnixStream::connect(path).await?;
        let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .max_frame_size(1 << 20)
            .initial_stream_window_size(8 << 20)
            .initial_connection_window_size(32 << 20)
            .handshake(TokioIo::new(io))
            .await
            .map_err(std::io::Error::other)?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Self { sender })
    }

    /// Calls `path` with a gRPC body (already framed) and extra headers.
    pub async fn call(
        &mut self,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<RawResponse, hyper::Error> {
        let mut b = Request::post(format!("http://localhost{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let req = b.body(Full::new(body)).expect("request");
        self.sender.ready().await?;
        let resp = self.sender.send_request(req).await?;
        let (parts, body) = resp.into_parts();
        let collected = body.collect().await?;
        let trailers = collected.trailers().cloned();
        Ok(RawResponse {
            status: parts.status,
            headers: parts.headers,
            body: collected.to_bytes(),
            trailers,
        })
    }
}

/// Frames one gRPC message (uncompressed).
pub fn frame(msg: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + msg.len());
    b.put_u8(0);
    b.put_u32(msg.len() as u32);
    b.extend_from_slice(msg);
    b.freeze()
}

/// Encodes an unknown protobuf field: `field` as a length-delimited value.
pub fn unknown_field(field: u32, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    varint(&mut out, ((field as u64) << 3) | 2);
    varint(&mut out, value.len() as u64);
    out.extend_from_slice(value);
    out
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}
