//! One connection to the store: TCP, a Unix socket or TLS (rustls, so a manylinux wheel
//! needs no OpenSSL), logged in (AUTH, SELECT). Every byte read or written is within the
//! operation's one deadline, enforced on the socket itself (`Timed`: its timeout set to
//! what is left before each read and write, under TLS too, so a server that drips its
//! handshake or a record still ends), and within the store's timeout between two pieces.
//! Connecting (name lookup included) is within the deadline as well.

use super::address::{Address, Endpoint, Tls};
use super::resp::{command, Budget, Paced, Reader, Reply, WireError};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Values are read at this rate at least: a second more of deadline per 32 MiB asked.
pub const MIN_BYTES_PER_SECOND: f64 = 32.0 * 1024.0 * 1024.0;
/// The most a value's size adds to an operation's deadline (a size is the server's word).
pub const MAX_EXTENSION: Duration = Duration::from_secs(60);

/// `deadline` with time for `bytes` more at `MIN_BYTES_PER_SECOND` (never past what an
/// `Instant` holds: a bound of 2^64 bytes would be centuries).
pub(super) fn extended(deadline: Instant, bytes: u64) -> Instant {
    let more = Duration::from_secs(bytes / MIN_BYTES_PER_SECOND as u64 + 1).min(MAX_EXTENSION);
    deadline.checked_add(more).unwrap_or(deadline)
}

enum Sock {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// A socket whose reads and writes end at `deadline`, and after `step` without progress.
/// The deadline moves out as a reply says how many bytes it holds (`Paced`), from the
/// operation's own (`set_deadline`) at the client's least rate.
pub struct Timed {
    sock: Sock,
    deadline: Instant,
    /// The operation's deadline before any bytes were expected, and the bytes since.
    base: Instant,
    expected: u64,
    step: Duration,
}

/// The error of a read or write past the deadline (told apart from a step's timeout).
#[derive(Debug)]
pub struct Late;
impl std::fmt::Display for Late {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the operation's deadline passed")
    }
}
impl std::error::Error for Late {}

fn late() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, Late)
}

impl Timed {
    fn set_deadline(&mut self, deadline: Instant) {
        (self.deadline, self.base, self.expected) = (deadline, deadline, 0);
    }

    fn arm(&mut self, write: bool) -> io::Result<()> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(late());
        }
        let t = Some(left.min(self.step).max(Duration::from_millis(1)));
        match (&self.sock, write) {
            (Sock::Tcp(s), false) => s.set_read_timeout(t),
            (Sock::Tcp(s), true) => s.set_write_timeout(t),
            (Sock::Unix(s), false) => s.set_read_timeout(t),
            (Sock::Unix(s), true) => s.set_write_timeout(t),
        }
    }

    /// `op` once armed, again after a signal interrupted it; a timeout of the socket's is
    /// the deadline's when the deadline has passed.
    fn timed<T>(
        &mut self,
        write: bool,
        mut op: impl FnMut(&mut Sock) -> io::Result<T>,
    ) -> io::Result<T> {
        loop {
            self.arm(write)?;
            match op(&mut self.sock) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) && Instant::now() >= self.deadline =>
                {
                    return Err(late())
                }
                other => return other,
            }
        }
    }

    /// Whether the peer hung up or sent something unasked while the connection was idle
    /// (then it is not reused).
    fn gone(&self) -> bool {
        let fd = match &self.sock {
            Sock::Tcp(s) => s.as_raw_fd(),
            Sock::Unix(s) => s.as_raw_fd(),
        };
        let mut byte = 0u8;
        // SAFETY: a one-byte peek into a local, without blocking.
        let n = unsafe {
            libc::recv(
                fd,
                (&mut byte as *mut u8).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        n >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock
    }
}

impl Read for Timed {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.timed(false, |s| match s {
            Sock::Tcp(s) => s.read(buf),
            Sock::Unix(s) => s.read(buf),
        })
    }
}

impl Write for Timed {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.timed(true, |s| match s {
            Sock::Tcp(s) => s.write(buf),
            Sock::Unix(s) => s.write(buf),
        })
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What a connection speaks over its socket.
pub enum Stream {
    Plain(Timed),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, Timed>>),
}

impl Stream {
    fn timed(&mut self) -> &mut Timed {
        match self {
            Stream::Plain(t) => t,
            Stream::Tls(s) => &mut s.sock,
        }
    }
}

impl Paced for Stream {
    fn expect(&mut self, n: u64) {
        let t = self.timed();
        t.expected = t.expected.saturating_add(n);
        t.deadline = extended(t.base, t.expected);
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(t) => t.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(t) => t.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(t) => t.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

pub struct Conn {
    pub reader: Reader<Stream>,
    /// The process that opened it: a forked child never shares its parent's socket.
    pub pid: u32,
}

impl Conn {
    /// Send `commands` at once (a pipeline) and read one reply each, within `budget`
    /// together. Every reply is read, errors too, so the connection stays in step.
    pub fn pipeline(
        &mut self,
        commands: &[Vec<&[u8]>],
        budget: Budget,
    ) -> Result<Vec<Reply>, WireError> {
        let mut wire = Vec::new();
        for c in commands {
            wire.extend(command(c));
        }
        self.reader.send(&wire)?;
        let mut budget = budget;
        let replies = (0..commands.len())
            .map(|_| self.reader.reply(&mut budget))
            .collect::<Result<Vec<_>, _>>()?;
        if self.reader.pending() > 0 {
            return Err(WireError::Protocol("more replies than commands".into()));
        }
        Ok(replies)
    }

    /// Send `commands` at once (their replies are then read one at a time).
    pub fn send(&mut self, commands: &[Vec<&[u8]>]) -> Result<(), WireError> {
        let mut wire = Vec::new();
        for c in commands {
            wire.extend(command(c));
        }
        self.reader.send(&wire)
    }

    pub fn set_deadline(&mut self, deadline: Instant) {
        self.reader.get_mut().timed().set_deadline(deadline);
    }

    /// Still fit for reuse: the peer has not hung up, nothing unasked is waiting.
    pub fn alive(&mut self) -> bool {
        self.reader.pending() == 0 && !self.reader.get_mut().timed().gone()
    }
}

/// The TLS settings of an address, made once per client (the system's certificates are
/// read once).
pub fn tls_config(tls: &Tls) -> Result<Arc<rustls::ClientConfig>, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = if tls.accept_any {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(super::any_cert::AnyCertificate(provider)))
    } else {
        let mut roots = rustls::RootCertStore::empty();
        let mut pinned = Vec::new();
        match &tls.ca_certs {
            Some(path) => {
                pinned = CertificateDer::pem_file_iter(path)
                    .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| format!("ssl_ca_certs {}: {e}", path.display()))?;
                let (added, _) = roots.add_parsable_certificates(pinned.iter().cloned());
                if added == 0 {
                    return Err(format!("ssl_ca_certs {}: no certificate", path.display()));
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(found.certs);
            }
        }
        let chained = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .map_err(|e| e.to_string())?;
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(super::any_cert::PinnedOrChained {
                chained,
                pinned,
                check_hostname: tls.check_hostname,
            }))
    };
    let config = match &tls.client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("ssl_certfile {}: {e}", cert.display()))?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| format!("ssl_keyfile {}: {e}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| e.to_string())?
        }
    };
    Ok(Arc::new(config))
}

/// The addresses of `host`, looked up within `deadline` (a resolver that hangs is left
/// to itself on a thread of its own).
fn resolve(host: &str, port: u16, deadline: Instant) -> io::Result<Vec<SocketAddr>> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let name = host.to_string();
    std::thread::Builder::new()
        .name("xpu-zebin-resolve".into())
        .spawn(move || {
            let _ = tx.send((name.as_str(), port).to_socket_addrs().map(Vec::from_iter));
        })?;
    let left = deadline.saturating_duration_since(Instant::now());
    rx.recv_timeout(left).map_err(|_| late())?
}

fn connect_tcp(host: &str, port: u16, deadline: Instant, step: Duration) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address"));
    for addr in resolve(host, port, deadline)? {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(late());
        }
        match TcpStream::connect_timeout(&addr, left.min(step)) {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// A Unix socket's connection within `deadline`: a server whose backlog is full makes a
/// blocking connect wait for ever, so the socket connects without blocking, again until
/// it is accepted or the deadline passes.
fn connect_unix(path: &std::path::Path, deadline: Instant) -> io::Result<UnixStream> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: a new socket of our own; closed on error by `OwnedFd`.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a socket we just made and own.
    let owned = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    // SAFETY: sockaddr_un is plain data; zeroed is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::other("the socket's path is too long"));
    }
    for (to, from) in addr.sun_path.iter_mut().zip(bytes) {
        *to = *from as libc::c_char;
    }
    loop {
        // SAFETY: `addr` is a valid sockaddr_un of the size given.
        let r = unsafe {
            libc::connect(
                fd,
                (&addr as *const libc::sockaddr_un).cast(),
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            )
        };
        let e = io::Error::last_os_error();
        if r == 0 || e.raw_os_error() == Some(libc::EISCONN) {
            break;
        }
        if !matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EINTR)) {
            return Err(e);
        }
        if Instant::now() >= deadline {
            return Err(late());
        }
        std::thread::sleep(Duration::from_millis(5)); // the backlog drains, or the deadline
    }
    let stream = UnixStream::from(owned);
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// A new connection to `address`, logged in, within `deadline`.
pub fn open(
    address: &Address,
    tls: Option<&Arc<rustls::ClientConfig>>,
    deadline: Instant,
    step: Duration,
) -> Result<Conn, WireError> {
    let sock = match &address.endpoint {
        Endpoint::Unix(path) => Sock::Unix(connect_unix(path, deadline)?),
        Endpoint::Tcp { host, port } => Sock::Tcp(connect_tcp(host, *port, deadline, step)?),
    };
    let timed = Timed {
        sock,
        deadline,
        base: deadline,
        expected: 0,
        step,
    };
    let stream = match (&address.endpoint, tls) {
        (Endpoint::Tcp { host, .. }, Some(config)) => {
            let name = rustls::pki_types::ServerName::try_from(host.clone())
                .map_err(|e| WireError::Protocol(format!("TLS server name {host:?}: {e}")))?;
            let session = rustls::ClientConnection::new(config.clone(), name)
                .map_err(|e| WireError::Protocol(format!("TLS: {e}")))?;
            let mut tls = rustls::StreamOwned::new(session, timed);
            // The handshake now, so a certificate that is refused is said as such; every
            // socket read and write of it is within the deadline (`Timed`).
            while tls.conn.is_handshaking() {
                tls.conn.complete_io(&mut tls.sock)?;
            }
            Stream::Tls(Box::new(tls))
        }
        _ => Stream::Plain(timed),
    };
    let mut conn = Conn {
        reader: Reader::new(stream),
        pid: std::process::id(),
    };
    login(&mut conn, address)?;
    Ok(conn)
}

fn login(conn: &mut Conn, address: &Address) -> Result<(), WireError> {
    let mut commands: Vec<Vec<&[u8]>> = Vec::new();
    let password = address.password.as_deref().filter(|p| !p.is_empty());
    if address.username.is_some() || password.is_some() {
        let mut auth: Vec<&[u8]> = vec![b"AUTH"];
        if let Some(user) = &address.username {
            auth.push(user.as_bytes());
        }
        auth.push(password.unwrap_or("").as_bytes());
        commands.push(auth);
    }
    let db = address.db.to_string();
    if address.db != 0 {
        commands.push(vec![b"SELECT", db.as_bytes()]);
    }
    if let Some(name) = &address.client_name {
        commands.push(vec![b"CLIENT", b"SETNAME", name.as_bytes()]);
    }
    if commands.is_empty() {
        return Ok(());
    }
    for reply in conn.pipeline(&commands, Budget::SMALL)? {
        if let Reply::Error(e) = reply {
            return Err(WireError::Protocol(format!("login refused: {e}")));
        }
    }
    Ok(())
}
