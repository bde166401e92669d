//! How an endpoint is spelled (`unix:///path`, or a bare absolute path): parsing
//! only. The checkpoint names the runtime it belongs to by endpoint; binding and
//! connecting sockets belong to the front ends.

use std::path::PathBuf;

/// The socket path of `unix:///path` (or of a bare absolute path); `None` for
/// anything else (a relative path, another scheme, a NUL byte).
pub fn unix_path(endpoint: &str) -> Option<PathBuf> {
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    (path.starts_with('/') && path.len() >= 2 && !path.contains('\0')).then(|| PathBuf::from(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings() {
        assert_eq!(unix_path("unix:///run/x.sock"), Some("/run/x.sock".into()));
        assert_eq!(unix_path("/run/x.sock"), Some("/run/x.sock".into()));
        for bad in [
            "",
            "/",
            "unix://",
            "unix://run/x",
            "tcp://1.2.3.4:5",
            "/a\0b",
            "x.sock",
        ] {
            assert_eq!(unix_path(bad), None, "{bad:?}");
        }
    }
}
