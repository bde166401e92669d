//! The cgroup and procfs files a tick reads: kept open (within an fd budget),
//! read with `pread` in bounded chunks, some only every few ticks.

use super::*;

/// One cgroup file, with its handle kept open across ticks while the fd
/// budget allows (a tick is then one `pread` per file instead of
/// open/stat/read/read/close).
#[derive(Debug)]
pub(super) struct CFile {
    /// The cgroup's directory (shared by its files) and the file's name.
    pub(super) dir: Arc<Path>,
    pub(super) name: &'static str,
    pub(super) fd: Option<std::fs::File>,
}

impl CFile {
    pub(super) fn new(dir: &Arc<Path>, name: &'static str) -> Self {
        Self {
            dir: dir.clone(),
            name,
            fd: None,
        }
    }
}

/// The files read for one cgroup (resolved once: the symlink check walks
/// every component). Optional files absent at first sight are not retried.
#[derive(Debug)]
pub(super) struct Files {
    pub(super) cpu_stat: CFile,
    /// v1 `cpuacct.usage` (v2 has usage in cpu.stat).
    pub(super) cpu_usage: Option<CFile>,
    pub(super) mem_usage: CFile,
    pub(super) mem_stat: CFile,
    pub(super) events: Option<CFile>,
    pub(super) io: Vec<CFile>,
    pub(super) psi: [Option<CFile>; 3],
    /// Ticks this cgroup was read.
    pub(super) reads: u64,
    /// The OOM kill count as last read (it is read every [`SLOW_EVERY`] ticks).
    pub(super) oom_kills: Option<u64>,
    /// v1 cpu.stat (periods, throttling): read when the CPU usage moved.
    pub(super) stat: Option<Counter<CpuStat>>,
    /// I/O counters: read when the CPU usage moved (or, v2, pages are dirty).
    pub(super) io_counters: Option<Counter<Devices>>,
    /// memory.stat as read the previous tick (its page-in signs).
    pub(super) mem_prev: Option<Memory>,
    /// Whether the I/O counters moved at their last read (kept read every
    /// tick while the cgroup runs, until they stand still).
    pub(super) io_moving: bool,
    /// What was read the previous tick (usage, pressure).
    pub(super) prev: Option<Prev>,
}

/// Rarely-changing files (OOM kill counts), the counters believed still, and
/// the removed-cgroup check on file trees are read every this many ticks.
pub(super) const SLOW_EVERY: u64 = 10;

/// A cgroup's first reads, during which cpu.stat is read whenever the CPU usage
/// moved even without periods counted yet (a container with a quota that has
/// not run a full period at its first read).
pub(super) const QUOTA_UNKNOWN_READS: u64 = 3;

impl Files {
    /// A cgroup's files (`mem`: the usage file and memory.stat), nothing read yet.
    pub(super) fn new(
        cpu_stat: CFile,
        cpu_usage: Option<CFile>,
        mem: [CFile; 2],
        events: Option<CFile>,
        io: Vec<CFile>,
        psi: [Option<CFile>; 3],
    ) -> Self {
        let [mem_usage, mem_stat] = mem;
        Self {
            cpu_stat,
            cpu_usage,
            mem_usage,
            mem_stat,
            events,
            io,
            psi,
            reads: 0,
            oom_kills: None,
            stat: None,
            io_counters: None,
            mem_prev: None,
            io_moving: false,
            prev: None,
        }
    }

    pub(super) fn open_fds(&self) -> usize {
        let mut all: Vec<&CFile> = vec![&self.cpu_stat, &self.mem_usage, &self.mem_stat];
        all.extend(self.cpu_usage.iter());
        all.extend(self.events.iter());
        all.extend(self.io.iter());
        all.extend(self.psi.iter().flatten());
        all.iter().filter(|f| f.fd.is_some()).count()
    }
}

/// How many files may stay open (the soft RLIMIT_NOFILE minus a reserve for
/// sockets and everything else; past it, files are opened per read).
pub(super) fn fd_budget(proc_root: &Path) -> usize {
    let limits = std::fs::read_to_string(proc_root.join("self/limits")).unwrap_or_default();
    let soft = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1024);
    soft.saturating_sub(512)
}

/// Why one cgroup was not read this tick.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cgroup gone")]
    Vanished,
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Parse {
        path: PathBuf,
        source: parse::ParseError,
    },
}

pub(super) fn io_err(path: &Path, e: std::io::Error) -> ReadError {
    match e.raw_os_error() {
        _ if e.kind() == std::io::ErrorKind::NotFound => ReadError::Vanished,
        // ENODEV: a cgroup removed while its file was open
        Some(19) => ReadError::Vanished,
        _ => ReadError::Io {
            path: path.into(),
            source: e,
        },
    }
}

pub(super) const READ_CHUNK: usize = 16 * 1024;

/// Reads `f` into `buf` and returns the length read: a `pread` at offset 0 on
/// the kept handle, or an open and read when the fd budget is spent. `buf`
/// keeps its full length between reads (no zero-fill per read); only its
/// first `len` bytes are the file.
pub(super) fn read_file(
    f: &mut CFile,
    buf: &mut Vec<u8>,
    budget: usize,
    open: &mut usize,
) -> Result<usize, ReadError> {
    use std::os::unix::fs::FileExt;
    if buf.len() < READ_CHUNK {
        buf.resize(READ_CHUNK, 0);
    }
    let once;
    let (dir, name) = (&f.dir, f.name);
    let err = |e| io_err(&dir.join(name), e);
    let fd = match &mut f.fd {
        Some(fd) => &*fd,
        slot => {
            let fd = open_noatime(&dir.join(name)).map_err(err)?;
            if *open < budget {
                *open += 1;
                &*slot.insert(fd)
            } else {
                once = fd;
                &once
            }
        }
    };
    let mut len = 0;
    loop {
        let n = fd.read_at(&mut buf[len..], len as u64).map_err(err)?;
        len += n;
        if n == 0 || len < buf.len() {
            return Ok(len);
        }
        buf.resize(buf.len() * 2, 0);
    }
}

/// Opens read-only without updating the access time where the caller may
/// (root, the owner): a read is then no inode write (tmpfs trees, and any
/// filesystem that keeps atimes); elsewhere a plain open.
pub(super) fn open_noatime(p: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOATIME)
        .open(p)
    {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => std::fs::File::open(p),
        r => r,
    }
}

pub(super) fn text(b: &[u8]) -> &str {
    std::str::from_utf8(b).unwrap_or("")
}
