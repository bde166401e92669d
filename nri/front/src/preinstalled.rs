//! A pre-installed plugin: the runtime started qoslet itself (a binary in
//! its plugin dir, `NN-name`) with a connected socket on fd 3 and
//! `NRI_PLUGIN_SOCKET=3`, `NRI_PLUGIN_NAME`, `NRI_PLUGIN_IDX` in the
//! environment. The one unsafe line of the project is here: taking
//! ownership of that inherited descriptor.

use std::os::fd::{FromRawFd, OwnedFd};

/// The runtime-given plugin name and index and the socket on fd 3, when the
/// environment says the runtime started this process; `None` otherwise.
pub struct Preinstalled {
    pub name: String,
    pub index: String,
    pub socket: std::os::unix::net::UnixStream,
}

/// Takes fd 3 when `NRI_PLUGIN_SOCKET` names it. Call once, early, before
/// anything else may open fd 3 of its own.
pub fn take() -> Result<Option<Preinstalled>, String> {
    let Ok(fd) = std::env::var("NRI_PLUGIN_SOCKET") else {
        return Ok(None);
    };
    if fd != "3" {
        return Err(format!("NRI_PLUGIN_SOCKET={fd:?}: only fd 3 is supported"));
    }
    let name = std::env::var("NRI_PLUGIN_NAME").unwrap_or_default();
    let index = std::env::var("NRI_PLUGIN_IDX").unwrap_or_default();
    // fd 3 must be open and a socket before ownership is taken
    let meta = std::fs::metadata("/proc/self/fd/3")
        .map_err(|e| format!("NRI_PLUGIN_SOCKET=3 but fd 3 is not open: {e}"))?;
    use std::os::unix::fs::FileTypeExt;
    if !meta.file_type().is_socket() {
        return Err("NRI_PLUGIN_SOCKET=3 but fd 3 is not a socket".into());
    }
    // SAFETY: fd 3 was inherited from the runtime, is open (checked above) and
    // nothing else in this process owns it: `take` runs once at start,
    // before the process opens descriptors of its own that could be fd 3.
    #[allow(unsafe_code)]
    let owned = unsafe { OwnedFd::from_raw_fd(3) };
    Ok(Some(Preinstalled {
        name,
        index,
        socket: std::os::unix::net::UnixStream::from(owned),
    }))
}
