//! The runtime's container events (`GetContainerEvents`, containerd ≥ 1.7),
//! observed as they stream through to kubelet (its evented PLEG): a container
//! that exits or a sandbox that stops behind kubelet's back (a crash, an OOM
//! kill, `crictl stop`) is seen in the store at once, not at the next resync.
//! Without such a stream (kubelet's generic PLEG, containerd 1.6) the resync
//! catches up, as before.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body as HttpBody, Frame};
use prost::Message;
use qoslet_proto::cri::{ContainerEventResponse, ContainerEventType};
use tracing::{debug, info, warn};

use qoslet_state::store::{ContainerState, Store};

/// Applies one event to the store. Returns whether the store knew the entry.
/// A container's state is taken from the statuses the event carries where it
/// has one (the event type alone can arrive out of order: containerd watches a
/// process for its exit before it sends "started"), and never goes back from
/// exited; a sandbox that stopped makes only the pod not ready.
pub fn apply(store: &Store, ev: &ContainerEventResponse) -> bool {
    let id = ev.container_id.as_str();
    let kind = ContainerEventType::try_from(ev.container_event_type).ok();
    // containerd sends the sandbox's own events under the sandbox id
    if store.has_pod(id) {
        match kind {
            Some(ContainerEventType::ContainerStoppedEvent) => store.observe_pod_not_ready(id),
            Some(ContainerEventType::ContainerDeletedEvent) => {
                store.remove_pod(id);
            }
            _ => {}
        }
        return true;
    }
    if !store.has_container(id) {
        return false;
    }
    if kind == Some(ContainerEventType::ContainerDeletedEvent) {
        store.remove_container(id);
        return true;
    }
    let reported = ev
        .containers_statuses
        .iter()
        .find(|s| s.id == id)
        .map(|s| crate::records::container_state(s.state))
        .filter(|s| *s != ContainerState::Unknown);
    let by_kind = match kind {
        Some(ContainerEventType::ContainerStartedEvent) => Some(ContainerState::Running),
        Some(ContainerEventType::ContainerStoppedEvent) => Some(ContainerState::Exited),
        _ => None,
    };
    if let Some(state) = reported.or(by_kind) {
        store.observe_container_state(id, state);
    }
    true
}

/// A `GetContainerEvents` response body, passed through unchanged, whose
/// messages are decoded on the side and applied to the store. qoslet opens no
/// stream of its own: containerd 1.7 hands each event to one subscriber only
/// (one channel for all streams), so a second subscriber would take events
/// from kubelet's evented PLEG.
pub struct Tap<B> {
    inner: B,
    store: Store,
    buf: BytesMut,
    /// Messages above this are not decoded (the stream still flows).
    cap: usize,
    off: bool,
}

impl<B> Tap<B> {
    pub fn new(inner: B, store: Store, cap: usize) -> Self {
        info!(
            "kubelet's container event stream opened through qoslet: container exits are observed"
        );
        Self {
            inner,
            store,
            buf: BytesMut::new(),
            cap,
            off: false,
        }
    }

    /// Bytes held for a message not yet whole.
    #[cfg(test)]
    pub(crate) fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Takes the stream's next bytes; applies every whole message in them.
    pub(crate) fn feed(&mut self, data: &[u8]) {
        if self.off {
            return;
        }
        self.buf.extend_from_slice(data);
        while self.buf.len() >= 5 {
            let compressed = self.buf[0] != 0;
            let len =
                u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
            if len > self.cap {
                warn!(len, cap = self.cap, "a container event over the message limit: events no longer observed on this stream");
                self.off = true;
                self.buf = BytesMut::new();
                return;
            }
            if self.buf.len() < 5 + len {
                return;
            }
            let msg = self.buf.split_to(5 + len);
            if compressed {
                continue; // not negotiated by CRI clients; passed on, not read
            }
            match ContainerEventResponse::decode(&msg[5..]) {
                Ok(ev) => {
                    apply(&self.store, &ev);
                }
                Err(e) => debug!(error = %e, "undecodable container event passed on"),
            }
        }
    }
}

impl<B> Drop for Tap<B> {
    fn drop(&mut self) {
        info!("kubelet's container event stream closed: container exits reach the store at the next resync until it reopens");
    }
}

impl<B> HttpBody for Tap<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(f))) = &r {
            if let Some(d) = f.data_ref() {
                let d = d.clone();
                self.feed(&d);
            }
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qoslet_state::store::{ContainerRecord, PodRecord, PodState};

    fn framed(ev: &ContainerEventResponse) -> Vec<u8> {
        let m = ev.encode_to_vec();
        let mut out = vec![0];
        out.extend_from_slice(&(m.len() as u32).to_be_bytes());
        out.extend_from_slice(&m);
        out
    }

    /// Events split anywhere across chunks are applied once whole; a
    /// container's exit and deletion, a sandbox's stop, and unknown ids.
    #[test]
    fn tapped_events_update_the_store_across_chunk_boundaries() {
        let store = Store::new();
        store.upsert_pod(PodRecord {
            id: "p".into(),
            state: PodState::Ready,
            ..Default::default()
        });
        for c in ["c1", "c2"] {
            store.upsert_container(ContainerRecord {
                id: c.into(),
                pod_id: "p".into(),
                state: ContainerState::Running,
                ..Default::default()
            });
        }
        let ev = |id: &str, t: ContainerEventType| ContainerEventResponse {
            container_id: id.into(),
            container_event_type: t as i32,
            ..Default::default()
        };
        let mut bytes = Vec::new();
        bytes.extend(framed(&ev("c1", ContainerEventType::ContainerStoppedEvent)));
        bytes.extend(framed(&ev("c2", ContainerEventType::ContainerDeletedEvent)));
        bytes.extend(framed(&ev(
            "unknown",
            ContainerEventType::ContainerStoppedEvent,
        )));
        bytes.extend(framed(&ev("p", ContainerEventType::ContainerStoppedEvent)));
        let mut tap = Tap::new((), store.clone(), 1 << 20);
        for chunk in bytes.chunks(3) {
            tap.feed(chunk);
        }
        assert_eq!(store.container("c1").unwrap().state, ContainerState::Exited);
        assert!(store.container("c2").is_none());
        assert_ne!(store.pod("p").unwrap().state, PodState::Ready);
        // a late "started" never undoes an exit; repeated events change nothing
        let g = store.generation();
        tap.feed(&framed(&ev(
            "c1",
            ContainerEventType::ContainerStartedEvent,
        )));
        tap.feed(&framed(&ev(
            "c1",
            ContainerEventType::ContainerStoppedEvent,
        )));
        tap.feed(&framed(&ev("p", ContainerEventType::ContainerStoppedEvent)));
        assert_eq!(store.container("c1").unwrap().state, ContainerState::Exited);
        assert_eq!(store.generation(), g, "no change, no new generation");
        // the pause process dying makes the pod not ready, its running containers stay running
        store.upsert_pod(PodRecord {
            id: "p2".into(),
            state: PodState::Ready,
            ..Default::default()
        });
        store.upsert_container(ContainerRecord {
            id: "c3".into(),
            pod_id: "p2".into(),
            state: ContainerState::Running,
            ..Default::default()
        });
        tap.feed(&framed(&ev(
            "p2",
            ContainerEventType::ContainerStoppedEvent,
        )));
        assert_eq!(store.pod("p2").unwrap().state, PodState::NotReady);
        assert_eq!(
            store.container("c3").unwrap().state,
            ContainerState::Running
        );
        // an announced length over the cap stops decoding, never buffers it
        let mut tap = Tap::new((), store.clone(), 16);
        tap.feed(&[0, 0, 1, 0, 0]);
        assert!(tap.off && tap.buf.is_empty());
    }
}
