//! The socket and HTTP/2 edge every gRPC server of qoslet shares (the CRI
//! proxy's socket, the admin socket): endpoints bound safely, the wire limits,
//! and the filter in front of h2 that makes it judge a client's header blocks
//! as containerd's grpc-go does.
//!
//! * [`endpoint`]: `unix:///path` endpoints: binding (0660 from the first
//!   instant, never over a live socket) and connecting.
//! * [`limits`]: the wire limits (header blocks, frames, messages), each the
//!   direct path's own, in one place.
//! * [`authority`]: what h2 would misjudge in a client's header blocks: a
//!   socket path as `:authority` (repaired), a malformed request (made a stream
//!   error, not a connection error).
//! * [`hpack`]: the HPACK decoder the filter judges with (RFC 7541; our own:
//!   see `docs/limits.md` for why), [`h2frame`]: the frame helpers it needs.
//! * [`rng`]: the seeded generator of the randomized tests.
//!
//! No CRI, no policy, no state: bytes and sockets only.

#![forbid(unsafe_code)]

pub mod authority;
pub mod endpoint;
pub mod h2frame;
pub mod hpack;
pub mod limits;
pub mod rng;

pub use authority::AuthorityFix;
