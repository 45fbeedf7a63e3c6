//! One connection to the store: TCP, a Unix socket or TLS (rustls, so a manylinux wheel
//! needs no OpenSSL), logged in (AUTH, SELECT). Every byte read or written is within the
//! operation's one deadline, enforced on the socket itself (its timeout set to what is
//! left before each read and write), and within the store's timeout between two pieces.

use super::address::{Address, Endpoint, Tls};
use super::resp::{command, Budget, Reader, Reply, WireError};
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

/// A stream whose reads and writes end at `deadline`, and after `step` without progress.
pub struct Timed {
    stream: Stream,
    pub deadline: Instant,
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

impl Timed {
    fn arm(&mut self, write: bool) -> io::Result<()> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, Late));
        }
        let t = Some(left.min(self.step).max(Duration::from_millis(1)));
        let set = |r: io::Result<()>| r;
        match (&self.stream, write) {
            (Stream::Tcp(s), false) => set(s.set_read_timeout(t)),
            (Stream::Tcp(s), true) => set(s.set_write_timeout(t)),
            (Stream::Unix(s), false) => set(s.set_read_timeout(t)),
            (Stream::Unix(s), true) => set(s.set_write_timeout(t)),
            (Stream::Tls(s), false) => set(s.sock.set_read_timeout(t)),
            (Stream::Tls(s), true) => set(s.sock.set_write_timeout(t)),
        }
    }

    /// A timeout of the socket's is the deadline's when the deadline has passed.
    fn said(&self, r: io::Result<usize>) -> io::Result<usize> {
        match r {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) && Instant::now() >= self.deadline =>
            {
                Err(io::Error::new(io::ErrorKind::TimedOut, Late))
            }
            other => other,
        }
    }
}

impl Read for Timed {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.arm(false)?;
        let r = match &mut self.stream {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        };
        self.said(r)
    }
}

impl Write for Timed {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.arm(true)?;
        let r = match &mut self.stream {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        };
        self.said(r)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.arm(true)?;
        match &mut self.stream {
            Stream::Tcp(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

pub struct Conn {
    pub reader: Reader<Timed>,
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

    pub fn set_deadline(&mut self, deadline: Instant) {
        self.reader.get_mut().deadline = deadline;
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

fn connect_tcp(host: &str, port: u16, deadline: Instant, step: Duration) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address"));
    for addr in (host, port).to_socket_addrs()? {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, Late));
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

/// A new connection to `address`, logged in, within `deadline`.
pub fn open(
    address: &Address,
    tls: Option<&Arc<rustls::ClientConfig>>,
    deadline: Instant,
    step: Duration,
) -> Result<Conn, WireError> {
    let stream = match (&address.endpoint, tls) {
        (Endpoint::Unix(path), _) => Stream::Unix(UnixStream::connect(path)?),
        (Endpoint::Tcp { host, port }, None) => {
            Stream::Tcp(connect_tcp(host, *port, deadline, step)?)
        }
        (Endpoint::Tcp { host, port }, Some(config)) => {
            let sock = connect_tcp(host, *port, deadline, step)?;
            let name = rustls::pki_types::ServerName::try_from(host.clone())
                .map_err(|e| WireError::Protocol(format!("TLS server name {host:?}: {e}")))?;
            let session = rustls::ClientConnection::new(config.clone(), name)
                .map_err(|e| WireError::Protocol(format!("TLS: {e}")))?;
            Stream::Tls(Box::new(rustls::StreamOwned::new(session, sock)))
        }
    };
    let mut timed = Timed {
        stream,
        deadline,
        step,
    };
    // The handshake now, each of its steps within the deadline, so a certificate that
    // is refused is said as such.
    loop {
        timed.arm(false)?;
        timed.arm(true)?;
        let Stream::Tls(s) = &mut timed.stream else {
            break;
        };
        if !s.conn.is_handshaking() {
            break;
        }
        let s = &mut **s;
        s.conn.complete_io(&mut s.sock)?;
    }
    let mut conn = Conn {
        reader: Reader::new(timed),
        pid: std::process::id(),
    };
    login(&mut conn, address)?;
    Ok(conn)
}

fn login(conn: &mut Conn, address: &Address) -> Result<(), WireError> {
    let mut commands: Vec<Vec<&[u8]>> = Vec::new();
    if address.username.is_some() || address.password.is_some() {
        let mut auth: Vec<&[u8]> = vec![b"AUTH"];
        if let Some(user) = &address.username {
            auth.push(user.as_bytes());
        }
        auth.push(address.password.as_deref().unwrap_or("").as_bytes());
        commands.push(auth);
    }
    let db = address.db.to_string();
    if address.db != 0 {
        commands.push(vec![b"SELECT", db.as_bytes()]);
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
