//! The bytes of an allowed connection, both ways, under the idle and byte
//! limits, counted as they move.
//!
//! Each direction moves socket → pipe → socket with `splice(2)`: the bytes
//! stay in the kernel (no copy into the supervisor and back), which takes
//! a bulk download from about half of a direct loopback fetch's speed to
//! near it. Whatever a splice cannot do (no pipe to be had: the
//! supervisor's descriptors exhausted) falls back to copying through a
//! buffer. The limits are applied per chunk either way, before the chunk
//! is passed on.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::fcntl::{OFlag, SpliceFFlags};
use tokio::io::Interest;
use tokio::net::TcpStream;

use super::config::NetworkConfig;

/// Relay buffer of the copying fallback, per direction.
const BUF: usize = 32 * 1024;
/// The pipe between the sockets, per direction: room for a few TCP
/// windows' worth per splice (the kernel's default of 64 KiB costs twice
/// the system calls). Asking for more than the system allows keeps the
/// default.
const PIPE_BYTES: i32 = 256 * 1024;

/// Bytes each way and the last moment anything moved (ms since start).
#[derive(Default)]
pub(super) struct Counts {
    pub(super) up: AtomicU64,
    pub(super) down: AtomicU64,
    pub(super) last: AtomicU64,
}

impl Counts {
    fn total(&self) -> u64 {
        self.up.load(Ordering::Relaxed) + self.down.load(Ordering::Relaxed)
    }

    /// `n` more bytes moved `upward` (or down), now.
    fn moved(&self, upward: bool, n: u64, start: Instant) {
        let counter = if upward { &self.up } else { &self.down };
        counter.fetch_add(n, Ordering::Relaxed);
        let now = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(now, Ordering::Relaxed);
    }
}

/// Copy both ways until the server side ends (or both do), a side fails,
/// nothing moves for the idle timeout, or the byte limit is reached: the
/// reason it stopped early, if it did.
pub(super) async fn relay(
    client: TcpStream,
    server: TcpStream,
    cfg: &NetworkConfig,
    counts: &Counts,
) -> Option<String> {
    let start = Instant::now();
    let limit = Limit {
        max: cfg.max_bytes,
        start,
    };
    let up = Way {
        from: &client,
        to: &server,
        counts,
        upward: true,
        limit,
    };
    let down = Way {
        from: &server,
        to: &client,
        upward: false,
        ..up
    };
    let (up, down) = (up.pump(), down.pump());
    tokio::pin!(up, down);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut up_done = false;
    loop {
        tokio::select! {
            r = &mut up, if !up_done => match r {
                Ok(()) => up_done = true,
                Err(why) => return Some(why),
            },
            r = &mut down => return r.err(),
            _ = tick.tick() => {
                let idle = start.elapsed().saturating_sub(Duration::from_millis(counts.last.load(Ordering::Relaxed)));
                if idle >= cfg.idle_timeout {
                    return Some(format!("idle for {}s", cfg.idle_timeout.as_secs()));
                }
            }
        }
    }
}

/// Both ways together may carry `max` bytes.
#[derive(Clone, Copy)]
struct Limit {
    max: u64,
    start: Instant,
}

impl Limit {
    fn check(&self, counts: &Counts, n: usize) -> Result<(), String> {
        if counts.total() + n as u64 > self.max {
            return Err(format!("byte limit ({}) reached", self.max));
        }
        Ok(())
    }
}

/// One direction of a connection: `from` to `to`, counted as up or down.
#[derive(Clone, Copy)]
struct Way<'a> {
    from: &'a TcpStream,
    to: &'a TcpStream,
    counts: &'a Counts,
    upward: bool,
    limit: Limit,
}

impl Way<'_> {
    /// Move `from` to `to` until end of file, then shut `to`'s writing side.
    async fn pump(self) -> Result<(), String> {
        match Pipe::new() {
            Ok(pipe) => self.splice(&pipe).await?,
            Err(e) => {
                tracing::debug!("egress relay: no pipe ({e}); copying");
                self.copy().await?;
            }
        }
        // The other side sees the end of what this side sent.
        let _ = nix::sys::socket::shutdown(self.to.as_raw_fd(), nix::sys::socket::Shutdown::Write);
        Ok(())
    }

    /// `n` bytes passed on.
    fn moved(&self, n: usize) {
        self.counts.moved(self.upward, n as u64, self.limit.start);
    }
}

/// A pipe to splice through, both ends non-blocking.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    fn new() -> nix::Result<Pipe> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
        let _ = nix::fcntl::fcntl(&write, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_BYTES));
        Ok(Pipe { read, write })
    }
}

impl Way<'_> {
    /// `splice` from `from` into the pipe, then from the pipe into `to`.
    /// The pipe is empty whenever the socket is read, so "would block"
    /// there means the socket has nothing; while writing, that the peer's
    /// window is full.
    async fn splice(&self, pipe: &Pipe) -> Result<(), String> {
        let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
        let (from, to) = (self.from, self.to);
        loop {
            from.readable().await.map_err(|e| e.to_string())?;
            let read = from.try_io(Interest::READABLE, || {
                nix::fcntl::splice(
                    from.as_fd(),
                    None,
                    &pipe.write,
                    None,
                    PIPE_BYTES as usize,
                    flags,
                )
                .map_err(std::io::Error::from)
            });
            let n = match read {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e.to_string()),
            };
            self.limit.check(self.counts, n)?;
            let mut left = n;
            while left > 0 {
                to.writable().await.map_err(|e| e.to_string())?;
                let wrote = to.try_io(Interest::WRITABLE, || {
                    nix::fcntl::splice(&pipe.read, None, to.as_fd(), None, left, flags)
                        .map_err(std::io::Error::from)
                });
                match wrote {
                    Ok(0) => return Err("the other side closed".into()),
                    Ok(m) => left = left.saturating_sub(m),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e.to_string()),
                }
            }
            self.moved(n);
        }
    }

    /// The fallback: read into a buffer, write it out.
    async fn copy(&self) -> Result<(), String> {
        let (from, to) = (self.from, self.to);
        let mut buf = vec![0u8; BUF];
        loop {
            from.readable().await.map_err(|e| e.to_string())?;
            let n = match from.try_read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e.to_string()),
            };
            self.limit.check(self.counts, n)?;
            let mut sent = 0;
            while sent < n {
                to.writable().await.map_err(|e| e.to_string())?;
                match to.try_write(buf.get(sent..n).unwrap_or_default()) {
                    Ok(0) => return Err("the other side closed".into()),
                    Ok(m) => sent += m,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e.to_string()),
                }
            }
            self.moved(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A connected pair of loopback sockets.
    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let near = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (far, _) = l.accept().await.unwrap();
        (near, far)
    }

    /// `size` bytes from a server through the relay to a client, which
    /// also sends `up` bytes first: what the client got, and how it ended.
    async fn through(size: usize, up: usize, max: u64) -> (Vec<u8>, Option<String>, Counts) {
        let (mut client, proxy_client) = pair().await;
        let (proxy_server, mut server) = pair().await;
        let body: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let sent = body.clone();
        let serve = tokio::spawn(async move {
            let mut got = vec![0u8; up];
            server.read_exact(&mut got).await.unwrap();
            let _ = server.write_all(&sent).await;
            let _ = server.shutdown().await;
            got
        });
        let cfg = NetworkConfig {
            max_bytes: max,
            ..NetworkConfig::default()
        };
        let counts = Counts::default();
        let read = async {
            client.write_all(&vec![7u8; up]).await.unwrap();
            let mut got = Vec::new();
            let _ = client.read_to_end(&mut got).await;
            got
        };
        let (reason, got) = tokio::join!(relay(proxy_client, proxy_server, &cfg, &counts), read);
        assert_eq!(
            serve.await.unwrap(),
            vec![7u8; up],
            "the server got what the client sent"
        );
        if reason.is_none() {
            assert_eq!(got, body, "the client got the server's bytes, in order");
        }
        (got, reason, counts)
    }

    #[tokio::test]
    async fn bytes_cross_whole_and_are_counted_each_way() {
        let size = 3 * 1024 * 1024 + 17;
        let (got, reason, counts) = through(size, 1000, u64::MAX).await;
        assert_eq!(reason, None);
        assert_eq!(got.len(), size);
        assert_eq!(counts.down.load(Ordering::Relaxed), size as u64);
        assert_eq!(counts.up.load(Ordering::Relaxed), 1000);
    }

    #[tokio::test]
    async fn the_byte_limit_stops_a_transfer_before_it_passes() {
        let max = 1024 * 1024;
        let (got, reason, counts) = through(8 * 1024 * 1024, 10, max).await;
        assert!(
            reason.as_deref().is_some_and(|r| r.contains("byte limit")),
            "{reason:?}"
        );
        assert!(counts.up.load(Ordering::Relaxed) + counts.down.load(Ordering::Relaxed) <= max);
        assert!(got.len() as u64 <= max, "{} bytes passed", got.len());
    }
}
