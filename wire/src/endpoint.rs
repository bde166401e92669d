//! Endpoints (`unix:///path`): parsing, binding the listening socket safely, and
//! connecting to the backend runtime.
//!
//! Binding rules: the socket is mode 0660, owned by root (the process owner),
//! from its first instant: it is bound inside a fresh 0700 directory, narrowed,
//! and only then renamed into place (never over something that appeared
//! meanwhile: `RENAME_NOREPLACE`), so no umask opens a window in which anyone
//! else can connect. The socket's directory is created 0755 and must not be
//! writable by others (unless sticky, like /tmp) nor owned by another user:
//! whoever can rename in it could put their own socket in kubelet's path. A stale socket file (connecting is refused: ECONNREFUSED)
//! is replaced; a live one (another qoslet) makes binding fail with a clear
//! error, and so does any other connect error (EACCES, EAGAIN on a full
//! backlog...), since it cannot tell a live socket from a stale one; a
//! non-socket file at the path is never removed.

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::{UnixListener, UnixStream};

/// Endpoint errors.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("invalid endpoint {0:?}: only unix:///absolute/path endpoints are supported")]
    Invalid(String),
    #[error("{path} is in use by another process (is another qoslet running?); refusing to start")]
    InUse { path: PathBuf },
    #[error("{path} exists and is not a socket; refusing to replace it")]
    NotASocket { path: PathBuf },
    #[error("{path}: its directory is writable by others or owned by another user; refusing to serve kubelet from it")]
    UnsafeDir { path: PathBuf },
    #[error("{path} appeared while qoslet was binding it; refusing to replace it")]
    Appeared { path: PathBuf },
    #[error("{path} may be in use: connecting to it failed with {source} (not 'connection refused'); refusing to replace it")]
    Unknown {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot prepare {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Parses `unix:///path` (or a bare absolute path) into a socket path.
pub fn parse_unix(endpoint: &str) -> Result<PathBuf, EndpointError> {
    qoslet_state::endpoint::unix_path(endpoint)
        .ok_or_else(|| EndpointError::Invalid(endpoint.to_string()))
}

/// Binds a unix listening socket at `path` following the module's rules.
pub async fn bind_unix(path: &Path) -> Result<UnixListener, EndpointError> {
    let io = |source| EndpointError::Io {
        path: path.to_path_buf(),
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(io)?;
    {
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::metadata(dir).map_err(io)?;
        let me = rustix::process::geteuid().as_raw();
        let others_write = md.mode() & 0o022 != 0 && md.mode() & 0o1000 == 0;
        if others_write || (md.uid() != me && md.uid() != 0) {
            return Err(EndpointError::UnsafeDir {
                path: path.to_path_buf(),
            });
        }
    }
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.file_type().is_socket() => match UnixStream::connect(path).await {
            Ok(_) => {
                return Err(EndpointError::InUse {
                    path: path.to_path_buf(),
                })
            }
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                tracing::info!(path = %path.display(), "replacing stale socket");
                std::fs::remove_file(path).map_err(io)?;
            }
            Err(source) => {
                return Err(EndpointError::Unknown {
                    path: path.to_path_buf(),
                    source,
                })
            }
        },
        Ok(_) => {
            return Err(EndpointError::NotASocket {
                path: path.to_path_buf(),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    // bind where only root can reach it, narrow the mode, then move it into place
    static BINDS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = BINDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let private = dir.join(format!(".q{:x}.{n}", std::process::id()));
    let staged = private.join("s");
    // sun_path holds 107 bytes: a path that fits only without the staging dir is
    // bound in place under a umask that leaves it private until it is narrowed
    if staged.as_os_str().len() > 107 {
        let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o177));
        let r = UnixListener::bind(path).and_then(|l| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map(|_| l)
        });
        rustix::process::umask(old);
        return r.map_err(io);
    }
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .map_err(io)?;
    let r = (|| {
        let listener = UnixListener::bind(&staged)?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o660))?;
        rustix::fs::renameat_with(
            rustix::fs::CWD,
            &staged,
            rustix::fs::CWD,
            path,
            rustix::fs::RenameFlags::NOREPLACE,
        )?;
        Ok(listener)
    })();
    let _ = std::fs::remove_file(&staged);
    let _ = std::fs::remove_dir(&private);
    r.map_err(|e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            EndpointError::Appeared {
                path: path.to_path_buf(),
            }
        } else {
            io(e)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_unix_endpoints() {
        assert_eq!(
            parse_unix("unix:///run/x.sock").unwrap(),
            PathBuf::from("/run/x.sock")
        );
        assert_eq!(
            parse_unix("/run/x.sock").unwrap(),
            PathBuf::from("/run/x.sock")
        );
        for bad in [
            "tcp://1.2.3.4:5",
            "unix://relative",
            "",
            "unix://",
            "x.sock",
            "/a\0b",
        ] {
            assert!(parse_unix(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn bind_replaces_stale_refuses_live_and_non_sockets() {
        let dir = std::env::temp_dir().join(format!("qoslet-ep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("sub/q.sock");
        let l = bind_unix(&path).await.unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);
        // live: refuse
        let err = bind_unix(&path).await.unwrap_err();
        assert!(matches!(err, EndpointError::InUse { .. }), "{err}");
        assert!(err.to_string().contains("another qoslet"));
        // stale: replace
        drop(l);
        let l2 = bind_unix(&path).await.unwrap();
        // the bound socket serves at its final path, and nothing is left in the dir
        let c = UnixStream::connect(&path).await.unwrap();
        let (_s, _) = l2.accept().await.unwrap();
        drop(c);
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("q.sock")]);
        drop(l2);
        // a directory others can write to (not sticky) is refused
        let open_dir = dir.join("open");
        std::fs::create_dir_all(&open_dir).unwrap();
        std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            bind_unix(&open_dir.join("q.sock")).await,
            Err(EndpointError::UnsafeDir { .. })
        ));
        // a sticky one (like /tmp) is fine
        std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let _l3 = bind_unix(&open_dir.join("q.sock")).await.unwrap();
        // a path too long for the staging dir is bound in place, still 0660
        let deep = dir.join("d".repeat(100 - dir.as_os_str().len() - 9));
        std::fs::create_dir_all(&deep).unwrap();
        let long = deep.join("q.sock");
        assert!((95..108).contains(&long.as_os_str().len()));
        let _l4 = bind_unix(&long).await.unwrap();
        assert_eq!(
            std::fs::metadata(&long).unwrap().permissions().mode() & 0o777,
            0o660
        );
        // a regular file is never removed
        let file = dir.join("file");
        std::fs::write(&file, b"keep").unwrap();
        assert!(matches!(
            bind_unix(&file).await,
            Err(EndpointError::NotASocket { .. })
        ));
        assert_eq!(std::fs::read(&file).unwrap(), b"keep");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
